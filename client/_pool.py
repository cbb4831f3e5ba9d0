"""The host pool: every connection of one vector env, and the one place replies are collected.

It owns the connections (in host order), the ZeroMQ poller over all their sockets and monitors
(built once, rebuilt only when a connection is replaced), sending one request to several hosts
(all or none), and :meth:`HostPool.poll`, the reply collector every wait goes through: lockstep
waits, first-ready batches and recovery alike. A reply that comes for a connection nobody is
waiting on at that moment is kept for the next wait that asks for it, never dropped.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import zmq

from envserver.errors import (
    EnvServerError,
    HostUnavailableError,
    RequestTimeoutError,
    WaitTimeoutError,
)
from envserver.wire.messages import Command, Reply, Status
from envserver.wire.raw import StepLayout

from ._connection import AWAIT_REPLY_MS, HostConnection
from ._results import Request

__all__ = [
    "CLOSE_FLUSH_MS",
    "IN_ORDER_WAIT_S",
    "LIVENESS_CHECK_INTERVAL_S",
    "HostPool",
    "Recoverer",
]

#: How often a long wait looks at the liveness of the hosts it waits on.
LIVENESS_CHECK_INTERVAL_S = 0.5
#: How long a wait receives host after host before it polls every host and watches their
#: liveness (see ``HostPool._in_order``), at most.
IN_ORDER_WAIT_S = AWAIT_REPLY_MS / 1000
#: How long a session close sent without waiting may take to leave, at most.
CLOSE_FLUSH_MS = 500

#: The commands whose reply arrays may be decoded as views (they are copied when merged).
_VIEW_COMMANDS = frozenset({Command.STEP, Command.RESET})


class Recoverer(Protocol):
    """Brings back a host that failed while it owed a reply, for :meth:`HostPool.gather`."""

    def recoverable(self, command: Command) -> bool:
        """Whether a host failing during ``command`` is brought back now."""

    def recover(self, failed: HostConnection, request: Request) -> tuple[HostConnection, Reply]:
        """Brings ``failed`` back; returns the new connection and the reply to ``request``."""


class HostPool:
    """The connections to the hosts of one vector env.

    Args:
        context: The ZeroMQ context of the sockets.
        options: Keyword arguments for every :class:`HostConnection` (timeouts, CURVE keys,
            pickle, request ids, heartbeat).
        liveness: For host ``index``, a callable that raises if that host's process is known
            to have exited (local hosts), or None.
        name: How messages name host ``index`` at ``endpoint`` (default: ``host ENDPOINT``).
    """

    def __init__(
        self,
        context: zmq.Context,
        options: dict[str, Any],
        liveness: Callable[[int], Callable[[float], None] | None] = lambda index: None,
        name: Callable[[int, str], str] = lambda index, endpoint: f"host {endpoint}",
    ) -> None:
        self.context = context
        self.options = options
        self._name = name
        self.connections: list[HostConnection] = []
        self._liveness = liveness
        self._poller: zmq.Poller | None = None
        self._monitor_poller: zmq.Poller | None = None  # built with _poller
        self._monitors: dict[zmq.Socket, HostConnection] = {}  # by monitor socket
        self._early: dict[HostConnection, list[Reply]] = {}  # replies no wait has asked for yet
        #: How steps travel raw, for the envs' spaces (see :meth:`use_layout`).
        self.step_layout: StepLayout | None = None

    # ------------------------------------------------------------- connections

    def connect(self, index: int, endpoint: str, start: int, count: int) -> HostConnection:
        """Opens a connection for host ``index`` (its envs ``start..start+count-1``).

        It takes host ``index``'s place in :attr:`connections` (or is appended as the next);
        the connection it replaces, if any, is not closed (see :meth:`drop`).

        Raises:
            HostUnavailableError: If its ``tcp://`` name does not resolve.
        """
        connection = HostConnection(
            self.context,
            endpoint,
            start=start,
            count=count,
            liveness=self._liveness(index),
            name=self._name(index, endpoint),
            **self.options,
        )
        if index == len(self.connections):
            self.connections.append(connection)
        else:
            self.connections[index] = connection
        self._poller = None
        return connection

    def use_layout(
        self, made: Iterable[tuple[HostConnection, Any]], layout: StepLayout | None
    ) -> None:
        """Sets the step layout of the envs' spaces, and each host's from its MAKE reply.

        Args:
            made: Connections and their MAKE replies (a host made anew later takes
                :attr:`step_layout` itself: ``HostConnection.use_layout``).
            layout: The layout the vector env's single spaces have (None: none).
        """
        self.step_layout = layout
        for connection, reply in made:
            connection.use_layout(reply, layout)

    def drop(self, connection: HostConnection) -> None:
        """Closes a connection given up on, asking its host to close the session (no wait)."""
        self.close_session_quietly(connection)
        self._early.pop(connection, None)
        self._poller = None
        connection.close()

    @staticmethod
    def close_session_quietly(connection: HostConnection) -> None:
        """Asks a live connection's host to close its session, without waiting for the reply.

        The request gets :data:`CLOSE_FLUSH_MS` to leave once the connection is closed.
        """
        if connection.session is not None and connection.failed is None:
            with contextlib.suppress(Exception):
                connection.send(Command.CLOSE, None)
                connection.linger_ms = CLOSE_FLUSH_MS

    def close(self) -> None:
        """Closes every connection (their sessions are closed by the caller first)."""
        for connection in self.connections:
            connection.close()
        self.connections = []
        self._early.clear()
        self._poller = None

    # ------------------------------------------------------------- requests

    def send(
        self,
        command: Command,
        body: Callable[[HostConnection], Any],
        targets: Sequence[HostConnection] | None = None,
    ) -> dict[HostConnection, Request]:
        """Sends one request to each target host: to all of them, or (on any error) to none.

        Args:
            command: The command.
            body: The request body for each connection.
            targets: The connections (default: all).

        Returns:
            The request sent to each connection.
        """
        targets = self.connections if targets is None else targets
        requests = [(connection, body(connection)) for connection in targets]
        ids = self.send_all(command, requests)
        return {
            connection: Request(request_id, command, request)
            for (connection, request), request_id in zip(requests, ids)
        }

    def send_all(
        self, command: Command, requests: Sequence[tuple[HostConnection, Any]]
    ) -> list[int]:
        """Sends each ``(connection, body)`` request: all of them, or (on any error) none.

        Every request is encoded (and checked) before any is sent.

        Returns:
            The request ids, in the order of ``requests``.
        """
        views = command in _VIEW_COMMANDS  # their arrays are copied on merge
        prepared = [(c, c.prepare(command, request)) for c, request in requests]
        return [connection.transmit(frames, views=views) for connection, frames in prepared]

    def round_trip(
        self,
        command: Command,
        body: Callable[[HostConnection], Any],
        timeout_s: float | None,
        targets: Sequence[HostConnection] | None = None,
    ) -> list[tuple[HostConnection, Any]]:
        """Sends one request to each target host and waits for every reply (see :meth:`gather`)."""
        return self.gather(self.send(command, body, targets), timeout_s, command.name.lower())

    def gather(
        self,
        pending: dict[HostConnection, Request],
        timeout_s: float | None,
        what: str,
        recoverer: Recoverer | None = None,
        deadline: float | None = None,
    ) -> list[tuple[HostConnection, Any]]:
        """Waits for the reply of every pending request, in host order.

        A wait that fails abandons the requests: their replies are dropped if they come. A host
        that fails (or says it lost the envs) while it owes a reply is brought back by the
        ``recoverer`` if it may, and the request answered by the recovered host.

        Args:
            pending: The request each host owes a reply to (as :meth:`send` returned them).
            timeout_s: Seconds to wait; None waits as long as the hosts are alive.
            what: The call waited for, for the timeout's message.
            recoverer: Brings back failed hosts; None: a failure raises.
            deadline: ``time.monotonic()`` to give up at, for a wait that began before this
                call (default: ``timeout_s`` from now).

        Returns:
            Each host's connection and reply body, in host order.

        Raises:
            WaitTimeoutError: If not every reply came within ``timeout_s``.
            HostUnavailableError: If a host that owes a reply failed (and was not recovered).
            Exception: The first error a host reported (in host order), rebuilt.
        """
        replies: dict[HostConnection, Reply] = {}
        if deadline is None and timeout_s is not None:
            deadline = time.monotonic() + timeout_s

        def recoverable(connection: HostConnection) -> bool:
            return recoverer is not None and recoverer.recoverable(pending[connection].command)

        def recover(connection: HostConnection) -> None:
            nonlocal pending
            new, replies[new] = recoverer.recover(connection, pending[connection])
            pending = {(new if c is connection else c): r for c, r in pending.items()}

        def take(connection: HostConnection, reply: Reply) -> None:
            if reply.request_id != pending[connection].request_id:
                return
            lost = connection.lost(reply)
            if lost is not None and recoverable(connection):
                connection.failed = lost
                recover(connection)
            else:
                replies[connection] = reply

        try:
            if deadline is None or deadline - time.monotonic() > IN_ORDER_WAIT_S:
                self._in_order(pending, take)
            while len(replies) < len(pending):
                # All of them, answered or not: one set of sockets for the whole wait.
                polled, failure = self.poll(pending, deadline, what, timeout_s)
                for connection, reply in polled:
                    take(connection, reply)
                if failure is not None:
                    failed = [c for c in pending if c.failed is not None and c not in replies]
                    if not failed or not recoverable(failed[0]):
                        raise failure
                    for connection in failed:
                        recover(connection)
        finally:
            for connection in pending:
                connection.abandon()
            self.tell()
        results = []
        for connection in pending:
            reply = replies[connection]
            if reply.status == Status.ERROR:
                raise connection.error(reply)
            results.append((connection, reply.body))
        return results

    def _in_order(
        self,
        pending: dict[HostConnection, Request],
        take: Callable[[HostConnection, Reply], None],
    ) -> None:
        """Receives the replies of ``pending`` host after host, while each comes soon.

        The cheapest wait when the replies come at about the same time, as a lockstep step's
        do: one blocking receive per host, no poller, no liveness checks. It stops at the first
        host whose reply does not come within :data:`IN_ORDER_WAIT_S` (the socket's receive
        timeout, ``AWAIT_REPLY_MS``), and leaves the rest to the poll loop, which watches
        every host's liveness.
        """
        if self._early:
            return  # replies taken in earlier: the poll loop hands them out
        for connection in list(pending):
            reply = connection.await_reply()
            if reply is None:
                return
            take(connection, reply)

    def ask(
        self,
        connection: HostConnection,
        command: Command,
        body: Any,
        deadline: float,
        request_id: int | None = None,
    ) -> Reply:
        """Sends one request to one host and waits for its reply, until ``deadline``."""
        request_id = connection.send(command, body, request_id=request_id)
        try:
            while True:
                polled, failure = self.poll([connection], deadline, command.name, None)
                for _, reply in polled:
                    if reply.request_id == request_id:
                        return reply
                if failure is not None:
                    raise failure
        finally:
            connection.abandon()
            self.tell()

    def ask_ok(
        self, connection: HostConnection, command: Command, body: Any, deadline: float
    ) -> Any:
        """:meth:`ask`, raising the host's error; returns the reply body."""
        reply = self.ask(connection, command, body, deadline)
        if reply.status == Status.ERROR:
            raise connection.error(reply)
        return reply.body

    def tell(self) -> None:
        """Tells the trainer what the envs said in the replies received (see ``Hearing``)."""
        hearing = self.options.get("hearing")
        if hearing is not None:
            hearing.tell()

    # ------------------------------------------------------------- the reply collector

    def poll(
        self,
        connections: Iterable[HostConnection],
        deadline: float | None,
        what: str,
        timeout_s: float | None,
    ) -> tuple[list[tuple[HostConnection, Reply]], EnvServerError | None]:
        """Waits until some of ``connections`` have replies or have failed.

        Every host waited on is checked on every round, so a host that keeps answering cannot
        hide the failure of another; and a failure never makes the replies already received
        be dropped: both are returned, for the caller to take in the replies first.

        Args:
            connections: The connections waited on.
            deadline: ``time.monotonic()`` to give up at; None waits as long as hosts live.
            what: The call waited for, for the timeout's message.
            timeout_s: The timeout the deadline came from, for the timeout's message.

        Returns:
            The replies, and the first failure found (``HostUnavailableError`` or
            ``RequestTimeoutError``), if any.

        Raises:
            WaitTimeoutError: At the deadline, with neither replies nor failures.
        """
        waited = list(connections)
        replies = [(c, reply) for c in waited for reply in self._early.pop(c, ())]
        waited_set = set(waited)
        while True:
            wait_s = 0.0 if replies else LIVENESS_CHECK_INTERVAL_S
            if deadline is not None:
                wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
            replies += self._collect(self._poller_of_all().poll(wait_s * 1000), waited_set)
            failure: EnvServerError | None = None
            for connection in waited:
                if not connection.outstanding:
                    continue  # it owes nothing (it may just have answered all it owed)
                try:
                    connection.check()
                except (HostUnavailableError, RequestTimeoutError) as exc:
                    failure = failure or exc
            if replies or failure is not None:
                return replies, failure
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(
                    f"The call to `{what}` has timed out after {timeout_s} second(s)."
                )

    def _collect(
        self, events: list[tuple[Any, int]], waited: set[HostConnection]
    ) -> list[tuple[HostConnection, Reply]]:
        """Reads what the poll found: monitor events, and the replies of every socket ready.

        Replies for connections not waited on are kept for a later wait; late replies to
        abandoned requests are read and dropped (they would wake every poll).
        """
        if not events:
            return []
        ready = {socket for socket, _ in events}
        replies = []
        for connection in self.connections:
            if connection.monitor in ready:
                connection.read_events()
            if connection.socket in ready:
                received = connection.receive()
                if connection in waited:
                    replies += [(connection, reply) for reply in received]
                elif received:
                    self._early.setdefault(connection, []).extend(received)
        return replies

    def _poller_of_all(self) -> zmq.Poller:
        """One poller of every connection's socket and monitor, built once per set of them."""
        if self._poller is None:
            self._poller, self._monitor_poller = zmq.Poller(), zmq.Poller()
            self._monitors = {}
            for connection in self.connections:
                self._poller.register(connection.socket, zmq.POLLIN)
                self._poller.register(connection.monitor, zmq.POLLIN)
                self._monitor_poller.register(connection.monitor, zmq.POLLIN)
                self._monitors[connection.monitor] = connection
        return self._poller

    def read_monitors(self) -> None:
        """Takes in the monitor events of every connection: one poll of all monitors.

        Cheaper than asking each monitor (a call into libzmq each); a lean step does it once
        before its sends, so that a loss already reported is not dated after them.
        """
        self._poller_of_all()
        for socket, _ in self._monitor_poller.poll(0):
            self._monitors[socket].read_events()

    @property
    def has_early(self) -> bool:
        """Whether replies no wait asked for yet are kept (a wait must then poll for them)."""
        return bool(self._early)

    def keep(self, connection: HostConnection, reply: Reply) -> None:
        """Keeps a reply received outside a wait, for the next wait on ``connection``."""
        self._early.setdefault(connection, []).append(reply)
