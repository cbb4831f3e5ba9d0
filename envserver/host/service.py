"""How a host answers one request: from its frames to its reply, the same path for every command.

The path, each step once: the message's size against the host's bound; the request decoded;
its command's :class:`Entry` in the dispatch table (:class:`~envserver.host.commands.HostCommands`
fills it); its session looked up, if the command needs one; a retry answered from the session's
cache; what the envs say listened to, if the session asked for it; the body read as the entry
says and the handler run; the result encoded; what the envs said added; the reply kept for
retries. Whatever goes wrong on the way is the reply: an error reply, and the host goes on.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from envserver.curve.guard import RateLimitedLog
from envserver.errors import LimitError, MessageTooLargeError, PickleNotAllowedError, ProtocolError
from envserver.host.config import HostConfig
from envserver.host.metrics import NoMetrics
from envserver.host.relay import Relay, Said
from envserver.host.sessions import Session, SessionTable
from envserver.host.worker import EnvCallError
from envserver.wire.messages import (
    Command,
    Request,
    Status,
    add_said,
    decode_request,
    encode_raw_reply,
    encode_reply,
    error_body,
    request_id_of,
)

__all__ = ["Body", "CommandService", "Entry", "Handler", "Prepared"]

logger = logging.getLogger(__name__)

#: The least time between two log lines of failed requests of one kind.
FAILURE_LOG_INTERVAL_S = 1.0

#: Runs a command: ``handler(session, body)`` returns its OK reply's body (the session is None
#: for a command that needs none; the body is read as its :class:`Entry` says).
Handler = Callable[..., Any]


class Body(enum.Enum):
    """How a command's body is read before its handler gets it."""

    MAP = "map"
    """A map (else a ``ProtocolError``), which the handler reads as its typed body
    (:mod:`envserver.wire.bodies`)."""
    IGNORED = "ignored"
    """Anything: decoded (so it must be valid), then not read."""
    FRAMES = "frames"
    """Raw frames in the session's step layout (STEP_RAW), not a codec body."""


@dataclass(frozen=True, slots=True)
class Entry:
    """What the host must know of one command to answer it: one row of the dispatch table.

    Attributes:
        handler: Runs the command (see :data:`Handler`).
        body: How its body is read.
        session: Whether it needs an open session (PING and HELLO do not).
        cached: Whether it is in its session's request order: its reply is kept for retries,
            and carries what the envs said. HEARTBEAT is not: it comes from a socket of its
            own, with ids of its own, where a said frame would reach no one.
        at_once: Whether it only renews its session's lease: it does not count as using the
            session (idle timeout), and a loop reading ahead answers it at once (HEARTBEAT).
        raw_reply: Whether its OK reply is raw frames (STEP_RAW) rather than a codec body
            (with pickled values where the session allows them).
    """

    handler: Handler
    body: Body = Body.MAP
    session: bool = True
    cached: bool = True
    at_once: bool = False
    raw_reply: bool = False


@dataclass(eq=False, slots=True)
class Prepared:
    """A request on its way to its reply (see :meth:`CommandService.prepare`).

    Attributes:
        frames: The request's frames.
        request_id: Its id (None: unreadable).
        command: Its command (None: unreadable).
        request: The request decoded.
        entry: Its command's entry.
        session: Its session (None: none needed, or not found).
        reply: Its reply's frames, once made.
        ok: Whether the reply is OK.
        kept: Whether the reply came from the retry cache.
        busy: The envs it keeps busy while it runs on a thread (``envserver.host.overlap``).
    """

    frames: list[Any]
    request_id: int | None = None
    command: Command | None = None
    request: Request | None = None
    entry: Entry | None = None
    session: Session | None = None
    reply: list[Any] | None = None
    ok: bool = False
    kept: bool = False
    busy: frozenset[int] = frozenset()


