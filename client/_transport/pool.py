"""The host pool: every connection of one vector env, and the waits on their requests.

It owns the connections (in host order), the ZeroMQ poller over all their sockets and monitors
(built once, rebuilt only when a connection is replaced), sending one request to several hosts
(all or none), and the waits. A wait reads every reply that comes, for whichever request it
answers (each is taken into its own :class:`~.requests.Pending`), until the requests it waits
on are answered, a host that owes one of them failed, or its deadline passed.
It returns what happened and decides nothing: lockstep calls, first-ready batches and recovery
each decide what a failure means for them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import zmq

from envserver.errors import EnvServerError, WaitTimeoutError
from envserver.wire.bodies import RequestBody
from envserver.wire.messages import Command, Reply, Status
from envserver.wire.raw import StepLayout
from envserver.wire.replies import MakeReply

from .connection import HostConnection
from .hearing import Hearing
from .lease import Heartbeat
from .link import AWAIT_REPLY_MS
from .requests import Pending
from .settings import ConnectionSettings

__all__ = [
    "IN_ORDER_WAIT_S",
    "LIVENESS_CHECK_INTERVAL_S",
    "HostPool",
]

#: How often a long wait looks at the liveness of the hosts it waits on.
LIVENESS_CHECK_INTERVAL_S = 0.5
#: How long a wait receives host after host before it polls every host and watches their
#: liveness (see ``HostPool.wait_all``), at most.
IN_ORDER_WAIT_S = AWAIT_REPLY_MS / 1000

#: The commands whose reply arrays may be decoded as views (they are copied when merged).
_VIEW_COMMANDS = frozenset({Command.STEP, Command.RESET})

Requests = Iterable[tuple[HostConnection, Pending]]


class HostPool:
    """The connections to the hosts of one vector env.

    Args:
        context: The ZeroMQ context of the sockets.
        settings: How every connection behaves (bounds, trust, CURVE, shared memory).
        ids: Where request ids come from (the default counts from 1).
        heartbeat: Renews the lease of every session a connection holds, or None.
        hearing: Tells the trainer what the envs said, or None.
        process: For host ``index``, a callable that raises once that host's process is
            known to have exited (local hosts), or None.
        name: How messages name host ``index`` at ``endpoint`` (default: ``host ENDPOINT``).
    """

    def __init__(
        self,
        context: zmq.Context,
        settings: ConnectionSettings,
        *,
        ids: Iterator[int] | None = None,
        heartbeat: Heartbeat | None = None,
        hearing: Hearing | None = None,
        process: Callable[[int], Callable[[float], None] | None] = lambda index: None,
        name: Callable[[int, str], str] = lambda index, endpoint: f"host {endpoint}",
    ) -> None:
        self.context = context
        self.settings = settings
        self._ids = itertools.count(1) if ids is None else ids
        #: Renews the sessions' leases, and hears which hosts drain (None: none).
        self.heartbeat = heartbeat
        self._hearing = hearing
        self._process = process
        self._name = name
        self.connections: list[HostConnection] = []
        self._poller: zmq.Poller | None = None
        self._monitor_items: list[tuple[zmq.Socket, int]] = []  # built with _poller
        self._monitors: dict[zmq.Socket, HostConnection] = {}  # by monitor socket
        #: How steps travel raw, for the envs' spaces (see :meth:`use_layout`).
        self.step_layout: StepLayout | None = None

    # ------------------------------------------------------------- connections

    def open(
        self, index: int, endpoint: str, start: int, count: int, *, refused_fails: bool = False
    ) -> HostConnection:
        """A connection for host ``index`` (its envs ``start..start+count-1``), not yet in use.

        :meth:`install` puts it in host ``index``'s place (recovery tries it first).
        ``refused_fails``: a refused connection (nothing listens there) fails it at once (for
        a recovery, which then tries another host), rather than being waited on.

        Raises:
            HostUnavailableError: If its ``tcp://`` name does not resolve.
        """
        connection = HostConnection(
            self.context,
            endpoint,
            self.settings,
            start=start,
            count=count,
            ids=self._ids,
            process=self._process(index),
            heartbeat=self.heartbeat,
            hearing=self._hearing,
            name=self._name(index, endpoint),
            refused_fails=refused_fails,
        )
        connection.link.on_renew = self._forget_poller
        return connection

    def _forget_poller(self) -> None:
        """A connection's socket was replaced: the poller is built anew for the next wait."""
        self._poller = None

    def connect(self, index: int, endpoint: str, start: int, count: int) -> HostConnection:
        """Opens a connection for host ``index`` and puts it in its place (see :meth:`install`)."""
        connection = self.open(index, endpoint, start, count)
        self.install(index, connection)
        return connection

    def install(self, index: int, connection: HostConnection) -> HostConnection | None:
        """Puts ``connection`` in host ``index``'s place (or appends it as the next host).

        Returns:
            The connection it replaced (not closed: see :meth:`drop`), if any.
        """
        self._poller = None
        if index == len(self.connections):
            self.connections.append(connection)
            return None
        replaced, self.connections[index] = self.connections[index], connection
        return replaced

    def use_layout(
        self, made: Iterable[tuple[HostConnection, MakeReply]], layout: StepLayout | None
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
        connection.close_session_quietly()
        if connection in self.connections:
            self._poller = None
        connection.close()

    def close(self) -> None:
        """Closes every connection (their sessions are closed by the caller first)."""
        for connection in self.connections:
            connection.close()
        self.connections = []
        self._poller = None

    # ------------------------------------------------------------- requests

    def send(
        self,
        command: Command,
        body: Callable[[HostConnection], RequestBody | None],
        targets: Sequence[HostConnection] | None = None,
    ) -> dict[HostConnection, Pending]:
        """Sends one request to each target host: to all of them, or (on any error) to none.

        Args:
            command: The command.
            body: The request body for each connection.
            targets: The connections (default: all).

        Returns:
            The request sent to each connection, in host order.
        """
        requests = self.prepare(command, body, targets)
        self.transmit(requests.items())
        return requests

    def prepare(
        self,
        command: Command,
        body: Callable[[HostConnection], RequestBody | None],
        targets: Sequence[HostConnection] | None = None,
    ) -> dict[HostConnection, Pending]:
        """Encodes one request to each target host (default: all), sending nothing.

        Every request is encoded and checked before any is sent (:meth:`transmit`), so a call
        is sent to all of its hosts or to none.
        """
        targets = self.connections if targets is None else targets
        return dict(zip(targets, self.prepare_all(command, [(c, body(c)) for c in targets])))

    def prepare_all(
        self, command: Command, requests: Sequence[tuple[HostConnection, Any]]
    ) -> list[Pending]:
        """Encodes each ``(connection, body)`` request, sending nothing (see :meth:`prepare`)."""
        views = command in _VIEW_COMMANDS  # their arrays are copied on merge
        return [c.requests.prepare(command, body, views=views) for c, body in requests]

    @staticmethod
    def transmit(requests: Requests) -> None:
        """Sends the requests not sent yet, finishing what an interruption left.

        A call sends its requests with this once prepared, and again before it waits if an
        interruption (Ctrl-C) may have left some unsent, or a send or a receive half done
        (``RequestTracker.settle``).
        """
        for connection, pending in requests:
            if not pending.sent_at and pending.reply is None:
                connection.requests.transmit(pending)
            else:
                connection.requests.settle()

    def round_trip(
        self,
        command: Command,
        body: Callable[[HostConnection], RequestBody | None],
        timeout_s: float | None,
        targets: Sequence[HostConnection] | None = None,
    ) -> list[tuple[HostConnection, Any]]:
        """Sends one request to each target host, and returns each reply's body, in host order.

        Raises:
            As :meth:`gather`.
        """
        requests = self.send(command, body, targets)
        return [
            (connection, pending.reply.body)
            for connection, pending in self.gather(requests, timeout_s, command.name.lower())
        ]

    def on_envs(
        self,
        command: Command,
        body: Callable[[HostConnection, list[int]], RequestBody],
        env_ids: Sequence[int],
    ) -> tuple[Any, ...]:
        """Runs a per-env command on the hosts holding ``env_ids`` (distinct), each for its own.

        Args:
            command: The command.
            body: The request body for a host that addresses its envs given (indices in its
                block).
            env_ids: The envs.

        Returns:
            One result per entry of ``env_ids``, in that order.

        Raises:
            ProtocolError: If a host answers for other envs than it was asked about.
            Exception: As :meth:`gather`.
        """
        if not env_ids:
            return ()
        local = {
            c: sorted(i - c.block.start for i in env_ids if c.block.start <= i < c.block.stop)
            for c in self.connections
        }
        targets = [c for c in self.connections if local[c]]
        replies = self.round_trip(command, lambda c: body(c, local[c]), None, targets)
        found: dict[int, Any] = {}
        for connection, values in replies:
            values = [None] * len(local[connection]) if values is None else values
            if not isinstance(values, list) or len(values) != len(local[connection]):
                raise connection.invalid(f"{command.name} results for other envs than asked")
            found.update(zip((connection.block.start + i for i in local[connection]), values))
        return tuple(found[i] for i in env_ids)

    def gather(
        self,
        requests: Mapping[HostConnection, Pending],
        timeout_s: float | None,
        what: str,
    ) -> list[tuple[HostConnection, Pending]]:
        """Waits for the reply of every request, and raises what went wrong, in host order.

        Whatever happens, the requests are over afterwards: the replies of those not answered
        are dropped if they come.

        Args:
            requests: The request each host owes a reply to.
            timeout_s: Seconds to wait; None waits as long as the hosts are alive.
            what: The call waited for, for the timeout's message.

        Returns:
            The requests, answered OK, in host order.

        Raises:
            WaitTimeoutError: If not every reply came within ``timeout_s``.
            HostUnavailableError: If a host that owes a reply failed (and its kin: see
                ``HostConnection.check``).
            Exception: The first error a host reported (in host order), rebuilt.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            failure = self.wait_all(requests.items(), deadline, what, timeout_s)
        finally:
            self.forget(requests.items())
            self.tell()
        if failure is not None:
            raise failure
        for connection, pending in requests.items():
            if not pending.ok:
                raise connection.error(pending.reply)
        return list(requests.items())

    def ask(
        self,
        connection: HostConnection,
        command: Command,
        body: RequestBody | None,
        deadline: float,
    ) -> Reply:
        """Sends one request to one host and waits for its reply, until ``deadline``.

        The connection need not be in the pool (recovery tries connections before it puts one
        in place).

        Raises:
            WaitTimeoutError: At the deadline.
            HostUnavailableError: If the host failed (and its kin: see ``HostConnection.check``).
        """
        pending = connection.requests.send(command, body)
        return self.await_one(connection, pending, deadline, command.name)

    def ask_ok(
        self,
        connection: HostConnection,
        command: Command,
        body: RequestBody | None,
        deadline: float,
    ) -> Any:
        """:meth:`ask`, raising the host's error; returns the reply body."""
        reply = self.ask(connection, command, body, deadline)
        if reply.status == Status.ERROR:
            raise connection.error(reply)
        return reply.body

    def await_one(
        self, connection: HostConnection, pending: Pending, deadline: float, what: str
    ) -> Reply:
        """Waits for one request's reply from one host until ``deadline`` (:meth:`wait_any`).

        Raises:
            As :meth:`ask`.
        """
        bound_s = deadline - time.monotonic()
        try:
            failure = self.wait_any([(connection, pending)], deadline, what, bound_s)
        finally:
            connection.requests.outstanding.pop(pending.request_id, None)
            self.tell()
        if isinstance(failure, WaitTimeoutError):
            silent = f"{connection.block.name} did not answer {what} within {bound_s:.3g} s"
            raise WaitTimeoutError(silent)
        if failure is not None:
            raise failure
        return pending.reply

    def forget(self, requests: Requests) -> None:
        """Ends the requests not answered: their replies are dropped if they come."""
        for connection, pending in requests:
            connection.requests.outstanding.pop(pending.request_id, None)

    def tell(self) -> None:
        """Tells the trainer what the envs said in the replies received (see ``Hearing``)."""
        if self._hearing is not None:
            self._hearing.tell()

    # ------------------------------------------------------------- waits

    def wait_all(
        self,
        requests: Requests,
        deadline: float | None,
        what: str,
        timeout_s: float | None,
    ) -> EnvServerError | None:
        """Waits until every request is answered, or a host that owes a reply failed.

        The replies come at about the same time for a lockstep call: while each comes soon,
        they are received host after host (one blocking receive each, no poller, no liveness
        checks); the first that does not come within :data:`IN_ORDER_WAIT_S` leaves the rest
        to :meth:`wait_any`'s rounds, which watch every host's liveness.

        Returns:
            None once all are answered; else what ended the wait: the first failure found
            (``HostUnavailableError`` and its kin, taken after every reply that had come), or
            a ``WaitTimeoutError`` at the deadline.
        """
        requests = list(requests)
        if deadline is None or deadline - time.monotonic() > IN_ORDER_WAIT_S:
            for connection, pending in requests:
                if pending.reply is None and not connection.requests.await_reply(pending):
                    break
        while True:
            owed = [(c, p) for c, p in requests if p.reply is None]
            if not owed:
                return None
            failure = self.wait_any(owed, deadline, what, timeout_s)
            if failure is not None:
                return failure

    def wait_any(
        self,
        requests: Requests,
        deadline: float | None,
        what: str,
        timeout_s: float | None,
    ) -> EnvServerError | None:
        """Waits until some of the requests are answered, or a host that owes a reply failed.

        Every host waited on is checked on every round, so a host that keeps answering cannot
        hide the failure of another; and a failure is found only after the replies that came
        are taken, so none is lost for it. Replies for requests not waited on are taken into
        theirs all the same (another wait finds them there).

        Args:
            requests: The requests waited on, with their connections.
            deadline: ``time.monotonic()`` to give up at; None waits as long as hosts live.
            what: The call waited for, for the timeout's message.
            timeout_s: The timeout the deadline came from, for the timeout's message.

        Returns:
            None once one is answered (at once if one is); else the first failure found, or a
            ``WaitTimeoutError`` at the deadline.
        """
        requests = list(requests)
        watched, poller = self.connections, self._poller_of_all()
        if any(c not in watched for c, _ in requests):  # one a recovery tries, not yet in place
            watched = list(dict.fromkeys(c for c, _ in requests))
            poller = _poller_of(watched)
        wait_s = 0.0
        while True:
            if deadline is not None:
                wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
            self._collect(poller.poll(wait_s * 1000), watched)
            failure: EnvServerError | None = None
            answered = False
            for connection, pending in requests:
                if pending.reply is not None:
                    answered = True
                    continue
                try:
                    connection.check()
                except EnvServerError as exc:
                    failure = failure or exc
            if answered or failure is not None:
                return failure
            if deadline is not None and time.monotonic() >= deadline:
                return WaitTimeoutError(
                    f"The call to `{what}` has timed out after {timeout_s} second(s)."
                )
            wait_s = LIVENESS_CHECK_INTERVAL_S

    def _collect(self, events: list[tuple[Any, int]], watched: list[HostConnection]) -> None:
        """Reads what a poll of ``watched`` found: monitor events, every ready socket's replies."""
        if not events:
            return
        ready = {socket for socket, _ in events}
        for connection in watched:
            link, requests = connection.link, connection.requests
            if link.monitor in ready:
                requests.read_events()
            if link.socket in ready:
                requests.receive()

    def _poller_of_all(self) -> zmq.Poller:
        """One poller of every connection's socket and monitor, built once per set of them."""
        if self._poller is None:
            self._poller = _poller_of(self.connections)
            self._monitors = {c.link.monitor: c for c in self.connections}
            self._monitor_items = [(monitor, zmq.POLLIN) for monitor in self._monitors]
        return self._poller

    def read_monitors(self) -> None:
        """Takes in the monitor events of every connection: one poll of all monitors.

        Cheaper than asking each monitor (a call into libzmq each), and than a ``zmq.Poller``
        (a Python call that builds its items anew); a lean step does it once before its sends,
        so that a loss already reported is not dated after them.
        """
        if self._poller is None:
            self._poller_of_all()
        for socket, _ in zmq.zmq_poll(self._monitor_items, 0):
            self._monitors[socket].requests.read_events()


def _poller_of(connections: list[HostConnection]) -> zmq.Poller:
    """A poller of the connections' sockets and monitors."""
    poller = zmq.Poller()
    for connection in connections:
        poller.register(connection.link.socket, zmq.POLLIN)
        poller.register(connection.link.monitor, zmq.POLLIN)
    return poller
