"""The sessions of one env host: whose envs these are, and how long they are kept.

A session lives until its client sends CLOSE, the host exits, or the host closes it for one of
two reasons (see :class:`Eviction`):

- **lease**: nothing was heard from the client for ``lease_s`` seconds (no request, not even a
  HEARTBEAT). Its client is gone: killed (``kill -9``, Ctrl-C, OOM), crashed, or cut off.
  A live client sends HEARTBEAT well within the lease (the reference client every third of it,
  from a thread of its own), so the lease only passes for a client that is no longer there.
- **idle**: the client sent no request other than HEARTBEAT for ``idle_timeout_s`` seconds. Its
  client is alive but has not used its envs for that long (a forgotten notebook, say).

A request counts as hearing from its client when it arrives and again when its reply is ready,
so a long env step never costs its own session the lease. The host reads the requests queued
behind a long one before it closes anyone's session for the lease (``EnvHost``), so neither
does it cost the other sessions theirs.
"""

from __future__ import annotations

import enum
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from envserver.errors import LimitError, ProtocolError, UnknownSessionError
from envserver.host.worker import EnvBlock
from envserver.wire.channel import Channel
from envserver.wire.messages import Command
from envserver.wire.raw import StepLayout

__all__ = ["Cached", "Eviction", "Session", "SessionTable"]

logger = logging.getLogger(__name__)


class Eviction(enum.Enum):
    """Why the host closed a session (the ``reason`` label of the evicted-sessions metric)."""

    LEASE = "lease"
    """Nothing heard from its client within the lease: the client is gone."""
    IDLE = "idle"
    """No request but HEARTBEAT within the idle timeout: the envs are not used."""


@dataclass(frozen=True)
class Cached:
    """A reply kept for a retry: the command it answered, its frames, whether it was OK."""

    command: Command
    frames: list[Any]
    ok: bool


@dataclass
class Session:
    """One client's state on this host.

    Attributes:
        session_id: The random token the client sends with every request.
        client: The client's label (for logs).
        pickle: Whether replies to this session may carry pickled values.
        said: Whether replies to this session carry what the envs said.
        block: The session's envs, once made.
        step_layout: How its steps travel raw (STEP_RAW), if its spaces allow it.
        last_used: When the last request other than HEARTBEAT came (monotonic seconds).
        last_heard: When the client was last heard from: a request came, or a reply was ready.
        retry_window: How many of its latest replies are kept for retries (MAKE's
            ``"retry_window"``; 1 before it).
        newest_id: The id of the newest request answered (None before the first).
        replies: The replies kept for retries, by request id, oldest first: the command they
            answered, the reply's frames, and whether it was OK (for metrics).
        warned: The warnings the session heard of (each once, see ``envserver.host.relay``).
        channels: The channels its client shares with this host, those it offered that the
            host took (:mod:`envserver.wire.channel`; ``SessionTable.attach``).
        overlap: Whether its steps and resets run on threads, overlapping
            (:mod:`envserver.host.overlap`; MAKE's ``"overlap"``).
        busy: The envs that requests under way on threads are for.
        running: The requests under way on threads, by id: where each reply goes.
        futures: Their futures, by id (closing the session waits for them).
    """

    session_id: bytes
    client: str
    pickle: bool
    said: bool = False
    block: EnvBlock | None = None
    step_layout: StepLayout | None = None
    last_used: float = field(default_factory=time.monotonic)
    last_heard: float = field(default_factory=time.monotonic)
    retry_window: int = 1
    newest_id: int | None = None
    replies: OrderedDict[int, Cached] = field(default_factory=OrderedDict)
    warned: set[tuple[str, str, str, int]] = field(default_factory=set)
    channels: list[Channel] = field(default_factory=list)
    overlap: bool = False
    busy: set[int] = field(default_factory=set)
    running: dict[int, list[Any]] = field(default_factory=dict)
    futures: dict[int, Future] = field(default_factory=dict)

    def touch(self, now: float, *, used: bool) -> None:
        """Records a request (``used``: one other than HEARTBEAT) or a reply made ready."""
        self.last_heard = now
        if used:
            self.last_used = now

    def envs(self) -> EnvBlock:
        """The session's envs.

        Raises:
            ProtocolError: If it has none yet.
        """
        if self.block is None:
            raise ProtocolError("this session has no envs yet: send MAKE first")
        return self.block

    def num_envs(self) -> int:
        """How many envs the session holds (what its requests' ``env_ids`` may address).

        Raises:
            ProtocolError: If it has none yet.
        """
        return self.envs().num_envs

    def cached(self, request_id: int, command: Command) -> Cached | None:
        """The reply kept for ``request_id`` if it was answered: a retry, answered from the cache.

        Args:
            request_id: The request's id.
            command: The request's command: a retry is the same request again.

        Returns:
            The kept reply, or None for a request not answered yet (a new one).

        Raises:
            ProtocolError: If it is older than the replies kept (request ids grow within a
                session: it was overtaken, abandoned by its client or a retry that lost the
                race, and running it now would apply it out of order, or twice), or if its
                command is not the one that id was answered for (a client that reused an id).
        """
        if self.newest_id is None or request_id > self.newest_id:
            return None
        kept = self.replies.get(request_id)
        if kept is None:
            raise ProtocolError(
                f"request {request_id} is older than the replies kept for retries (the newest "
                f"answered is {self.newest_id}, {len(self.replies)} kept): refused"
            )
        if kept.command is not command:
            raise ProtocolError(
                f"request {request_id} was answered for {kept.command.name}, and came again "
                f"as {command.name}: a retry must repeat its request; refused"
            )
        logger.info("request %s repeated: answering from the cache", request_id)
        return kept

    def answered(
        self,
        request_id: int,
        command: Command,
        reply: list[Any],
        ok: bool,
        now: float,
        *,
        late: bool = False,
    ) -> None:
        """Records a reply made ready, keeping it for a retry (the newest ``retry_window``).

        Its client counts as heard from now: a long request does not cost it the lease.
        """
        self.last_heard = now
        if self.newest_id is not None and request_id <= self.newest_id and not late:
            return  # a retry answered from the cache, or refused: nothing new to keep
        if self.newest_id is None or request_id > self.newest_id:  # (a late one: not newer)
            self.newest_id = request_id
        self.replies[request_id] = Cached(command, reply, ok)
        while len(self.replies) > self.retry_window:
            self.replies.popitem(last=False)


