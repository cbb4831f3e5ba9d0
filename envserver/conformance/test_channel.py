"""Conformance: channels, for a host on this machine (skipped when the host takes none).

The files and messages are made here from the protocol's text (Channels): an empty file and two
named pipes offered in MAKE, the header's four words, a message's frame count and lengths, a
byte down a pipe to wake each side. Nothing of envserver's own channel code is used.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import select
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from envserver.conformance.conftest import Session
from envserver.conformance.test_step_raw import read, step_raw
from envserver.conformance.wire import WireReply, check_reply, envelope
from envserver.wire.messages import PROTOCOL_VERSION, Command

DIRECTORY = "/dev/shm"


@dataclass
class Files:
    """The client's side of one channel offered: its name, the file and the two pipes."""

    name: str
    file: int
    up: int
    down: int

    def paths(self) -> list[str]:
        """The file's and the pipes' paths."""
        base = os.path.join(DIRECTORY, self.name)
        return [base, f"{base}-up", f"{base}-down"]


@pytest.fixture
def files() -> Iterator[Files]:
    """A channel's files, made as the protocol says; removed afterwards if the host did not."""
    if not os.path.isdir(DIRECTORY):
        pytest.skip("no /dev/shm")
    name = f"envserver-chan-{os.getpid()}-{secrets.token_hex(8)}"
    base = os.path.join(DIRECTORY, name)
    file = os.open(base, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    for end in ("up", "down"):
        os.mkfifo(f"{base}-{end}", 0o600)
    flags = os.O_RDWR | os.O_NONBLOCK
    made = Files(name, file, os.open(f"{base}-up", flags), os.open(f"{base}-down", flags))
    yield made
    for path in made.paths():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    for fd in (made.file, made.up, made.down):
        os.close(fd)


class Mapped:
    """The client's view of a channel the host took: post requests, wait for replies."""

    def __init__(self, files: Files, size: int) -> None:
        assert os.fstat(files.file).st_size == size, "the channel's size is the file's"
        self.files = files
        self.map = mmap.mmap(files.file, size)
        _, _, self.request_capacity, self.reply_capacity = struct.unpack_from("<4Q", self.map, 0)
        self.reply_at = 64 + -(-self.request_capacity // 64) * 64
        assert self.reply_at + self.reply_capacity == size, "the areas end where the file does"

    def post(self, frames: list[bytes], request_id: int) -> None:
        """Writes a request into the request area, then its id, then wakes the host."""
        message = struct.pack(f"<{1 + len(frames)}I", len(frames), *map(len, frames))
        message += b"".join(frames)
        assert len(message) <= self.request_capacity
        self.map[64 : 64 + len(message)] = message
        struct.pack_into("<Q", self.map, 0, request_id)
        os.write(self.files.up, b"\0")

    def reply(self, request_id: int, timeout_s: float = 30.0) -> list[bytes]:
        """The reply posted for ``request_id``, waited for through the down pipe."""
        while struct.unpack_from("<Q", self.map, 8)[0] != request_id:
            assert select.select([self.files.down], [], [], timeout_s)[0], "no reply woke us"
            with contextlib.suppress(BlockingIOError):
                os.read(self.files.down, 4096)
        at = self.reply_at
        count = struct.unpack_from("<I", self.map, at)[0]
        sizes = struct.unpack_from(f"<{count}I", self.map, at + 4)
        frames, at = [], at + 4 + 4 * count
        for size in sizes:
            frames.append(bytes(self.map[at : at + size]))
            at += size
        return frames


def offered(envs: Session, files: Files) -> Mapped:
    """MAKEs 2 envs offering the channel; skips the test if the host does not take it."""
    made = envs.make(2, channel=files.name)
    assert "channel" in made, "a MAKE that offered a channel has 'channel' in its reply"
    if made["channel"] is None:
        pytest.skip("the host did not take the channel (not on this machine?)")
    assert not any(os.path.exists(path) for path in files.paths()), "the names are removed"
    return Mapped(files, made["channel"])


def raw_request(envs: Session, request_id: int, actions: list[int]) -> list[bytes]:
    """A STEP_RAW request of CartPole actions, as the socket would carry it."""
    head = envelope(PROTOCOL_VERSION, request_id, int(Command.STEP_RAW), envs.session_id)
    return [head, np.array(actions, "<i8").tobytes()]


def test_a_step_in_the_channel_is_the_sockets_step(open_wire, files: Files) -> None:
    """Two sessions, same seeds and actions: one steps in its channel, one on the socket."""
    with open_wire() as first, open_wire() as second:
        posted, sent = Session(first, first.hello()), Session(second, second.hello())
        channel = offered(posted, files)
        sent.make(2)
        for envs in (posted, sent):
            envs.request(Command.RESET, {"seeds": [3, 4]}).ok()
        for t in range(30):
            actions = [t % 2, (t // 2) % 2]
            request_id = first.next_id()
            channel.post(raw_request(posted, request_id, actions), request_id)
            reply = check_reply(channel.reply(request_id), raw=True)
            assert reply.request_id == request_id
            ours, theirs = read(reply, 2), read(step_raw(sent, actions), 2)
            for key in ("obs", "rewards", "terminations", "truncations"):
                np.testing.assert_array_equal(ours[key], theirs[key], err_msg=f"{key} at {t}")
        assert not first.pending(), "a request in the channel is answered there only"


def test_a_request_from_the_channel_comes_again_on_the_socket(open_wire, files) -> None:
    """The retry cache is the session's: the same request on the socket gets the same reply."""
    with open_wire() as wire:
        envs = Session(wire, wire.hello())
        channel = offered(envs, files)
        envs.request(Command.RESET, {"seeds": [1, 2]}).ok()
        request_id = wire.next_id()
        frames = raw_request(envs, request_id, [1, 0])
        channel.post(frames, request_id)
        first = channel.reply(request_id)
        again: WireReply = wire.ask(frames, raw=True)
        assert again.request_id == request_id
        assert again.ok() == check_reply(first, raw=True).ok()


def test_a_message_that_does_not_fit_gets_an_error(open_wire, files) -> None:
    """A frame count past the area is a request the host cannot read: an ERROR, no id."""
    with open_wire() as wire:
        envs = Session(wire, wire.hello())
        channel = offered(envs, files)
        struct.pack_into("<I", channel.map, 64, 10**6)
        struct.pack_into("<Q", channel.map, 0, 99)
        os.write(channel.files.up, b"\0")
        reply = check_reply(channel.reply(99))
        assert reply.request_id is None
        reply.error("ProtocolError")
        assert envs.request(Command.PING).ok() is not None, "the host goes on serving"
