"""Requests that overlap: the steps and resets of a session that asked for it, run on threads.

A session made with MAKE's ``"overlap"`` (an agent-loop pool's: its envs belong to rollouts
that each go at their own pace, and a step may wait seconds) has its STEP and RESET requests
run on threads while the host's loop goes on with other requests: a step of some envs never
waits for a step of others. Their replies are sent as they finish, so a connection's replies
to such requests may come out of the order it sent them (each carries its request's id).

The envs a request names are *busy* until its reply is ready: a request that names a busy env,
or names none while some are busy, is refused (``ProtocolError``) and runs nothing; so no env
is touched by two requests at once. MAKE with ``"add"`` and HEARTBEAT go on as ever. A retry
of a request still running gets its reply too, once it is ready. What the envs say during such
a request goes with its reply, as for any request (collected on its own threads: see
``Relay``), but for native code's output, which goes to the host's log.

The loop hands a prepared request to :meth:`Overlap.start`, polls :attr:`Overlap.waker` with
its socket, and sends what :meth:`Overlap.finished` returns.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envserver.errors import ProtocolError
from envserver.host.service import CommandService, Prepared
from envserver.host.sessions import Session
from envserver.wire.messages import Command

__all__ = ["Overlap"]

logger = logging.getLogger(__name__)

#: The commands run on threads for a session that overlaps.
OVERLAPPING = frozenset({Command.STEP, Command.RESET})
#: The commands of a session that may run while some of its envs are busy (they name none).
ALONGSIDE = frozenset({Command.HEARTBEAT, Command.MAKE})


class Overlap:
    """The requests of overlapping sessions under way on threads, and their finished replies.

    Args:
        service: Runs the requests (``CommandService.execute``) and keeps their replies.
        max_threads: The most requests run at once, all sessions together.
    """

    def __init__(self, service: CommandService, max_threads: int) -> None:
        self._service = service
        self._max_threads = max_threads
        self._pool: ThreadPoolExecutor | None = None  # made with the first request
        self._done: queue.SimpleQueue[Prepared] = queue.SimpleQueue()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        #: How many requests are under way.
        self.running = 0

    @property
    def waker(self) -> socket.socket:
        """What the loop polls: it gets a byte when a request finished (the loop takes it)."""
        return self._wake_reader

    @staticmethod
    def takes(prepared: Prepared) -> bool:
        """Whether ``prepared`` runs on a thread (a STEP or RESET of an overlapping session)."""
        session = prepared.session
        return (
            prepared.reply is None
            and session is not None
            and session.overlap
            and prepared.command in OVERLAPPING
        )

    @staticmethod
    def refusal(prepared: Prepared) -> ProtocolError | None:
        """Why ``prepared`` may not run now: it names a busy env (None: it may)."""
        session = prepared.session
        if (
            prepared.reply is not None
            or session is None
            or not session.busy
            or prepared.command in ALONGSIDE
        ):
            return None
        named = _env_ids(prepared)
        if named is None and prepared.command is Command.CLOSE:
            return None  # the session: closed once its requests under way are done
        if named is None:
            return ProtocolError(
                f"envs {sorted(session.busy)} of this session have requests under way: a "
                "request for every env must wait for their replies"
            )
        busy = [i for i in named if i in session.busy]
        if busy:
            return ProtocolError(f"env {busy[0]} of this session has a request under way")
        return None

    def retry(self, session: Session, request_id: int | None, to: Any) -> bool:
        """Whether ``request_id`` is under way: its reply then goes to ``to`` as well."""
        destinations = session.running.get(request_id)
        if destinations is None:
            return False
        destinations.append(to)
        return True

    def start(self, prepared: Prepared, to: Any) -> None:
        """Runs ``prepared`` on a thread; its reply will go to ``to`` (see :meth:`finished`)."""
        session = prepared.session
        named = _env_ids(prepared)
        envs = range(session.num_envs()) if named is None else named
        prepared.busy = frozenset(envs)
        session.busy |= prepared.busy
        session.running[prepared.request_id] = [to]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._max_threads, "envserver-request")
        self.running += 1
        session.futures[prepared.request_id] = self._pool.submit(self._run, prepared)

    def _run(self, prepared: Prepared) -> None:
        started = time.perf_counter()
        try:
            self._service.execute(prepared, alone=False)
            self._service.count(prepared, time.perf_counter() - started)
        finally:
            self._done.put(prepared)
            with contextlib.suppress(OSError):  # full: a wake-up is waiting already
                self._wake_writer.send(b"\0")

    def finished(self) -> Iterable[tuple[list[Any], list[Any]]]:
        """The replies ready: each with where it goes (its sender, and any retry's)."""
        while True:
            try:
                prepared = self._done.get_nowait()
            except queue.Empty:
                return
            self.running -= 1
            session = prepared.session
            session.busy -= prepared.busy
            self._service.record(prepared, late=True)
            session.futures.pop(prepared.request_id, None)
            destinations = session.running.pop(prepared.request_id, [])
            yield destinations, prepared.reply

    def close(self) -> None:
        """Waits for the requests under way, and frees the threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._wake_reader.close()
        self._wake_writer.close()


def _env_ids(prepared: Prepared) -> list[int] | None:
    """The envs a request names (None: all, or none readable: the handler says what is wrong)."""
    body = prepared.request.body if prepared.request is not None else None
    ids = body.get("env_ids") if isinstance(body, dict) else None
    if isinstance(ids, list) and all(type(i) is int for i in ids):
        return ids
    return None
