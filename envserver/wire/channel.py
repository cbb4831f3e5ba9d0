"""Channels: a local session's requests and replies in shared memory, with a pipe to wake each side.

ZeroMQ costs more than a cheap env's whole step when client and host share a machine: its echo
alone is over 100 µs there, where a wake-up through a pipe is about 10. A client that knows its
host shares its machine (the embedded local hosts) offers a channel in MAKE (``"channel"``): an
empty file in the shared-memory directory and two named pipes beside it, ``NAME-up`` (the
client wakes the host) and ``NAME-down`` (the host wakes the client). A host that takes it sizes
the file, maps it, opens both pipes, removes the three names and says the size in the MAKE
reply; the client maps it too. As with the observation slab (:mod:`envserver.wire.slab`), the
names exist only from MAKE to its answer, so a channel leaves nothing behind when either side is
killed.

A channel carries whole messages, the very frames a ZeroMQ socket would: a request's envelope
and body out, its reply back. Everything above the link stays as it is: request ids, sessions,
the retry cache, error replies, what envs said. So does every check: the host reads a request
from the channel as it reads one from its socket. One request at a time travels a channel,
and only while every other request under way on its connection is in a channel too (a session
has one channel per request its client may have under way, first-ready sub-batches), so a
session's requests are still served in the order they were sent (the host looks at its
channels before its socket, and takes the one whose request has the lowest id). A reply
too large for the channel's reply area is not in it: the host posts an empty message, and the
client asks again over ZeroMQ (the host answers from its retry cache).

The file: a header of four little-endian 64-bit words (the newest request's id, the id of the
request the reply area answers, the request area's capacity, the reply area's), then the
request area (at :data:`HEADER_BYTES`) and the reply area (at the next multiple of
:data:`~envserver.wire.slab.ALIGN` after it). A message in an area: its frame count (uint32),
each frame's length (uint32), then the frames' bytes. An id is written after its message, and a
side is woken (one byte down its pipe) after the id: a side that wakes and finds no new id was
woken twice for one message, and goes back to its wait. ``docs/protocol.md`` (Channels) is the
normative text.

A wait may watch the peer's id for a while before it blocks (:attr:`Channel.spin`): when
the message comes within that time, neither side sleeps, and a round trip costs no scheduler
wake-up (on a small machine, most of it). That pays only when each side has a core of its own,
so only such layouts spin, and a wait spins only while spinning pays: after a spin that found
nothing (the peer was busy, or starved of a core), the next 1, 3, 7, ... up to
:data:`MOST_SKIPPED` waits block at once (:class:`SpinBackoff`), and one that finds its message
starts over. So does the first of the waits that block whose message came within a spin's
time, once per spin that found its message (:meth:`SpinBackoff.waited`). Without that rule, one
side's miss (its core taken for a moment) slows its next reply by a wake-up, which on a small
virtual machine is a good part of a spin: the peer's spin misses too, and both sides back off
together, blocking for hundreds of waits at a wake-up's cost each (a round trip of two
processes through pipes took 70-130 µs in a slow phase of the project's 2-core machine, one of
two that spin 1 µs). Once per found spin, so that where spinning steals the peer's core (a busy
process beside them) the backoff still grows. The pipe's byte is written in any case, so a wait
that blocks is always woken.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import select
import stat
import struct
import time
import weakref
from collections.abc import Sequence
from typing import Any

from envserver.errors import ProtocolError
from envserver.wire.messages import MAX_FRAMES
from envserver.wire.slab import SLAB_DIRECTORY, aligned, check_name, new_name

__all__ = [
    "HEADER_BYTES",
    "MOST_CHANNELS",
    "MOST_SKIPPED",
    "Channel",
    "ChannelFrame",
    "ChannelOffer",
    "SpinBackoff",
    "channel_size",
]

logger = logging.getLogger(__name__)

#: Where the header ends and the request area begins.
HEADER_BYTES = 64
#: The most waits in a row that block at once after spins that found nothing.
MOST_SKIPPED = 1023
#: The most channels one session has: the reference client offers no more (one per request it
#: has under way, up to this), and the reference host takes no more (each costs it two pipes).
MOST_CHANNELS = 8
_WORDS = struct.Struct("<4Q")
_COUNT = struct.Struct("<I")
#: The header words: the request's id, the reply's, the two capacities.
_REQUEST, _REPLY = 0, 1
_PIPE_FLAGS = os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def channel_size(request_capacity: int, reply_capacity: int) -> int:
    """A channel's file size for these area capacities (bytes)."""
    return HEADER_BYTES + aligned(request_capacity) + reply_capacity


