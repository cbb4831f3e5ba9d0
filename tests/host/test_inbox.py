"""A host's inbox: a request posted in a channel is served before the socket's sent after it.

A client posts in its channel only while nothing else is under way, so what the socket holds
from that session was sent after it. The poll may not show it that way: ``zmq_poll`` reads a
socket's state after the pipes', so a request sent between the two is seen alone. These tests
take the channel's wake-up away before the inbox looks, which is what that race leaves.
"""

from __future__ import annotations

import os
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