class SessionTable:
    """The open sessions of one host, with their limit, lease and idle timeout.

    Args:
        max_sessions: The most sessions open at once.
        lease_s: How long a session's client may stay unheard before its session is closed
            (0: no lease).
        idle_timeout_s: How long a session may go without a request other than HEARTBEAT
            before it is closed.

    Raises:
        ValueError: If the lease or the idle timeout is negative.
    """

    def __init__(self, max_sessions: int, lease_s: float, idle_timeout_s: float) -> None:
        if lease_s < 0 or idle_timeout_s < 0:
            raise ValueError(
                f"the session lease ({lease_s:g} s) and idle timeout ({idle_timeout_s:g} s) "
                "must not be negative"
            )
        self.max_sessions = max_sessions
        self.lease_s = float(lease_s)
        self.idle_timeout_s = float(idle_timeout_s)
        self._sessions: dict[bytes, Session] = {}
        #: The sessions' channels, by the pipe a client wakes this host through.
        self.channels: dict[int, Channel] = {}
        #: How many open sessions overlap their requests (see :meth:`overlap`).
        self.overlapping = 0

    def __len__(self) -> int:
        """The number of open sessions (also read by the metrics thread)."""
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        """The open sessions (a snapshot: sessions may be closed while iterating)."""
        return iter(list(self._sessions.values()))

    def open(self, client: str, pickle: bool, said: bool = False) -> Session:
        """Opens a session with a new random token (``said``: it hears what its envs say).

        Raises:
            LimitError: If ``max_sessions`` sessions are open already.
        """
        if len(self._sessions) >= self.max_sessions:
            raise LimitError(f"already serves {len(self._sessions)} sessions, its maximum")
        token = secrets.token_bytes(16)
        session = Session(session_id=token, client=client, pickle=pickle, said=said)
        self._sessions[session.session_id] = session
        logger.info(
            "session %s opened by %s",
            session.session_id.hex(),
            client,
            extra={"session": session.session_id.hex(), "client": client},
        )
        return session

    def get(self, session_id: bytes | None) -> Session | None:
        """The open session ``session_id`` names, if any (its client not counted as heard)."""
        return self._sessions.get(session_id or b"")

    def overlap(self, session: Session) -> None:
        """Makes ``session``'s steps and resets overlap (:mod:`envserver.host.overlap`)."""
        if not session.overlap:
            session.overlap = True
            self.overlapping += 1

    def of(self, session_id: bytes | None, *, used: bool) -> Session:
        """The open session a request names, its client heard from now.

        Args:
            session_id: The session id the request carries.
            used: Whether the request counts as using the session (HEARTBEAT does not).

        Raises:
            UnknownSessionError: If no such session is open.
        """
        session = self._sessions.get(session_id or b"")
        if session is None:
            named = session_id.hex() if session_id else "(the request names none)"
            raise UnknownSessionError(
                f"this host holds no session {named}: it may have restarted since "
                "the session was opened, or closed it (its lease or idle timeout passed)"
            )
        session.touch(time.monotonic(), used=used)
        return session

    def heard(self, session_id: bytes | None, now: float, *, used: bool) -> None:
        """Records a request of the session with this token, if it is open (see ``touch``)."""
        session = self._sessions.get(session_id or b"")
        if session is not None:
            session.touch(now, used=used)

    def attach(self, session: Session, channel: Channel) -> None:
        """Gives ``session`` a channel: the host serves its requests there too."""
        session.channels.append(channel)
        self.channels = {**self.channels, channel.fileno(): channel}  # a new map: a new poll

    def close(self, session: Session) -> None:
        """Forgets a session and closes its envs (an env that fails to close is logged)."""
        if self._sessions.pop(session.session_id, None) is not None and session.overlap:
            self.overlapping -= 1
        if session.futures:  # its requests under way on threads finish first
            wait(list(session.futures.values()))
        if session.channels:
            closed = session.channels
            self.channels = {fd: c for fd, c in self.channels.items() if c not in closed}
            for channel in closed:
                channel.close()
            session.channels = []
        if session.block is not None:
            session.block.close()
            session.block = None
        logger.info(
            "session %s closed",
            session.session_id.hex(),
            extra={"session": session.session_id.hex()},
        )

    def close_all(self) -> None:
        """Closes every session."""
        for session in self:
            self.close(session)

    def _blocks(self) -> list[EnvBlock]:
        """The sessions' envs (a copy: also read by the metrics thread while the host serves)."""
        return [s.block for s in list(self._sessions.values()) if s.block is not None]

    def envs_held(self) -> int:
        """Envs held by all sessions."""
        return sum(block.open_envs for block in self._blocks())

    def envs_on_threads(self) -> int:
        """Envs of the sessions that step them on threads now."""
        return sum(block.open_envs for block in self._blocks() if block.env_threads > 1)

    def expired(self, now: float) -> list[tuple[Session, Eviction]]:
        """The sessions to close at ``now``, and why (the lease comes first)."""
        found = []
        for session in list(self._sessions.values()):
            if self.lease_s and now - session.last_heard > self.lease_s:
                found.append((session, Eviction.LEASE))
            elif now - session.last_used > self.idle_timeout_s:
                found.append((session, Eviction.IDLE))
        return found

    def reap(self, now: float) -> list[Eviction]:
        """Closes the sessions expired at ``now``; returns why each was closed."""
        reasons = []
        for session, reason in self.expired(now):
            if reason is Eviction.LEASE:
                logger.warning(
                    "session %s of %s: nothing heard for %g s, its lease: its client is gone; "
                    "closing it",
                    session.session_id.hex(),
                    session.client,
                    self.lease_s,
                    extra={"session": session.session_id.hex(), "client": session.client},
                )
            else:
                logger.warning(
                    "session %s of %s idle for %g s: closing it",
                    session.session_id.hex(),
                    session.client,
                    self.idle_timeout_s,
                    extra={"session": session.session_id.hex(), "client": session.client},
                )
            self.close(session)
            reasons.append(reason)
        return reasons