class SpinBackoff:
    """When a wait spins before it blocks: always, until spins find nothing (module docstring).

    Args:
        spin_ns: How long a spin lasts (0: a wait never spins).
    """

    __slots__ = ("cut", "skipped", "skips", "spin_ns")

    def __init__(self, spin_ns: int) -> None:
        self.spin_ns = spin_ns
        #: The waits left that block at once.
        self.skips = 0
        #: How many the last spin that found nothing made block (0: the last spin found one).
        self.skipped = 0
        #: Whether a wait cut the backoff short since the last spin that found its message.
        self.cut = False

    def due(self) -> bool:
        """Whether this wait spins (counts it off the backoff if not)."""
        if not self.spin_ns:
            return False
        if self.skips:
            self.skips -= 1
            return False
        return True

    def found(self, message: bool) -> None:
        """Records what a spin found: a message, or nothing (then the next waits block)."""
        self.skipped = self.skips = 0 if message else min(2 * self.skipped + 1, MOST_SKIPPED)
        self.cut = self.cut and not message

    def waited(self, elapsed_ns: int) -> None:
        """Records how long a wait that blocked at once took.

        The first since a spin found its message that a spin would have ended makes the next
        wait spin; the backoff goes on doubling from where it was if that spin finds nothing.
        """
        if elapsed_ns <= self.spin_ns and not self.cut:
            self.skips, self.cut = 0, True


class ChannelFrame(bytes):
    """One frame of a message read from a channel: bytes, with a ``zmq.Frame``'s names for them.

    What the readers of a reply use of a ``zmq.Frame`` (its buffer, ``bytes``, ``buffer``), so
    they read either alike.
    """

    __slots__ = ()

    @property
    def bytes(self) -> bytes:
        """The frame itself."""
        return self

    @property
    def buffer(self) -> bytes:
        """The frame itself."""
        return self


