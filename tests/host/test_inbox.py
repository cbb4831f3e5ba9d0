"""A host's inbox: a request posted in a channel is served before the socket's sent after it.

A session's several channels are served in the order of their requests' ids.

A client posts in its channel only while nothing else is under way, so what the socket holds
from that session was sent after it. The poll may not show it that way: ``zmq_poll`` reads a
socket's state after the pipes', so a request sent between the two is seen alone. These tests
take the channel's wake-up away before the inbox looks, which is what that race leaves.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import zmq

from envserver.host.inbox import Inbox
from envserver.host.sessions import SessionTable
from envserver.wire.channel import Channel, ChannelOffer
from envserver.wire.slab import SLAB_DIRECTORY

pytestmark = pytest.mark.skipif(not os.path.isdir(SLAB_DIRECTORY), reason="no /dev/shm")


@pytest.fixture
def wired():
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    router.bind("inproc://inbox")
    dealer.connect("inproc://inbox")
    offer = ChannelOffer.make()
    host = Channel.for_host(offer.name, 4096, 4096)
    assert host is not None
    client = offer.accept(len(host))
    sessions = SessionTable(max_sessions=4, lease_s=0, idle_timeout_s=60)
    sessions.channels = {host.fileno(): host}
    yield Inbox(router, 0.05, sessions), dealer, client, host
    client.close()
    host.close()
    router.close(linger=0)
    dealer.close(linger=0)
    context.term()


def _queued(router: zmq.Socket) -> None:
    deadline = time.monotonic() + 30
    while not router.poll(10):
        assert time.monotonic() < deadline, "the socket's request never came"


def _next(inbox: Inbox) -> list:
    deadline = time.monotonic() + 30
    while (frames := inbox.next()) is None:
        assert time.monotonic() < deadline, "no request came"
    return frames


def _bodies(frames: list) -> tuple[bool, list[bytes]]:
    to, *rest = frames
    return type(to) is Channel, [bytes(frame.bytes) for frame in rest]


def test_a_posted_request_whose_wake_up_was_not_seen_goes_before_the_socket(wired):
    inbox, dealer, client, host = wired
    assert client.post([b"posted first"], 9)
    host.drain()  # its wake-up is not what the poll sees
    dealer.send(b"sent after")
    _queued(inbox.router)
    assert _bodies(_next(inbox)) == (True, [b"posted first"])
    assert _bodies(_next(inbox)) == (False, [b"sent after"])
    assert inbox.next(timeout_s=0) is None


def test_a_posted_request_goes_before_the_requests_read_ahead(wired):
    inbox, dealer, client, _ = wired
    dealer.send(b"read ahead")
    _queued(inbox.router)
    inbox.backlog.append(inbox.router.recv_multipart(copy=False))
    assert client.post([b"posted"], 3)
    assert _bodies(_next(inbox)) == (True, [b"posted"])
    assert _bodies(_next(inbox)) == (False, [b"read ahead"])


def test_a_spinning_inbox_serves_the_channel_and_the_socket_alike(wired):
    inbox, dealer, client, host = wired
    sessions = SessionTable(max_sessions=4, lease_s=0, idle_timeout_s=60)
    sessions.channels = {host.fileno(): host}
    spinning = Inbox(inbox.router, 0.05, sessions, spin_s=0.002)
    assert spinning.next(timeout_s=0) is None  # nothing posted, nothing sent: none
    assert client.post([b"posted"], 4)
    assert _bodies(_next(spinning)) == (True, [b"posted"])
    dealer.send(b"sent")  # a spin ends when the socket has a request
    assert _bodies(_next(spinning)) == (False, [b"sent"])


def test_a_wait_that_blocks_ends_the_backoff_if_its_request_came_within_a_spin(wired):
    inbox, _, client, host = wired
    sessions = SessionTable(max_sessions=4, lease_s=0, idle_timeout_s=60)
    sessions.channels = {host.fileno(): host}
    request_id = 0
    for spin_s, ends in ((30.0, True), (1e-9, False)):  # a spin long enough, and not
        spinning = Inbox(inbox.router, 30.0, sessions, spin_s=spin_s)
        spinning.spin.skipped = spinning.spin.skips = 3
        while spinning.spin.skips == 3:  # until one wait blocked (a first look counts none)
            request_id += 1
            waiting = threading.Event()

            def post(waiting=waiting, request_id=request_id) -> None:
                waiting.wait()
                assert client.post([b"posted"], request_id)

            poster = threading.Thread(target=post)
            poster.start()
            waiting.set()
            assert _bodies(_next(spinning)) == (True, [b"posted"])
            poster.join()
        assert (spinning.spin.skips, spinning.spin.skipped) == ((0, 3) if ends else (2, 3))


@pytest.fixture
def lanes(wired):
    """The wired inbox with two more channels of the same session (three in all)."""
    inbox, dealer, client, host = wired
    pairs = [(client, host)]
    for _ in range(2):
        offer = ChannelOffer.make()
        theirs = Channel.for_host(offer.name, 4096, 4096)
        assert theirs is not None
        pairs.append((offer.accept(len(theirs)), theirs))
    sessions = SessionTable(max_sessions=4, lease_s=0, idle_timeout_s=60)
    sessions.channels = {theirs.fileno(): theirs for _, theirs in pairs}
    yield Inbox(inbox.router, 0.05, sessions), dealer, pairs
    for ours, theirs in pairs[1:]:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("woken", ["first", "last", "none"])
def test_a_sessions_channels_are_served_in_the_order_of_their_requests(lanes, woken):
    # A client posts in a free channel while every request it has under way is in one: the
    # host serves them by id, whichever wake-up it sees first (or none, as a race leaves it),
    # and the socket's request sent after them last.
    inbox, dealer, pairs = lanes
    order = [1, 2, 0]  # the channels posted in, oldest request first
    for request_id, k in enumerate(order, start=20):
        assert pairs[k][0].post([f"request {request_id}".encode()], request_id)
    dealer.send(b"sent after")
    _queued(inbox.router)
    for k, (_, theirs) in enumerate(pairs):
        if woken == "none" or (woken == "first") != (k == order[0]):
            theirs.drain()  # only that wake-up is left for the poll to see, or none
    served = [_bodies(_next(inbox)) for _ in range(4)]
    assert served == [
        (True, [b"request 20"]),
        (True, [b"request 21"]),
        (True, [b"request 22"]),
        (False, [b"sent after"]),
    ]
    assert inbox.next(timeout_s=0) is None


def test_a_request_posted_while_others_wait_in_their_channels_waits_its_turn(lanes):
    # Served requests free their channels: a newer request posted in one, while older ones
    # are still in theirs, comes after them.
    inbox, _, pairs = lanes
    assert pairs[0][0].post([b"request 5"], 5)
    assert pairs[1][0].post([b"request 6"], 6)
    assert _bodies(_next(inbox)) == (True, [b"request 5"])
    assert pairs[0][1].post([b"reply 5"], 5)  # the host answers in the request's channel
    assert pairs[0][0].next() is not None
    pairs[0][0].release()
    assert pairs[0][0].post([b"request 7"], 7)
    assert _bodies(_next(inbox)) == (True, [b"request 6"])
    assert _bodies(_next(inbox)) == (True, [b"request 7"])


#: The poll calls' numbers (x86_64: poll, ppoll; aarch64: ppoll), as ``/proc/.../syscall`` says.
_POLLS = {"7", "271", "73"}


def _blocked_in_poll(thread_id: int) -> bool:
    with open(f"/proc/self/task/{thread_id}/syscall") as status:
        return status.read().split()[0] in _POLLS


def test_a_wait_after_a_spin_that_found_its_request_blocks_until_the_next_one(wired):
    # A request a spin found leaves its wake-up in the pipe: the next wait that blocks must not
    # end at that old byte, but at what comes after it.
    inbox, _, client, host = wired
    sessions = SessionTable(max_sessions=4, lease_s=0, idle_timeout_s=60)
    sessions.channels = {host.fileno(): host}
    spinning = Inbox(inbox.router, 30.0, sessions, spin_s=30.0)
    assert client.post([b"spun"], 1)
    assert _bodies(spinning.next(timeout_s=30)) == (True, [b"spun"])  # found by the spin
    spinning.spin.skips = 1000  # the next waits block at once
    waiter = threading.get_native_id()

    def post() -> None:
        deadline = time.monotonic() + 30
        while not _blocked_in_poll(waiter):  # the inbox's wait has begun
            assert time.monotonic() < deadline, "the inbox never waited"
            time.sleep(0.001)
        assert client.post([b"after"], 2)

    poster = threading.Thread(target=post)
    poster.start()
    try:
        assert _bodies(spinning.next(timeout_s=30)) == (True, [b"after"])
    finally:
        poster.join()
