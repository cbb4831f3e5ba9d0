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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

__all__ = ["COPY_THRESHOLD_BYTES", "readable", "recv_frames", "send_frames"]

#: Frames up to this size are copied into the message; larger ones are sent without a copy.
COPY_THRESHOLD_BYTES: int = zmq.COPY_THRESHOLD
_SNDMORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


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


def readable(socket: zmq.Socket) -> bool:
    """Whether a message waits on ``socket`` (without a system call: ``ZMQ_EVENTS``)."""
    return bool(socket.getsockopt(_EVENTS) & _POLLIN)
