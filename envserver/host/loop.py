"""The env host: one ROUTER socket, one single-threaded loop, many client sessions.

Each client opens a session with HELLO and gets its own envs; a session id is a random token
the client sends with every later request, so two trainers on one host never touch each other's
envs. Everything a client or an env does wrong becomes an error reply: the host keeps serving.

:class:`EnvHost` is the loop: it waits for requests (:class:`~envserver.host.inbox.Inbox`), sends
their replies, reads ahead to hear every client before it closes sessions whose lease passed,
refuses what comes once it stops, and closes everything. What a request gets as its reply is
the command service's (:class:`~envserver.host.service.CommandService`, with the handlers of
:class:`~envserver.host.commands.HostCommands`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from typing import Any

import zmq

from envserver.errors import HostUnavailableError, ProtocolError
from envserver.host.commands import HostCommands
from envserver.host.config import HostConfig
from envserver.host.drain import Drain
from envserver.host.inbox import Inbox, bind_router
from envserver.host.metrics import HostMetrics, NoMetrics
from envserver.host.overlap import Overlap
from envserver.host.relay import Relay
from envserver.host.service import CommandService
from envserver.host.sessions import SessionTable
from envserver.wire.channel import Channel
from envserver.wire.frames import recv_frames, send_frames
from envserver.wire.messages import Status, encode_reply, error_body, peek_request, request_id_of

__all__ = ["EnvHost", "HostConfig"]

logger = logging.getLogger(__name__)

#: How often the loop wakes up to check for stop requests and a vanished parent.
POLL_INTERVAL_S = 0.25
#: The most queued requests read at once to learn whose clients are alive (see ``_drain``).
MAX_DRAIN = 10_000


class EnvHost:
    """Serves Gymnasium envs to remote clients over one ROUTER socket.

    Args:
        config: How to serve.
        context: The ZeroMQ context to use (a new one by default).
        relay: What the envs say, collected per command and sent to the sessions that ask
            (installed in this process: ``envserver serve`` makes one); None: not collected.
    """

    def __init__(
        self, config: HostConfig, context: zmq.Context | None = None, relay: Relay | None = None
    ) -> None:
        self.config = config
        #: Collects what the envs say per command (None: nothing is collected).
        self.relay = relay
        self.sessions = SessionTable(
            config.max_sessions, config.session_lease_s, config.session_idle_timeout_s
        )
        self._overlap: Overlap | None = None  # made with the command service, below
        self._own_context = context is None
        self._context = context or zmq.Context()
        try:
            # The CURVE guard (None: no CURVE) logs the clients it refuses.
            self._socket, self._curve = bind_router(self._context, config)
        except BaseException:  # nothing left open (a CLI error is one line, no warnings)
            if self._own_context:
                self._context.term()
            raise
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.name = config.name or self.endpoint
        #: Tells this host apart from others (pids repeat across containers): a random token.
        self.instance = secrets.token_hex(8)
        self.metrics: NoMetrics = NoMetrics()
        self._stop = threading.Event()
        #: The host's drain (``drain.request()`` from a signal handler starts it).
        self.drain = Drain(config.drain_grace_s)
        self._inbox = Inbox(self._socket, POLL_INTERVAL_S, self.sessions, config.channel_spin_s)
        if config.metrics_port is not None:
            try:
                self.metrics = HostMetrics(
                    lambda: len(self.sessions), self.sessions.envs_held,
                    self.sessions.envs_on_threads, config.metrics_port, config.metrics_bind,
                )  # fmt: skip
            except BaseException:
                self.close()
                raise
        commands = HostCommands(
            config,
            self.sessions,
            self.metrics,
            name=self.name,
            instance=self.instance,
            curve=self._curve is not None,
            drain=self.drain,
        )
        self._service = CommandService(commands.table(), config, self.sessions, self.metrics, relay)
        #: The steps and resets of sessions that overlap them, under way on threads.
        self._overlap = Overlap(self._service, config.max_env_threads)
        self._inbox.wake_on(self._overlap.waker)
        logger.info(
            "env host %s serving (pickle %s, envs %s)",
            self.endpoint,
            "allowed" if config.allow_pickle else "refused",
            ", ".join(config.env_patterns),
        )

    def stop(self) -> None:
        """Asks the loop to finish; safe from signal handlers and other threads."""
        self._stop.set()

    def wake_on_signals(self) -> None:
        """Makes a signal handler's :meth:`stop` take effect at once (main thread only).

        Without it, a stop is seen when the wait for a request ends (:data:`POLL_INTERVAL_S`).
        """
        self._inbox.wake_on_signals()

    def handle(self, frames: list[Any]) -> list[Any] | None:
        """Answers one request (see :meth:`CommandService.handle`).

        Args:
            frames: The request's frames, without the ROUTER identity.

        Returns:
            The reply frames, or None for input that cannot be framed as a request.
        """
        return self._service.handle(frames)

    def serve_forever(self) -> None:
        """Answers requests until :meth:`stop` is called or the parent process is gone."""
        housekeeping_due = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if self.drain.requested and self._drained(now):
                    break
                if now >= housekeeping_due:
                    if self._parent_gone():
                        logger.warning("parent process %s is gone; exiting", self.config.parent_pid)
                        break
                    self._reap_sessions(now)
                    housekeeping_due = now + POLL_INTERVAL_S
                frames = self._inbox.next(self._stop)
                if frames is not None:
                    self._serve_one(frames)
                if self._overlap.running:
                    self._send_finished()
            # Requests on their way when the stop came are refused too, while clients may
            # still send them (a trainer that closed its sessions sends no more).
            self._refuse_queued(POLL_INTERVAL_S if len(self.sessions) else 0.0)
        finally:
            self.close()

    def _drained(self, now: float) -> bool:
        """Begins a drain asked for; whether it is over (no session left, or no time)."""
        if self.drain.until is None:
            self.drain.begin(now)
            if len(self.sessions):
                self.metrics.drain_begun()
                logger.warning(
                    "draining: %d session(s) holding %d env(s) have %g s to move them elsewhere",
                    len(self.sessions),
                    self.sessions.envs_held(),
                    self.drain.grace_s,
                )
        if not len(self.sessions):
            logger.info("drained: no session left")
            return True
        if now >= self.drain.until:
            logger.warning("the drain's %g s are over: stopping", self.drain.grace_s)
            return True
        return False

    def _refuse_queued(self, grace_s: float) -> None:
        """Answers with a "shutting down" error the requests that arrive until ``grace_s``.

        Those already queued are answered in any case.
        """
        error = HostUnavailableError("this host is shutting down")
        deadline = time.monotonic() + grace_s
        while (frames := self._inbox.next(None, deadline - time.monotonic())) is not None:
            to = frames[0]
            payload = frames[1:] if type(to) is Channel else [f.buffer for f in frames[1:]]
            reply = encode_reply(request_id_of(payload or [b""]), Status.ERROR, error_body(error))
            if type(to) is Channel:
                _post(to, reply)
                continue
            with contextlib.suppress(zmq.ZMQError):
                send_frames(self._socket, [to, *reply])

    def _reap_sessions(self, now: float) -> None:
        """Closes the sessions whose lease or idle timeout passed (:mod:`envserver.host.sessions`).

        The requests queued while the loop was busy (one long env step, say) are read first:
        their clients are alive, though the loop could not hear them in time.
        """
        if not self.sessions.expired(now):
            return
        self._drain()
        for reason in self.sessions.reap(time.monotonic()):
            self.metrics.session_evicted(reason.value)

    def _drain(self) -> None:
        """Reads the queued requests: each renews its session's lease.

        Requests go to the backlog, served in arrival order before anything newer; those the
        dispatch table answers at once (HEARTBEAT: see ``Entry.at_once``) are answered now
        instead, unless their connection has requests in the backlog (a reply may overtake
        other connections' replies, never its own connection's).
        """
        waiting = {frames[0].bytes for frames in self._inbox.backlog}  # those with a backlog
        for _ in range(MAX_DRAIN):
            try:
                frames = recv_frames(self._socket, zmq.NOBLOCK)
            except zmq.Again:
                return
            command, session_id = peek_request([frame.buffer for frame in frames[1:]] or [b""])
            at_once = self._service.at_once(command)
            self.sessions.heard(session_id, time.monotonic(), used=not at_once)
            if at_once and frames[0].bytes not in waiting:
                self._serve_one(frames)
            else:
                waiting.add(frames[0].bytes)
                self._inbox.backlog.append(frames)

    def _parent_gone(self) -> bool:
        return self.config.parent_pid is not None and os.getppid() != self.config.parent_pid

    def _serve_one(self, frames: list[Any]) -> None:
        """Answers one request of the inbox: to its sender's identity, or in its channel."""
        to = frames[0]
        if type(to) is Channel:
            reply = self.handle(frames[1:])
            if reply is None:  # its client waits there: an error
                error = ProtocolError("a message in the channel that is not a request")
                reply = encode_reply(None, Status.ERROR, error_body(error))
            _post(to, reply)
            return
        payload = []
        for frame in frames[1:]:  # (a loop: no Python call, as a comprehension is)
            payload.append(frame.buffer)
        if self.sessions.overlapping and payload:
            self._serve_overlapping(to, payload)
            return
        reply = self.handle(payload)
        if reply is not None:
            self._send(to, reply)

    def _serve_overlapping(self, to: Any, payload: list[Any]) -> None:
        """Answers a request while some session overlaps (see :mod:`envserver.host.overlap`).

        A retry of a request under way waits for its reply; a request that names a busy env
        is refused; a step or reset of an overlapping session starts on a thread.
        """
        overlap, service = self._overlap, self._service
        _, session_id = peek_request(payload)
        session = self.sessions.get(session_id)
        if session is not None and overlap.retry(session, request_id_of(payload), to):
            return
        started = time.perf_counter()
        prepared = service.prepare(payload)
        refusal = overlap.refusal(prepared)
        if refusal is not None:
            service.refuse(prepared, refusal)
        elif overlap.takes(prepared):
            overlap.start(prepared, to)
            return
        if prepared.reply is None:
            service.execute(prepared)
        service.record(prepared)
        service.count(prepared, time.perf_counter() - started)
        self._send(to, prepared.reply)

    def _send_finished(self) -> None:
        """Sends the replies of the requests that finished on threads."""
        for destinations, reply in self._overlap.finished():
            for to in destinations:
                self._send(to, reply)

    def _send(self, to: Any, reply: list[Any]) -> None:
        try:
            send_frames(self._socket, [to, *reply])
        except zmq.ZMQError as exc:
            logger.warning("could not send a reply: %s", exc)

    def close(self) -> None:
        """Closes every session's envs (and channels) and the socket."""
        self.sessions.close_all()  # (each waits for its requests under way on threads)
        if self._overlap is not None:
            self._overlap.close()
        self._socket.close(linger=1000)
        if self._curve is not None:
            self._curve.close()
        self.metrics.close()
        if self._own_context:
            self._context.term()
        self._inbox.close()
        logger.info("env host %s closed", self.endpoint)


def _post(channel: Channel, reply: list[Any]) -> None:
    """Posts ``reply`` in the channel its request came in.

    A reply too large for the channel is not posted there: an empty message says so, and the
    client asks again over the socket (answered from the retry cache).
    """
    if not channel.post(reply, channel.taken):
        channel.post([], channel.taken)
