"""envserver.wire.frames: multipart messages through real sockets, small frames copied, large not.

A DEALER and a ROUTER on a fresh ipc:// endpoint, as between a client and a host.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from envserver.wire.frames import (
    COPY_THRESHOLD_BYTES,
    MessageWriter,
    readable,
    recv_frames,
    send_frames,
)

DEADLINE_S = 30.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    dealer = context.socket(zmq.DEALER)
    router.linger = dealer.linger = 0
    router.bind(f"ipc://{tmp_path}/wire.sock")
    dealer.connect(f"ipc://{tmp_path}/wire.sock")
    yield dealer, router
    dealer.close()
    router.close()
    context.term()


def wait_readable(socket: zmq.Socket) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not readable(socket):
        assert time.monotonic() < deadline, "no message arrived"
        socket.poll(100)


def test_a_message_of_small_and_large_frames_arrives_whole_and_in_order(pair):
    dealer, router = pair
    large = np.arange(COPY_THRESHOLD_BYTES, dtype=np.uint8)  # over the threshold: not copied
    frames = [b"envelope", bytearray(b"body"), np.arange(5, dtype=np.float32), large, b""]
    send_frames(dealer, frames)
    wait_readable(router)
    received = recv_frames(router)
    assert all(isinstance(frame, zmq.Frame) for frame in received)
    assert [frame.bytes for frame in received[1:]] == [bytes(memoryview(f)) for f in frames]
    assert not readable(router)  # the whole message was read, nothing more waits


def test_a_reply_routed_by_the_identity_frame_reaches_its_dealer(pair):
    dealer, router = pair
    send_frames(dealer, [b"ping"])
    wait_readable(router)
    identity, ping = recv_frames(router)
    assert ping.bytes == b"ping"
    send_frames(router, [identity, b"pong", np.ones(3, np.int64)])
    wait_readable(dealer)
    pong, array = recv_frames(dealer)
    assert pong.bytes == b"pong"
    assert np.frombuffer(array.buffer, np.int64).tolist() == [1, 1, 1]


def test_messages_are_read_one_at_a_time_until_none_waits(pair):
    dealer, router = pair
    for i in range(3):
        send_frames(dealer, [b"n", str(i).encode()])
    seen = []
    deadline = time.monotonic() + DEADLINE_S
    while len(seen) < 3:
        assert time.monotonic() < deadline, f"only {seen} arrived"
        router.poll(100)
        while readable(router):
            seen.append(recv_frames(router, zmq.NOBLOCK)[2].bytes)
    assert seen == [b"0", b"1", b"2"]
    with pytest.raises(zmq.Again):
        recv_frames(router, zmq.NOBLOCK)


def test_a_writer_never_blocks_and_keeps_what_the_socket_cannot_take(tmp_path):
    # A DEALER with no peer to queue for blocks a send (as when libzmq gave up a connection
    # whose handshake the host refused: make test once hung there for its whole timeout).
    context = zmq.Context()
    dealer, router = context.socket(zmq.DEALER), context.socket(zmq.ROUTER)
    dealer.linger = router.linger = 0
    writer = MessageWriter(dealer)
    large = np.arange(COPY_THRESHOLD_BYTES, dtype=np.uint8)
    try:
        writer.send([b"first", b"one"])  # no peer: returns, and keeps it
        writer.send([b"second", large])
        assert not writer.idle and not writer.cut
        router.bind(f"ipc://{tmp_path}/late.sock")
        dealer.connect(f"ipc://{tmp_path}/late.sock")
        writer.flush()  # now a peer queues them, in order and whole
        assert writer.idle
        wait_readable(router)
        assert [f.bytes for f in router.recv_multipart(copy=False)[1:]] == [b"first", b"one"]
        wait_readable(router)
        second = router.recv_multipart(copy=False)[1:]
        assert second[0].bytes == b"second" and second[1].bytes == large.tobytes()
    finally:
        dealer.close()
        router.close()
        context.term()
