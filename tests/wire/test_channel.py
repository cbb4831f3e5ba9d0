"""Channels: an offer taken by a host, messages both ways, and every refusal and defect."""

from __future__ import annotations

import os
import select
import struct
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import envserver.wire.channel as channel_module
from envserver.errors import ProtocolError
from envserver.wire.channel import (
    HEADER_BYTES,
    MOST_SKIPPED,
    Channel,
    ChannelOffer,
    SpinBackoff,
    channel_size,
)
from envserver.wire.slab import SLAB_DIRECTORY, check_name, sweep_orphans

pytestmark = pytest.mark.skipif(not os.path.isdir(SLAB_DIRECTORY), reason="no /dev/shm")


def _names(name: str) -> list[str]:
    base = os.path.join(SLAB_DIRECTORY, name)
    return [base, f"{base}-up", f"{base}-down"]


@pytest.fixture
def pair():
    offer = ChannelOffer.make()
    host = Channel.for_host(offer.name, 4096, 8192)
    assert host is not None
    client = offer.accept(len(host))
    yield client, host
    client.close()
    host.close()


def _readable(channel: Channel) -> bool:
    return bool(select.select([channel.fileno()], [], [], 0)[0])


def test_an_offer_taken_leaves_no_name_and_sizes_the_file():
    offer = ChannelOffer.make()
    assert all(os.path.exists(path) for path in _names(offer.name))
    host = Channel.for_host(offer.name, 100, 200)
    assert host is not None and len(host) == channel_size(100, 200) == 64 + 128 + 200
    client = offer.accept(len(host))
    assert not any(os.path.exists(path) for path in _names(offer.name))
    client.close()
    host.close()


def test_messages_go_both_ways_whole_and_wake_the_peer(pair):
    client, host = pair
    assert host.next() is None and not _readable(host)
    actions = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert client.post([b"envelope", actions, b""], 7)
    assert client.busy == 7 and _readable(host)
    host.drain()
    assert not _readable(host)
    frames = host.next()
    assert [bytes(f) for f in frames] == [b"envelope", actions.tobytes(), b""]
    assert host.next() is frames  # held until released
    host.release()
    assert host.next() is None  # nothing new: no id past the one taken
    assert host.post([b"reply", b"\x01" * 10], 7)
    assert _readable(client)
    reply = client.next()
    assert reply[0].bytes == b"reply" and reply[1].buffer == b"\x01" * 10
    client.release()
    assert client.busy is None and client.next() is None


def test_a_message_too_large_is_not_posted(pair):
    client, host = pair
    assert not client.post([b"x" * 5000], 1)
    assert client.busy is None and host.next() is None and not _readable(host)
    assert not client.post([b""] * 4097, 3)  # past a message's most frames
    assert client.post([b"x" * 4000], 2)


def test_a_post_cut_by_an_interruption_is_finished_by_flush(pair, monkeypatch):
    client, host = pair
    calls = []

    def interrupted(fd, data):  # the id is written, then Ctrl-C before the wake-up
        calls.append(fd)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        client.post([b"request"], 3)
    monkeypatch.undo()
    assert calls and not _readable(host)
    client.flush()
    assert _readable(host)
    assert [bytes(f) for f in host.next()] == [b"request"]
    host.release()
    client.flush()  # nothing left to finish: no second wake-up
    host.drain()
    assert not _readable(host)