class CommandService:
    """Answers requests with the dispatch table's handlers.

    Args:
        table: Every command's entry.
        config: How the host serves (its message bound and pickle flag here).
        sessions: The host's sessions.
        metrics: What counts the requests.
        relay: What the envs say, collected per command (None: not collected).
    """

    def __init__(
        self,
        table: Mapping[Command, Entry],
        config: HostConfig,
        sessions: SessionTable,
        metrics: NoMetrics,
        relay: Relay | None,
    ) -> None:
        self._table = dict(table)
        self._max_bytes = config.max_message_bytes
        self._allow_pickle = config.allow_pickle
        self._sessions = sessions
        self._metrics = metrics
        self._relay = relay
        self._failures = RateLimitedLog(logger, FAILURE_LOG_INTERVAL_S)

    def at_once(self, command: int | None) -> bool:
        """Whether a request read ahead of its turn is answered at once (see :class:`Entry`).

        Args:
            command: The command's code as the envelope says it (None: unreadable).
        """
        entry = self._table.get(command)
        return entry is not None and entry.at_once

    def handle(self, frames: list[Any]) -> list[Any] | None:
        """Answers one request.

        Args:
            frames: The request's frames, without the ROUTER identity.

        Returns:
            The reply frames, or None for input that cannot be framed as a request.
        """
        if not frames:
            return None
        if type(self._metrics) is NoMetrics:  # nothing counted: no clock read
            return self._answer(frames)[0]
        started = time.perf_counter()
        reply, command, ok = self._answer(frames)
        self._metrics.request(command, ok, time.perf_counter() - started)
        return reply

    def _answer(self, frames: list[Any]) -> tuple[list[Any], Command | None, bool]:
        """The reply to a request, the request's command (None if unreadable), and whether OK."""
        prepared = self.prepare(frames)
        if prepared.reply is None:
            self.execute(prepared)
        self.record(prepared)
        return prepared.reply, prepared.command, prepared.ok

    def count(self, prepared: Prepared, seconds: float) -> None:
        """Counts a request answered in ``seconds`` (one not answered by :meth:`handle`)."""
        self._metrics.request(prepared.command, prepared.ok, seconds)

    def refuse(self, prepared: Prepared, error: Exception) -> None:
        """Answers ``prepared`` with an error reply for ``error``, running nothing."""
        prepared.reply = self._failed(error, prepared.request_id, prepared.frames)

    def prepare(self, frames: list[Any]) -> Prepared:
        """A request read and its session found: the first half of answering it.

        Its :attr:`Prepared.reply` is set already when there is nothing to run: a retry
        answered from the cache, or a request refused before its handler.
        """
        prepared = Prepared(frames)
        try:
            request = self._decoded(frames)
            prepared.request_id, prepared.command = request.request_id, request.command
            prepared.request = request
            entry = prepared.entry = self._table[request.command]
            if entry.session:
                prepared.session = self._sessions.of(request.session, used=not entry.at_once)
            if entry.cached and prepared.session is not None:
                kept = prepared.session.cached(request.request_id, request.command)
                if kept is not None:
                    prepared.reply, prepared.ok, prepared.kept = kept.frames, kept.ok, True
        except Exception as exc:
            prepared.reply = self._failed(exc, prepared.request_id, frames)
        return prepared

    def execute(self, prepared: Prepared, alone: bool = True) -> None:
        """Runs a prepared request's handler and encodes its reply (:attr:`Prepared.reply`).

        Safe on another thread than the loop's with ``alone`` false (an overlapping session's
        request): what its envs say is collected on its threads (see ``Relay``).
        """
        request, entry, session = prepared.request, prepared.entry, prepared.session
        command, request_id = prepared.command, prepared.request_id
        said: Said | None = None  # what the envs say while the command runs
        heard = session is not None and session.said
        relay = self._relay if entry.cached and (heard or not alone) else None
        try:
            if relay is not None:
                said = relay.listen(session.warned if heard else None, alone)
            body = request.body
            if entry.body is Body.MAP and not isinstance(body, dict):
                raise ProtocolError(f"the body of {command.name} must be a map")
            result = entry.handler(session, body)
            if entry.raw_reply:
                reply = encode_raw_reply(request_id, result)
            else:
                pickle = session is not None and session.pickle
                reply = encode_reply(request_id, Status.OK, result, allow_pickle=pickle)
            prepared.ok = True
        except EnvCallError as failure:
            reply = self._env_failed(failure, request_id, session)
        except Exception as exc:
            reply = self._failed(exc, request_id, prepared.frames)
        finally:
            if relay is not None:
                relay.done(alone)
        if said is not None and said.spoke:
            reply = self._with_said(reply, said, session)
        prepared.reply = reply

    def record(self, prepared: Prepared, late: bool = False) -> None:
        """Keeps the reply of a request that ran, for retries (the last half of answering it).

        ``late``: it ran while newer requests of its session were answered (see
        ``Session.answered``).
        """
        entry, session = prepared.entry, prepared.session
        if entry is not None and entry.cached and session is not None and not prepared.kept:
            session.answered(
                prepared.request_id,
                prepared.command,
                prepared.reply,
                prepared.ok,
                time.monotonic(),
                late=late,
            )

    def _decoded(self, frames: list[Any]) -> Request:
        """The request, if the message is within the host's bound and decodes.

        Raises:
            MessageTooLargeError: If its frames together pass the bound.
            PickleNotAllowedError: If it carries pickle and the host does not allow it.
            ProtocolError: If it is not a well-formed request.
        """
        size = 0
        for frame in frames:  # (a loop: no Python call, as a comprehension is)
            size += memoryview(frame).nbytes
        if size > self._max_bytes:
            raise MessageTooLargeError(
                f"request of {size} bytes exceeds this host's bound of {self._max_bytes} bytes"
            )
        try:
            return decode_request(frames, allow_pickle=self._allow_pickle)
        except PickleNotAllowedError as exc:
            raise PickleNotAllowedError(
                "this host refuses pickled data: it was not started with "
                "--allow-pickle; make envs from a registered env id instead"
            ) from exc

    def _env_failed(
        self, failure: EnvCallError, request_id: int | None, session: Session | None
    ) -> list[Any]:
        """The error reply to a command an env raised in, logged and counted."""
        where = session.session_id.hex() if session is not None else "-"
        logger.info(
            "session %s env %d raised %s: %s",
            where,
            failure.index,
            type(failure.error).__name__,
            failure.error,
            extra={
                "session": where,
                "env_index": failure.index,
                "exception": type(failure.error).__name__,
            },
        )
        self._metrics.env_error()
        return _error_reply(request_id, failure.error, failure.index)

    def _failed(self, exc: Exception, request_id: int | None, frames: list[Any]) -> list[Any]:
        """The error reply to a request that failed otherwise, logged (rate-limited), counted."""
        if request_id is None:
            request_id = request_id_of(frames)
        # At most a line a second per kind: a client may send failing requests in a flood.
        self._failures.log(
            logging.INFO, type(exc).__name__, f"request {request_id} failed: {exc!r}"
        )
        if isinstance(exc, LimitError):
            self._metrics.session_refused()
        return _error_reply(request_id, exc)

    def _with_said(self, reply: list[Any], said: Said, session: Session) -> list[Any]:
        """The reply, with what the envs said (which the log gets too)."""
        frame = self._relay.send(said, {"session": session.session_id.hex()})
        return reply if frame is None else add_said(reply, frame)


def _error_reply(
    request_id: int | None, exc: BaseException, env_index: int | None = None
) -> list[Any]:
    """The error reply describing ``exc``; one whose text will not encode keeps its type only."""
    body = error_body(exc, env_index)
    try:
        return encode_reply(request_id, Status.ERROR, body)
    except Exception:
        logger.exception("could not encode an error reply")
        return encode_reply(request_id, Status.ERROR, error_body(exc, env_index, texts=False))
