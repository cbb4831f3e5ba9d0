"""Session leases, client side: heartbeats while the trainer lives, CLOSE when it exits.

A host closes a session, and its envs, once it has not heard from the session's client for its
lease (``envserver serve --session-lease``, 30 s by default), so that a trainer killed with
``kill -9`` or Ctrl-C does not hold its envs (and a ``--max-sessions`` slot) for long. A live
client must therefore be heard from even while it sends nothing, e.g. while it trains:

- :class:`Heartbeat` runs one daemon thread per vector env, holding one DEALER socket per
  session (ZeroMQ sockets are not thread-safe: the connections' own sockets stay with the
  trainer's thread). It sends HEARTBEAT every third of the lease each host states in its
  HEARTBEAT reply, and sleeps in between, in a poll that a socket pair wakes when sessions come
  or go. The trainer's requests pay nothing for it. Its sockets live in a ZeroMQ context of
  this module's, never terminated: terminating the client's own context never waits for them,
  not even at interpreter exit, where a daemon thread may be frozen before it closed them.
  A host that drains (``envserver serve --drain-grace``) says so in its HEARTBEAT replies:
  :meth:`Heartbeat.draining` tells which sessions' hosts do, and the trainer moves their envs.
- :func:`close_at_exit` closes the vector envs still open at interpreter exit (a script that
  ends without ``close()``), so their hosts release the sessions at once, not a lease later.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import weakref
from typing import Any

import zmq

from envserver.errors import EnvServerError, ProtocolError
from envserver.wire.endpoints import client_socket
from envserver.wire.messages import Command, Status, decode_reply, encode_request
from envserver.wire.replies import HeartbeatReply

from .error_replies import UNKNOWN_SESSION, error_type

__all__ = ["Heartbeat", "close_at_exit"]

logger = logging.getLogger(__name__)

#: How often a session is beaten before its host has stated its lease.
FIRST_INTERVAL_S = 1.0
#: The shortest interval between two heartbeats of a session, whatever the lease.
MIN_INTERVAL_S = 0.05
#: The longest: a host's drain is heard within it (however long its lease, or with none).
MAX_INTERVAL_S = 5.0
#: How many heartbeats of one session may wait in its socket for a host that does not read them.
QUEUED_BEATS = 4
#: How long ``Heartbeat.close`` waits for the thread to finish.
STOP_TIMEOUT_S = 5.0

#: CURVE keys ``(server_public, client_public, client_secret)``.
Curve = tuple[bytes, bytes, bytes]

_context_lock = threading.Lock()
_contexts: dict[int, zmq.Context] = {}  # by process id: a forked child makes its own


def _context() -> zmq.Context:
    """The heartbeat sockets' context in this process (see the module's docstring)."""
    with _context_lock:
        context = _contexts.get(os.getpid())
        if context is None:
            _contexts.clear()
            context = _contexts[os.getpid()] = zmq.Context()
        return context


class _Beat:
    """Heartbeats of one session, from a socket of their own (used by the thread only)."""

    def __init__(
        self, context: zmq.Context, endpoint: str, session: bytes, curve: Curve | None
    ) -> None:
        self.endpoint = endpoint
        self.session = session
        self.curve = curve
        self.lease_s: float | None = None  # as the host states it
        self.draining = False  # whether the host said it drains
        self.due = 0.0  # the first beat at once: the host states its lease in the reply
        self._sent_at = 0.0
        self._ids = itertools.count(1)
        self.socket = client_socket(context, endpoint, curve)
        try:
            self.socket.setsockopt(zmq.SNDHWM, QUEUED_BEATS)
            self.socket.connect(endpoint)
        except BaseException:
            self.socket.close(linger=0)
            raise

    def send(self, now: float) -> None:
        """Sends a heartbeat (dropped if the host has not read the last few), schedules the next."""
        frames = encode_request(
            next(self._ids), Command.HEARTBEAT, self.session, None, allow_pickle=False
        )
        with contextlib.suppress(zmq.Again):  # not connected (yet), or the host is not reading
            self.socket.send_multipart(frames, zmq.NOBLOCK)
        self._sent_at = now
        self.due = now + self._interval()

    def _interval(self) -> float:
        if self.lease_s is None:
            return FIRST_INTERVAL_S
        if self.lease_s == 0:  # a host without a lease: nothing to renew, a drain to hear
            return MAX_INTERVAL_S
        return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, self.lease_s / 3))

    def receive(self) -> None:
        """Reads the host's replies: the lease it states, or that the session is gone."""
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                reply = decode_reply(frames, allow_pickle=False)
            except EnvServerError as exc:
                logger.debug("invalid heartbeat reply from %s: %s", self.endpoint, exc)
                continue
            if reply.status == Status.OK:
                try:
                    heard = HeartbeatReply.from_wire(reply.body)
                    self.lease_s = heard.session_lease_s
                    self.draining = heard.draining_s is not None
                except ProtocolError as exc:
                    logger.debug("invalid heartbeat reply from %s: %s", self.endpoint, exc)
                    continue
                self.due = self._sent_at + self._interval()
            elif error_type(reply) == UNKNOWN_SESSION:
                self.due = math.inf
                logger.info(
                    "host %s no longer holds session %s (closed, expired, or the host "
                    "restarted): no more heartbeats for it",
                    self.endpoint,
                    self.session.hex(),
                )
                return
            else:
                logger.debug(
                    "heartbeat to %s answered with an error: %s", self.endpoint, reply.body
                )

    def close(self) -> None:
        self.socket.close(linger=0)


