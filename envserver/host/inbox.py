"""Where a host's requests wait: its socket, its sessions' channels, the requests read ahead.

One wait per request: a poll, then a receive that finds the message (never a receive that
fails), because a request's wake-up is the costliest part of it on a small machine. The poll
takes nothing from the socket, so whatever ends it early loses no request. With
:meth:`Inbox.wake_on_signals`, a signal ends it at once, even one that arrived just before it
began: its number is written to a socket the poll watches (:func:`signal.set_wakeup_fd`).

The same poll watches the pipe of every session's channel (:mod:`envserver.wire.channel`): a
request posted there is served before the socket's, since its client sent it before anything
the socket holds from that session (a client posts only while every other request it has under
way is in a channel). The poll alone cannot tell: ``zmq_poll`` reads a socket's state after the
pipes', so a request sent on the socket just after a post may be seen without the post's
wake-up. Every request of the socket (or read ahead) is therefore served only once no channel
holds one posted before it. A session with several channels (one per request its client has
under way) has its requests served in the order sent: of the requests its channels hold, the
one with the lowest id first (:meth:`Inbox._oldest_posted`); the others stay in their channels,
looked at again before the next wait, since their wake-ups may have been read already.
A host with a core of its own first watches its channels for a while (``spin_s``, with the
channel's backoff: :class:`~envserver.wire.channel.SpinBackoff`), so a request posted soon after
the last reply costs no wake-up.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections import deque
from typing import Any

import zmq

from envserver.curve.guard import CurveGuard
from envserver.errors import ProtocolError
from envserver.host.config import HostConfig
from envserver.host.sessions import SessionTable
from envserver.wire.channel import Channel, SpinBackoff
from envserver.wire.endpoints import prepare_socket
from envserver.wire.frames import recv_frames

__all__ = ["Inbox", "bind_router"]

logger = logging.getLogger(__name__)

#: How many rounds of a spin (a look at every channel's header) go between its looks at the
#: socket: a look (``zmq.EVENTS``) costs about ten rounds.
SOCKET_LOOKS = 8
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # (ints: flags cost an enum call each)


def bind_router(context: zmq.Context, config: HostConfig) -> tuple[zmq.Socket, CurveGuard | None]:
    """A host's ROUTER socket, bound as ``config`` says, and its CURVE guard (None: no CURVE).

    Nothing of it is left open if it cannot bind.

    Raises:
        zmq.ZMQError: If the endpoint cannot be bound.
    """
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
    socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
    socket.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
    curve = None
    try:
        if config.curve_secret_key:
            curve = CurveGuard(context, socket, config.curve_secret_key, config.authorized_keys)
        prepare_socket(socket, config.bind)
        socket.bind(config.bind)
    except BaseException:
        socket.close(linger=0)
        if curve is not None:
            curve.close()
        raise
    return socket, curve


class Inbox:
    """The requests of one host's ROUTER socket, in the order they are to be served.

    Args:
        router: The host's socket.
        poll_interval_s: The longest wait for a request (the host's housekeeping interval).
        sessions: The host's sessions, whose channels are watched too.
        spin_s: How long a wait watches the channels before it blocks, while that finds
            requests (see :mod:`envserver.wire.channel`; 0: it blocks at once).
    """

    def __init__(
        self,
        router: zmq.Socket,
        poll_interval_s: float,
        sessions: SessionTable,
        spin_s: float = 0.0,
    ) -> None:
        self.router = router
        #: When a wait spins (its backoff).
        self.spin = SpinBackoff(int(spin_s * 1e9))
        self._sessions = sessions
        self._channels: dict[int, Channel] = {}  # those the poll items have
        self._look_first = False  # requests were left in channels: look before the next wait
        self._unread = False  # spins found requests whose wake-ups are still in their pipes
        #: Requests read ahead of their turn (see ``EnvHost._drain``), served before newer ones.
        self.backlog: deque[list[zmq.Frame]] = deque()
        self._poll_items: list[tuple[Any, int]] = [(router, zmq.POLLIN)]
        self._poll_ms = max(1, int(poll_interval_s * 1000))
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._wakers: list[socket.socket] = []  # see wake_on

    def wake_on_signals(self) -> None:
        """Makes any signal end the wait for a request at once (from the main thread only)."""
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._wakeup = (reader, writer)
        self._poll_items.append((reader.fileno(), zmq.POLLIN))

    def wake_on(self, waker: socket.socket) -> None:
        """Makes a byte in ``waker`` end the wait for a request: it returns None, bytes taken."""
        waker.setblocking(False)
        self._wakers.append(waker)
        self._poll_items.append((waker.fileno(), zmq.POLLIN))

    def next(
        self, stop: threading.Event | None = None, timeout_s: float | None = None
    ) -> list[Any] | None:
        """The next request: from the backlog, else a channel's or the socket's, waited for.

        Args:
            stop: If set when the wait would begin, none is waited for (checking it runs the
                handler of a signal that came since the last wait ended).
            timeout_s: The longest wait (default: the poll interval).

        Returns:
            Where the reply goes, then the request's frames: the sender's identity (a
            ``zmq.Frame``) and the socket's frames, or the channel and its frames (bytes).
            None if none came in time, a signal came, or ``stop`` was set.
        """
        if self._sessions.channels is not self._channels:
            self._watch(self._sessions.channels)
        if self.backlog:
            return self._posted_before(self.backlog.popleft())
        if self._look_first:
            request = self._oldest_posted()
            if request is not None:
                request[0].drain()  # (its wake-up, if written yet: no later poll for it)
                return request
        if stop is not None and stop.is_set():
            return None
        wait_ms = self._poll_ms if timeout_s is None else max(0, int(timeout_s * 1000))
        blocked_at = 0
        if self._channels and self.spin.spin_ns:
            if self.spin.due():
                request = self._spun()
                if request is not None:
                    return request
            else:
                blocked_at = time.perf_counter_ns()
        if self._unread:  # the wake-ups of requests spins found: the poll must not see them
            self._unread = False
            for channel in self._channels.values():
                channel.drain()
            request = self._oldest_posted()  # (posted since the spin ended: none is missed)
            if request is not None:
                return request
        ready = zmq.zmq_poll(self._poll_items, wait_ms)
        if len(ready) == 1 and ready[0][0] is self.router:  # the common case
            return self._posted_before(recv_frames(self.router, zmq.NOBLOCK))
        woken = False
        for source, _ in ready:
            channel = self._channels.get(source)
            if channel is not None:
                channel.drain()
                woken = True
        if woken:
            request = self._oldest_posted()
            if request is not None:
                if blocked_at:
                    self.spin.waited(time.perf_counter_ns() - blocked_at)
                return request
        if self._wakeup is not None:
            with contextlib.suppress(OSError):  # the signals' numbers: their handlers run anyway
                self._wakeup[0].recv(4096)
        for waker in self._wakers:
            with contextlib.suppress(OSError):
                waker.recv(4096)
        if not any(source is self.router for source, _ in ready):
            return None
        return self._posted_before(recv_frames(self.router, zmq.NOBLOCK))

    def _spun(self) -> list[Any] | None:
        """The first request posted in a channel within the spin (None: none, or the socket's).

        The socket is looked at every :data:`SOCKET_LOOKS` rounds (a look costs ten rounds),
        the first round too. The wake-up of the request found is left in its pipe, read before
        the next wait that blocks (``_unread``).
        """
        channels, router = list(self._channels.values()), self.router
        until = time.perf_counter_ns() + self.spin.spin_ns
        rounds = 0
        while time.perf_counter_ns() < until:
            for channel in channels:
                if channel.fresh():
                    request = self._oldest_posted()
                    if request is not None:
                        self._unread = True
                        self.spin.found(True)
                        return request
            if not rounds % SOCKET_LOOKS and router.get(_EVENTS) & _POLLIN:
                return None
            rounds += 1
        self.spin.found(False)
        return None

    def _posted_before(self, frames: list[Any]) -> list[Any]:
        """``frames``, a socket's request, unless a channel holds one posted before it: that one.

        Whatever a channel holds now was posted before ``frames`` came (a client posts, then
        sends), so ``frames`` waits at the backlog's front (a look at each channel's header,
        no wait: a wake-up left in its pipe ends a later poll with nothing new).
        """
        request = self._oldest_posted()
        if request is not None:
            self.backlog.appendleft(frames)
            return request
        return frames

    def _oldest_posted(self) -> list[Any] | None:
        """The request with the lowest id of those the channels hold, taken (None: none).

        Ids grow within a session, so a session's requests are served in the order sent (ids
        of different sessions are compared too, which orders nothing that matters). If others
        are left in channels, the next :meth:`next` looks at them before it waits.
        """
        oldest, oldest_id, left = None, 0, False
        for channel in self._channels.values():
            posted = channel.posted()
            if posted is not None:
                if oldest is None or posted < oldest_id:
                    left = left or oldest is not None
                    oldest, oldest_id = channel, posted
                else:
                    left = True
        self._look_first = left
        return None if oldest is None else self._posted(oldest)

    def _watch(self, channels: dict[int, Channel]) -> None:
        """Polls these channels' pipes (beside the socket, and the signals' if watched)."""
        items = [item for item in self._poll_items if item[0] not in self._channels]
        self._poll_items = items + [(fd, zmq.POLLIN) for fd in channels]
        self._channels = channels

    @staticmethod
    def _posted(channel: Channel) -> list[Any] | None:
        """The request posted in ``channel``, after it (None: nothing new was posted).

        A message that does not fit its area is a request the host could not read: its
        frames are none, and its reply an error.
        """
        try:
            frames = channel.next()
        except ProtocolError:
            logger.info("an unreadable message in a channel")
            frames = []
        channel.release()
        return None if frames is None else [channel, *frames]  # (bytes: ChannelFrame)

    def close(self) -> None:
        """Stops watching signals (the socket is the host's to close)."""
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            for end in self._wakeup:
                end.close()
            self._wakeup = None