def test_a_post_cut_after_its_id_is_only_woken_by_flush_never_written_again(pair, monkeypatch):
    """A message whose id is written may be under the peer's read: flush only wakes the peer.

    Written again, a peer reading it would see it torn (``struct.pack_into`` zero-fills the
    sizes before it packs them: a host once read a frame of 0 bytes so). Here the peer reads
    and answers it before the flush, and the flush writes nothing of it and leaves the
    channel free.
    """
    client, host = pair
    real_write = os.write

    def interrupted(fd, data):  # the wake-up goes, then Ctrl-C
        real_write(fd, data)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        client.post([b"request", b"\x07" * 16], 3)
    monkeypatch.undo()
    assert [bytes(f) for f in host.next()] == [b"request", b"\x07" * 16]
    host.release()
    assert host.post([b"reply"], 3)
    assert [bytes(f) for f in client.next()] == [b"reply"]
    client.release()
    assert client.busy is None
    packed = []
    monkeypatch.setattr(
        channel_module,
        "struct",
        SimpleNamespace(
            pack_into=lambda *args: packed.append(args), unpack_from=struct.unpack_from
        ),
    )
    client.flush()
    assert not packed and client.busy is None  # not written, not posted again: free
    assert host.next() is None  # nothing new for the peer
    monkeypatch.undo()
    assert client.post([b"next"], 4)
    assert [bytes(f) for f in host.next()] == [b"next"]


def test_a_post_cut_before_its_id_is_written_again_whole_by_flush(pair, monkeypatch):
    client, host = pair

    def interrupted(*args):  # Ctrl-C as the sizes are packed: nothing of it is posted yet
        raise KeyboardInterrupt

    monkeypatch.setattr(
        channel_module,
        "struct",
        SimpleNamespace(pack_into=interrupted, unpack_from=struct.unpack_from),
    )
    with pytest.raises(KeyboardInterrupt):
        client.post([b"request", b"\x07" * 16], 3)
    monkeypatch.undo()
    assert host.next() is None and client.busy == 3
    client.flush()
    assert _readable(host)
    assert [bytes(f) for f in host.next()] == [b"request", b"\x07" * 16]


def test_a_message_that_does_not_fit_its_area_is_refused(pair):
    client, host = pair
    requests = memoryview(client._out)  # the area as the client writes it
    struct.pack_into("<I", requests, 0, 5000)  # frames
    client._words[0] = 1
    with pytest.raises(ProtocolError, match="5000 frames"):
        host.next()
    assert host.next() is None  # taken, though refused: it gets its answer (an error)
    struct.pack_into("<II", requests, 0, 1, 10_000)
    client._words[0] = 2
    with pytest.raises(ProtocolError, match="larger than its area"):
        host.next()


def test_the_host_refuses_what_is_not_an_empty_file_and_two_pipes():
    offer = ChannelOffer.make()
    base = _names(offer.name)
    with open(base[0], "wb") as file:
        file.write(b"not empty")
    assert Channel.for_host(offer.name, 100, 100) is None
    offer.withdraw()
    assert not any(os.path.exists(path) for path in base)
    offer = ChannelOffer.make()
    os.unlink(_names(offer.name)[2])
    with open(_names(offer.name)[2], "wb"):
        pass  # a regular file where the pipe should be
    assert Channel.for_host(offer.name, 100, 100) is None
    offer.withdraw()
    assert Channel.for_host(offer.name, 100, 100) is None  # not found: another machine's


def test_a_size_other_than_the_files_is_a_broken_reply():
    offer = ChannelOffer.make()
    host = Channel.for_host(offer.name, 100, 100)
    with pytest.raises(ProtocolError):
        offer.accept(len(host) + 64)
    assert not any(os.path.exists(path) for path in _names(offer.name))
    host.close()


def test_a_header_that_does_not_fit_the_file_is_refused():
    offer = ChannelOffer.make()
    host = Channel.for_host(offer.name, 100, 100)
    host._words[3] = 10**6  # the host says a reply area the file does not have
    with pytest.raises(ProtocolError, match="areas"):
        offer.accept(len(host))
    host.close()


def test_names_are_checked_and_orphans_swept():
    assert check_name("envserver-chan-12-0123456789abcdef", "chan")
    for bad in ("../envserver-chan-12-0123456789abcdef", "envserver-slab-12-0123456789abcdef", 5):
        with pytest.raises(ProtocolError):
            check_name(bad, "chan")
    dead = 4_194_305  # above the largest pid_max Linux allows: no such process
    orphans = [f"{path}" for path in _names(f"envserver-chan-{dead}-0123456789abcdef")]
    for path in orphans:
        open(path, "wb").close()
    assert sweep_orphans() >= 3
    assert not any(os.path.exists(path) for path in orphans)
    assert HEADER_BYTES == 64