class Channel:
    """One side of a mapped channel: posts its messages, takes its peer's (module docstring).

    Args:
        mapping: The mapped file (its header's capacities written by the host).
        ring: The pipe this side wakes its peer through.
        wait: The pipe its peer wakes it through (what a poll watches: :meth:`fileno`).
        host: Whether this is the host's side (it takes requests and posts replies).

    Raises:
        ProtocolError: If the header's capacities do not fit the mapping.
    """

    def __init__(self, mapping: mmap.mmap, ring: int, wait: int, *, host: bool) -> None:
        self._mapping = mapping
        request_capacity, reply_capacity = _WORDS.unpack_from(mapping, 0)[2:]
        if channel_size(request_capacity, reply_capacity) != len(mapping):
            raise ProtocolError(
                f"a channel of {len(mapping)} bytes with areas of {request_capacity} and "
                f"{reply_capacity} bytes"
            )
        whole = memoryview(mapping)
        self._words = whole[:32].cast("Q")
        request_at = HEADER_BYTES
        reply_at = HEADER_BYTES + aligned(request_capacity)
        requests = whole[request_at : request_at + request_capacity]
        replies = whole[reply_at : reply_at + reply_capacity]
        self._out, self._in = (replies, requests) if host else (requests, replies)
        self._mine, self._theirs = (_REPLY, _REQUEST) if host else (_REQUEST, _REPLY)
        self._ring, self._wait = ring, wait
        self._poll = select.poll()
        self._poll.register(wait, select.POLLIN)
        self._close_pipes = weakref.finalize(self, _close_all, ring, wait)
        #: The id of the newest message taken from the peer (0: none yet).
        self.taken = 0
        #: How many messages were taken from the peer.
        self.received = 0
        #: The id of the message posted whose answer has not been taken yet (None: none; on
        #: the client's side, while it is not None, nothing else is posted).
        self.busy: int | None = None
        self._held: list[ChannelFrame] | None = None  # taken, not yet released
        #: When a wait watches for the peer's message before it blocks (by default never).
        self.spin = SpinBackoff(0)
        self._posting: tuple[Sequence[Any], int] | None = None  # a post an interruption cut

    def __len__(self) -> int:
        """The channel's size in bytes."""
        return len(self._mapping)

    def fileno(self) -> int:
        """The pipe that becomes readable when the peer posts (for a poll)."""
        return self._wait

    # ------------------------------------------------------------- posting

    def post(self, frames: Sequence[Any], message_id: int) -> bool:
        """Writes a message under ``message_id`` and wakes the peer, if it fits this side's area.

        An interruption leaves it to :meth:`flush` to finish.

        Returns:
            Whether it was posted (False: it does not fit, and nothing was written).
        """
        area = self._out
        sizes = []
        for frame in frames:  # (loops, not comprehensions or helpers: no Python calls)
            sizes.append(len(frame) if type(frame) is bytes else memoryview(frame).nbytes)
        if len(frames) > MAX_FRAMES or _COUNT.size * (1 + len(sizes)) + sum(sizes) > len(area):
            return False
        self._posting = (frames, message_id)  # first: from here on, flush finishes the post
        self.busy = message_id
        struct.pack_into(f"<{1 + len(sizes)}I", area, 0, len(sizes), *sizes)
        at = _COUNT.size * (1 + len(sizes))
        for frame, size in zip(frames, sizes):
            if size:
                view = frame
                if type(frame) is not bytes:
                    view = memoryview(frame)
                    if view.ndim != 1 or view.format != "B":
                        view = view.cast("B")
                area[at : at + size] = view
                at += size
        self._words[self._mine] = message_id
        try:  # noqa: SIM105 (a try costs no Python calls; contextlib.suppress three)
            os.write(self._ring, b"\0")
        except BlockingIOError:  # full of wake-ups not read: the peer wakes anyway
            pass
        self._posting = None
        return True

    def flush(self) -> None:
        """Finishes a post an interruption cut (nothing if there is none).

        A message whose id is written is the peer's to read, maybe being read now: it is never
        written again (``struct.pack_into`` zero-fills before it packs, so a peer would read a
        rewrite torn), only its wake-up is. One whose id is not written yet is written again,
        whole: the peer looks at nothing but the id until it changes.
        """
        if self._posting is None:
            return
        frames, message_id = self._posting
        if self._words[self._mine] != message_id:
            self.post(frames, message_id)
            return
        try:  # noqa: SIM105 (as in post)
            os.write(self._ring, b"\0")
        except BlockingIOError:
            pass
        self._posting = None

    # ------------------------------------------------------------- taking

    def fresh(self) -> bool:
        """Whether the peer posted a message not taken yet (a look at its id, no wait)."""
        return self._held is None and self._words[self._theirs] != self.taken

    def posted(self) -> int | None:
        """The id of the message the peer posted and this side has not taken (None: none)."""
        message_id = self._words[self._theirs]
        return None if self._held is not None or message_id == self.taken else message_id

    def drain(self) -> None:
        """Reads the wake-ups waiting in the pipe (after a poll found it readable)."""
        try:  # noqa: SIM105 (as in post)
            os.read(self._wait, 4096)
        except BlockingIOError:
            pass

    def next(self) -> list[ChannelFrame] | None:
        """The message held, or the peer's newest if it is new (held until :meth:`release`).

        Returns:
            Its frames (copies: the area is the peer's to write again), or None if the peer
            posted nothing since the last one taken.

        Raises:
            ProtocolError: If the message does not fit its area (it counts as taken).
        """
        if self._held is not None:
            return self._held
        message_id = self._words[self._theirs]
        if message_id == self.taken:
            return None
        self.taken = message_id  # (a message that does not fit is taken too: it is answered)
        area = self._in
        capacity = len(area)
        count = _COUNT.unpack_from(area, 0)[0]
        at = _COUNT.size * (1 + count)
        if count > MAX_FRAMES or at > capacity:
            raise ProtocolError(f"a channel message of {count} frames")
        sizes = struct.unpack_from(f"<{count}I", area, _COUNT.size)
        if at + sum(sizes) > capacity:
            raise ProtocolError("a channel message larger than its area")
        frames = []
        for size in sizes:
            frames.append(ChannelFrame(area[at : at + size]))
            at += size
        self.received += 1
        self._held = frames
        return frames

    def await_reply(self, timeout_ms: int) -> list[ChannelFrame] | None:
        """The client's wait: the reply held, or the next one posted within ``timeout_ms``.

        A wait on the pipe alone (``select.poll``: no Python call, whatever it finds): the
        reply to a request posted comes in the channel, whatever it is (an error, or an empty
        message when it is too large, for the socket).

        Returns:
            Its frames (held until :meth:`release`; none: it is not in the channel, ask for it
            on the socket), or None if none came.

        Raises:
            ProtocolError: If the message does not fit its area.
        """
        words, theirs, poll, spin = self._words, self._theirs, self._poll.poll, self.spin
        blocked_at = 0  # (when a wait that blocks at once began)
        if spin.spin_ns and self._held is None and words[theirs] == self.taken:
            # SpinBackoff's due, found and waited, inline as all of this wait: no Python calls.
            if spin.skips:
                spin.skips -= 1
                blocked_at = time.perf_counter_ns()
            else:
                clock = time.perf_counter_ns
                until = clock() + spin.spin_ns
                while words[theirs] == self.taken and clock() < until:
                    pass
                nothing = words[theirs] == self.taken
                backoff = min(2 * spin.skipped + 1, MOST_SKIPPED)
                spin.skipped = spin.skips = backoff if nothing else 0
                spin.cut = spin.cut and nothing
        while True:  # a look first, and after each wake-up read: none is ever missed
            if self._held is not None or words[theirs] != self.taken:
                if (
                    blocked_at
                    and not spin.cut
                    and time.perf_counter_ns() - blocked_at <= spin.spin_ns
                ):
                    spin.skips, spin.cut = 0, True
                return self.next()
            if not poll(timeout_ms):
                return None
            try:  # noqa: SIM105 (drain, inline: as in post)
                os.read(self._wait, 4096)
            except BlockingIOError:
                pass

    def release(self) -> None:
        """The message :meth:`next` returned is taken: the next call looks for a new one."""
        if self._held is not None:
            self._held = None
            if self.busy == self.taken:
                self.busy = None

    def close(self) -> None:
        """Closes the pipes and unmaps the file (what was read from it stays valid)."""
        self._close_pipes()
        for view in (self._words, self._out, self._in):
            view.release()
        with contextlib.suppress(BufferError):  # a view of ours still out: unmapped when it goes
            self._mapping.close()

    # ------------------------------------------------------------- making one

    @classmethod
    def for_host(cls, name: str, request_capacity: int, reply_capacity: int) -> Channel | None:
        """Opens, sizes and maps the client's channel ``name`` with its pipes; removes the names.

        Returns:
            The host's side, or None if the files are not there for it: not found (the client
            is on another machine), not the host user's, not an empty file and two pipes.
        """
        base = os.path.join(SLAB_DIRECTORY, check_name(name, "chan"))
        fds: list[int] = []
        try:
            fds.append(os.open(base, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC))
            fds += [os.open(f"{base}-{end}", _PIPE_FLAGS) for end in ("up", "down")]
        except OSError as exc:
            logger.info("no channel %s: %s", name, exc)
            _close_all(*fds)
            return None
        file, up, down = fds
        try:
            kinds = [os.fstat(fd) for fd in fds]
            if (
                not stat.S_ISREG(kinds[0].st_mode)
                or kinds[0].st_size
                or not all(stat.S_ISFIFO(k.st_mode) for k in kinds[1:])
                or any(k.st_uid != os.getuid() for k in kinds)
            ):
                logger.warning("channel %s refused: not an empty file and two pipes of ours", name)
                _close_all(up, down)
                return None
            size = channel_size(request_capacity, reply_capacity)
            os.ftruncate(file, size)
            mapping = mmap.mmap(file, size)
            _WORDS.pack_into(mapping, 0, 0, 0, request_capacity, reply_capacity)
        except OSError as exc:  # no room in /dev/shm: ZeroMQ instead
            logger.warning("channel %s not made: %s", name, exc)
            _close_all(up, down)
            return None
        finally:
            os.close(file)
        _unlink(base)  # (the client may have been quicker)
        return cls(mapping, down, up, host=True)


