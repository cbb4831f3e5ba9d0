"""Multipart messages in and out of a ZeroMQ socket, at the least cost per message.

Both sides' hot paths send and receive through these instead of pyzmq's ``send_multipart`` and
``recv_multipart``, which cost more than the small messages of a step:

- a frame under :data:`COPY_THRESHOLD_BYTES` is sent by copy (one ``memcpy`` into the message),
  a larger one without a copy (libzmq reads the buffer, kept alive until it is sent), where
  ``send_multipart(copy=False)`` wraps every frame, even an 8-byte one, in a ``zmq.Frame``;
- the flags are plain ints (an ``IntFlag`` ``|`` per frame costs more than a small send), and
  the end of a message is read from the last frame received (``Frame.more``) rather than from a
  ``getsockopt(RCVMORE)`` per frame;
- :func:`readable` asks the socket whether a message waits (``ZMQ_EVENTS``, no system call)
  where ``Socket.poll(0)`` builds a poller and polls, and a failing receive raises ``Again``.

A client reads through a :class:`MessageReader` and writes through a :class:`MessageWriter`,
which take and send whole messages, whatever exception interrupts them: pyzmq checks for
signals after every ``zmq_msg_recv`` and ``zmq_msg_send`` that succeeded, so a signal handler's
``KeyboardInterrupt`` (Ctrl-C) comes out of ``recv`` with a frame taken off the socket and lost,
or out of ``send`` with a frame queued, and a plain loop over the frames leaves half a message
on the socket, or half a message queued for the next one to complete.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import zmq

__all__ = [
    "COPY_THRESHOLD_BYTES",
    "MessageReader",
    "MessageWriter",
    "readable",
    "recv_frames",
    "send_frames",
]

#: Frames up to this size are copied into the message; larger ones are sent without a copy.
COPY_THRESHOLD_BYTES: int = zmq.COPY_THRESHOLD
_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_RCVMORE = int(zmq.RCVMORE)


def send_frames(socket: zmq.Socket, frames: Sequence[Any]) -> None:
    """Sends ``frames`` (bytes, buffers or ``zmq.Frame``) as one multipart message.

    A large frame is sent without a copy: its buffer must not change until it is sent (the
    callers' frames are fresh: encoded, or copied, for this message).

    Raises:
        zmq.ZMQError: As ``Socket.send`` does.
    """
    send = socket.send
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        flags = _SNDMORE if i < last else 0
        size = len(frame) if type(frame) is bytes else memoryview(frame).nbytes
        send(frame, flags, copy=size < COPY_THRESHOLD_BYTES)


def recv_frames(socket: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """Receives one multipart message as ``zmq.Frame`` objects (their buffers are not copied).

    Args:
        socket: The socket.
        flags: ``zmq.NOBLOCK`` to raise ``zmq.Again`` rather than wait for a message.

    Raises:
        zmq.Again: With ``NOBLOCK``, if no message waits (or the socket's receive timeout).
    """
    recv = socket.recv
    frame = recv(flags, copy=False)
    frames = [frame]
    while frame.more:  # a message arrives whole: its other frames are there
        frame = recv(flags, copy=False)
        frames.append(frame)
    return frames


def _sender(socket: zmq.Socket) -> Callable[..., Any]:
    """``socket.send``, without pyzmq's Python wrapper when the socket's class adds nothing to it.

    The wrapper (``zmq.Socket.send``) only handles ``routing_id`` and ``group``, which these
    sockets never use; the backend's ``send`` is a C method. A subclass that overrides ``send``
    keeps it.
    """
    if type(socket).send is zmq.Socket.send:
        return functools.partial(zmq.backend.Socket.send, socket)
    return socket.send


def readable(socket: zmq.Socket) -> bool:
    """Whether a message waits on ``socket`` (without a system call: ``ZMQ_EVENTS``)."""
    return bool(socket.getsockopt(_EVENTS) & _POLLIN)


class MessageReader:
    """Whole messages from one socket, whatever exception interrupts a receive.

    A receive is a loop of ``recv`` calls, one per frame, and an exception can end it anywhere:
    a signal handler (Ctrl-C's ``KeyboardInterrupt``) runs between two frames, or inside pyzmq's
    ``recv`` right after it took a frame off the socket (pyzmq checks for signals after every
    ``zmq_msg_recv``), so that frame is gone. A plain loop then leaves the rest of the message
    on the socket, and the next receive starts in the middle of it.

    This reader never does: the next :meth:`next` after an interrupted receive finishes that
    message's business first. A message whose frames were all taken is returned whole; one that
    lost a frame is read to its end and dropped, and its request id (when its first frame was
    kept) goes to :attr:`lost` for the caller to ask again (a host answers a repeated request
    from its cache). Every message a host sends has at least two frames, so a message whose
    first frame was lost still leaves the socket in the middle of it (``RCVMORE``), and is seen.

    A message is also kept until the caller says it has taken it (:meth:`release`): an
    exception between :meth:`next` returning and the caller recording the reply cannot lose it,
    as the next :meth:`next` returns it again (the caller drops what it has taken already).

    Args:
        socket: The socket (a DEALER: messages without a routing frame).
    """

    __slots__ = ("_frames", "_reading", "held", "lost", "socket")

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self._frames: list[zmq.Frame] = []  # the frames of the receive under way, so far
        self._reading = False  # a receive began and has not returned
        #: The message returned and not yet released (the next :meth:`next` returns it again).
        self.held: list[zmq.Frame] | None = None
        #: The request ids of messages dropped because a receive lost one of their frames
        #: (None: the id was in the lost frame), oldest first; the caller empties it.
        self.lost: list[int | None] = []

    def next(self, flags: int = 0) -> list[zmq.Frame] | None:
        """The message held, or the next one off the socket (held until :meth:`release`).

        Args:
            flags: ``zmq.NOBLOCK`` not to wait for a message (a blocking receive waits up to
                the socket's ``RCVTIMEO``).

        Returns:
            The message's frames, or None if none came (nothing was taken off the socket).
        """
        if self.held is not None:
            return self.held
        if self._reading:
            self._finish_interrupted()
            if self.held is not None:
                return self.held
        socket = self.socket
        if flags and not socket.getsockopt(_EVENTS) & _POLLIN:
            return None  # (a look: cheaper than the ``zmq.Again`` a receive raises)
        recv = socket.recv
        self._reading = True
        try:
            frame = recv(flags, copy=False)
        except zmq.Again:
            self._reading = False
            return None
        frames = self._frames = [frame]
        while frame.more:  # the rest of a message is there once its first frame is
            frame = recv(0, copy=False)
            frames.append(frame)
        self.held = frames  # from here on, an interruption leaves it held
        return frames

    def release(self) -> None:
        """The message :meth:`next` returned is taken: the next call reads a new one."""
        self.held = None
        self._reading = False
        self._frames = []

    def _finish_interrupted(self) -> None:
        """Holds the message an interrupted receive took whole, or drops what is left of it."""
        frames = self._frames
        if frames and not frames[-1].more:  # every frame was taken and kept
            self.held = frames
            return
        if frames or self.socket.getsockopt(_RCVMORE):  # a frame was taken and lost
            while self.socket.getsockopt(_RCVMORE):
                self.socket.recv(0, copy=False)
            self.lost.append(_request_id(frames[0]) if frames else None)
        self._frames = []
        self._reading = False


class MessageWriter:
    """Whole messages to one socket, or a socket known to be cut in the middle of one.

    Messages go out in order from an outbox. pyzmq checks for signals both before and after
    it hands a frame to libzmq, so an exception out of ``send`` does not say whether that frame
    was queued: a send that an exception interrupts after it began leaves the socket in the
    middle of a message nobody can finish, and the writer says so (:attr:`cut`). libzmq drops
    an unfinished message when its socket closes, so the owner closes this socket and sends its
    requests again on a new one (the host answers a repeated request from its cache). A send
    interrupted before its first frame left stays in the outbox, sent whole by the next
    :meth:`flush`.

    A send never blocks: a message the socket cannot take at once (a DEALER with no peer to
    queue it for, as when its handshake was refused and libzmq gave up the connection, or a
    full queue) stays in the outbox, and :meth:`flush` tries again when its owner says.

    Args:
        socket: The socket.
    """

    __slots__ = ("_outbox", "_send", "cut", "socket")

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self._send = _sender(socket)
        self._outbox: deque[Sequence[Any]] = deque()
        #: Whether a send was interrupted after it began: the socket may hold half a message.
        self.cut = False

    def send(self, frames: Sequence[Any]) -> None:
        """Sends ``frames`` as one multipart message, after any left in the outbox.

        A large frame is sent without a copy (see :func:`send_frames`): its buffer must not
        change until it is sent. If the socket takes no message now, it stays in the outbox
        (see :attr:`idle`).
        """
        self._outbox.append(frames)
        self.flush()

    @property
    def idle(self) -> bool:
        """Whether every message is sent (none left by an interruption or a socket that waits)."""
        return not self._outbox

    def flush(self) -> None:
        """Sends the messages in the outbox, oldest first (none once :attr:`cut`).

        Stops, without an error, at a message the socket cannot take now (``EAGAIN`` on its
        first frame): it stays first in the outbox.

        Raises:
            zmq.ZMQError: As ``Socket.send`` does, but ``EAGAIN`` on a message's first frame.
        """
        outbox, send = self._outbox, self._send
        while outbox and not self.cut:
            frames = outbox[0]
            last = len(frames) - 1
            i = 0
            try:
                for i, frame in enumerate(frames):
                    size = len(frame) if type(frame) is bytes else memoryview(frame).nbytes
                    flags = _SNDMORE | _NOBLOCK if i < last else _NOBLOCK
                    send(frame, flags, copy=size < COPY_THRESHOLD_BYTES)
            except zmq.Again:
                if i == 0:  # nothing queued: the socket takes no message now
                    return
                self.cut = True  # (libzmq dropped the frames it took: the owner renews)
                raise
            except zmq.ZMQError:  # a failed send queues nothing: whole, if it was the first
                self.cut = i > 0
                raise
            except BaseException:  # interrupted: queued or not, who knows
                self.cut = True
                raise
            outbox.popleft()  # (interrupted before this, it is sent twice: a retry)


def _request_id(envelope: zmq.Frame) -> int | None:
    """The request id in a reply's envelope frame, if it can be read."""
    try:
        request_id = msgpack.unpackb(envelope.buffer)[1]
    except Exception:
        return None
    return request_id if type(request_id) is int else None