def test_a_spin_that_finds_nothing_makes_the_next_waits_block_at_once():
    backoff = SpinBackoff(1000)
    assert backoff.due()
    plan = []
    for _ in range(3):  # three spins that find nothing: 1, 3 then 7 waits block at once
        backoff.found(False)
        blocked = 0
        while not backoff.due():
            blocked += 1
        plan.append(blocked)
    assert plan == [1, 3, 7]
    backoff.found(True)  # one that finds its message: every wait spins again
    assert backoff.due() and backoff.due()
    backoff.found(False)
    backoff.found(False)
    backoff.waited(1001)  # a wait that blocked for longer than a spin: the backoff stays
    assert backoff.skips == backoff.skipped == 3
    backoff.waited(1000)  # one a spin would have ended: the next wait spins
    assert (backoff.skips, backoff.skipped) == (0, 3) and backoff.due()
    backoff.found(False)  # and finds nothing: the backoff doubles on, and no wait cuts it now
    backoff.waited(1000)
    assert backoff.skips == backoff.skipped == 7
    backoff.found(True)  # until a spin finds its message
    backoff.found(False)
    backoff.waited(1000)
    assert (backoff.skips, backoff.skipped) == (0, 1)
    for _ in range(20):
        backoff.found(False)
    assert backoff.skips == MOST_SKIPPED
    assert not SpinBackoff(0).due()


def test_a_spinning_wait_takes_a_message_posted_and_backs_off_when_none_comes(pair):
    client, host = pair
    client.spin = SpinBackoff(2_000_000)  # 2 ms
    assert client.await_reply(1) is None  # nothing: the spin found nothing, the wait timed out
    assert client.spin.skips == client.spin.skipped == 1
    assert client.await_reply(1) is None  # this one blocked at once
    assert client.spin.skips == 0
    assert host.post([b"late"], 5)  # posted before the wait: its first look takes it
    assert client.await_reply(1000) == [b"late"]
    assert client.spin.skipped == 1
    client.release()


def _posted_while_waiting(client: Channel, host: Channel, request_id: int) -> None:
    """The host posts a message from a thread as the client's wait begins; the wait takes it."""
    waiting = threading.Event()

    def post() -> None:
        waiting.wait()
        host.post([b"m"], request_id)

    poster = threading.Thread(target=post)
    poster.start()
    waiting.set()
    assert client.await_reply(30_000) == [b"m"]
    client.release()
    poster.join()


def test_a_wait_that_blocks_ends_the_backoff_if_its_message_came_within_a_spin(pair):
    client, host = pair
    for spin_ns, ends in ((30 * 10**9, True), (1, False)):  # a spin long enough, and not
        client.spin = SpinBackoff(spin_ns)
        client.spin.skipped = client.spin.skips = 3
        for request_id in range(100 * (not ends) + 1, 100 * (not ends) + 50):
            _posted_while_waiting(client, host, request_id)
            if client.spin.skips != 3:  # the wait blocked (not its first look: that counts none)
                break
        assert (client.spin.skips, client.spin.skipped) == ((0, 3) if ends else (2, 3))


def test_a_message_that_comes_while_the_wait_spins_ends_the_backoff(pair):
    client, host = pair
    client.spin = SpinBackoff(30 * 10**9)  # until the message comes
    for request_id in range(1, 50):  # until one comes while the wait spins (almost always)
        client.spin.skipped = 3
        _posted_while_waiting(client, host, request_id)
        if client.spin.skipped == 0:  # its spin found it (a first look would not reset it)
            break
    assert client.spin.skipped == 0 and client.spin.skips == 0