class ChannelOffer:
    """The client's side before MAKE: the files offered to the host as a channel.

    Use :meth:`make`; then :meth:`accept` (the host took it) or :meth:`withdraw`.
    """

    def __init__(self, name: str, file: int, up: int, down: int) -> None:
        self.name = name
        self._fds: tuple[int, int, int] | None = (file, up, down)

    @classmethod
    def make(cls) -> ChannelOffer | None:
        """New files for a channel, or None where there is no shared-memory directory."""
        if not os.path.isdir(SLAB_DIRECTORY):
            return None
        name = new_name("chan")
        base = os.path.join(SLAB_DIRECTORY, name)
        fds: list[int] = []
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fds.append(os.open(base, flags, 0o600))
            for end in ("up", "down"):
                os.mkfifo(f"{base}-{end}", 0o600)
                fds.append(os.open(f"{base}-{end}", _PIPE_FLAGS))
        except OSError as exc:
            logger.info("no channel: %s", exc)
            _unlink(base)
            _close_all(*fds)
            return None
        return cls(name, *fds)

    def accept(self, size: Any) -> Channel:
        """Maps the channel the host sized to ``size`` bytes, and withdraws the names.

        Raises:
            ProtocolError: If the file does not have that size, or its header does not fit it.
        """
        file, up, down = self._fds
        try:
            if type(size) is not int or size <= HEADER_BYTES or os.fstat(file).st_size != size:
                raise ProtocolError(f"a channel of {size!r} bytes, not the file's size")
            channel = Channel(mmap.mmap(file, size), up, down, host=False)
        except BaseException:
            self.withdraw()
            raise
        self._fds = (file, -1, -1)  # the pipes are the channel's now
        self.withdraw()
        return channel

    def withdraw(self) -> None:
        """Removes the names (if the host has not) and closes what the channel does not own."""
        if self._fds is None:
            return
        _unlink(os.path.join(SLAB_DIRECTORY, self.name))
        _close_all(*(fd for fd in self._fds if fd >= 0))
        self._fds = None


def _unlink(base: str) -> None:
    for path in (base, f"{base}-up", f"{base}-down"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _close_all(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