class Heartbeat:
    """Keeps the leases of a client's sessions renewed from a daemon thread.

    The thread starts with the first session tracked and ends with :meth:`close`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: dict[Any, tuple[str, bytes, Curve | None]] = {}
        self._draining: set[Any] = set()  # the keys of the sessions whose host drains
        #: Whether some session's host drains: read without the lock, as a hint to look.
        self.any_draining = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._wake_in: socket.socket | None = None
        self._wake_out: socket.socket | None = None

    def track(self, key: Any, endpoint: str, session: bytes, curve: Curve | None) -> None:
        """Renews a session's lease from now on.

        Args:
            key: What stands for this session in :meth:`untrack` (its connection).
            endpoint: The host's endpoint.
            session: The session id.
            curve: The CURVE keys the connection uses, or None.
        """
        with self._lock:
            if self._closing:
                return
            self._wanted[key] = (endpoint, session, curve)
            if self._thread is None or not self._thread.is_alive():  # (again, if it failed)
                for end in (self._wake_in, self._wake_out):
                    if end is not None:
                        end.close()
                self._wake_in, self._wake_out = socket.socketpair()
                self._wake_out.setblocking(False)
                self._thread = threading.Thread(
                    target=self._run, name="envserver-heartbeat", daemon=True
                )
                self._thread.start()
        self._wake()

    def untrack(self, key: Any) -> None:
        """Stops renewing the lease of the session tracked under ``key`` (if any)."""
        with self._lock:
            self._draining.discard(key)
            self.any_draining = bool(self._draining)
            if self._wanted.pop(key, None) is None:
                return
        self._wake()

    def draining(self, key: Any) -> bool:
        """Whether the host of the session tracked under ``key`` said it drains."""
        with self._lock:
            return key in self._draining

    def close(self) -> None:
        """Stops the thread and closes its sockets (idempotent)."""
        with self._lock:
            self._closing = True
            thread = self._thread
        if thread is None or sys.is_finalizing():  # then the daemon thread is frozen
            return
        self._wake()
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            logger.warning("the heartbeat thread did not stop within %g s", STOP_TIMEOUT_S)
            return
        for end in (self._wake_in, self._wake_out):
            if end is not None:
                end.close()

    def _wake(self) -> None:
        if self._wake_out is not None:
            with contextlib.suppress(OSError):  # full (the thread wakes anyway) or closed
                self._wake_out.send(b"\0")

    def _run(self) -> None:
        assert self._wake_in is not None
        # Signals for the process go to the trainer's thread, where they interrupt its waits
        # at once; one taken here would be acted on only at the trainer's next call into
        # pyzmq, half-way through a message (see envserver.wire.frames).
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        self._wake_in.setblocking(False)
        beats: dict[Any, _Beat] = {}
        wake_fd = self._wake_in.fileno()  # the poller reports a plain socket by its fd
        poller = zmq.Poller()
        poller.register(wake_fd, zmq.POLLIN)
        try:
            while True:
                with self._lock:
                    if self._closing:
                        return
                    wanted = dict(self._wanted)
                self._follow(beats, wanted, poller)
                now = time.monotonic()
                for beat in beats.values():
                    if beat.due <= now:
                        beat.send(now)
                due = min((beat.due for beat in beats.values()), default=math.inf)
                timeout_ms = None if due == math.inf else max(0.0, due - now) * 1000
                for ready, _ in poller.poll(timeout_ms):
                    if ready == wake_fd:
                        self._take_wake_ups()
                        continue
                    key, beat = next((k, b) for k, b in beats.items() if b.socket is ready)
                    beat.receive()
                    if beat.draining:
                        with self._lock:
                            if key in self._wanted:
                                self._draining.add(key)
                                self.any_draining = True
        except Exception:  # never silently: without heartbeats the hosts close the sessions
            logger.exception("heartbeats failed: hosts will close these sessions at their lease")
        finally:
            for beat in beats.values():
                beat.close()

    def _follow(
        self,
        beats: dict[Any, _Beat],
        wanted: dict[Any, tuple[str, bytes, Curve | None]],
        poller: zmq.Poller,
    ) -> None:
        """Opens sockets for the sessions tracked since, closes those of the sessions gone."""
        for key in list(beats):
            beat = beats[key]
            if wanted.get(key) != (beat.endpoint, beat.session, beat.curve):
                poller.unregister(beat.socket)
                beat.close()
                del beats[key]
        for key, (endpoint, session, curve) in wanted.items():
            if key not in beats:
                beat = beats[key] = _Beat(_context(), endpoint, session, curve)
                poller.register(beat.socket, zmq.POLLIN)

    def _take_wake_ups(self) -> None:
        assert self._wake_in is not None
        try:
            while self._wake_in.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass


_open_envs: weakref.WeakSet[Any] = weakref.WeakSet()
_process = os.getpid()


def close_at_exit(envs: Any) -> None:
    """Closes ``envs`` at interpreter exit if it is still open then.

    Only a weak reference is kept: an env dropped earlier is closed by its own finalizer. A
    forked child process does not close its parent's envs.

    Args:
        envs: A vector env (anything with ``closed`` and ``close()``).
    """
    global _process
    if _process != os.getpid():  # a forked child: the parent's envs are not ours
        _open_envs.clear()
        _process = os.getpid()
    _open_envs.add(envs)
    # Registered anew each time, so that it runs before the exit handlers registered since
    # (atexit runs the last registered first), such as the local hosts' own.
    atexit.unregister(_close_open_envs)
    atexit.register(_close_open_envs)


def _close_open_envs() -> None:
    if _process != os.getpid():
        return
    for envs in list(_open_envs):
        if getattr(envs, "closed", True):
            continue
        logger.info("closing %r at exit (it was not closed)", envs)
        try:
            envs.close()
        except Exception as exc:
            logger.warning("closing %r at exit failed: %r", envs, exc)
