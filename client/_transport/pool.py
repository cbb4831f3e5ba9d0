"""The host pool: every connection of one vector env, and the calls sent to them.

It owns the connections (in host order) and sends one request to several hosts (all or none);
its waits (:class:`~.waits.Waits`: the two waits, any and all, and the one poller over every
connection's socket and monitor) read the replies. A wait returns what happened and decides
nothing: lockstep calls, first-ready batches and recovery each decide what a failure means for
them; the pool's calls that wait (:meth:`HostPool.gather`, :meth:`HostPool.ask`) raise it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import zmq

from envserver.errors import WaitTimeoutError
from envserver.wire.bodies import RequestBody
from envserver.wire.messages import Command, Reply, Status
from envserver.wire.raw import StepLayout
from envserver.wire.replies import MakeReply

from .connection import HostConnection
from .hearing import Hearing
from .lease import Heartbeat
from .requests import Pending
from .settings import ConnectionSettings
from .waits import Requests, Waits

__all__ = ["HostPool"]

#: The commands whose reply arrays may be decoded as views (they are copied when merged).
_VIEW_COMMANDS = frozenset({Command.STEP, Command.RESET})


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
        #: The connections, in host order (changed in place: :attr:`waits` reads this list).
        self.connections: list[HostConnection] = []
        #: The waits on the connections' requests, and their poller.
        self.waits = Waits(self.connections)
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
        connection.link.on_renew = self.waits.forget_poller  # a new socket: a stale poller
        return connection

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
        self.waits.forget_poller()
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
        self.waits.forget_poller()  # their channels are polled too

    def drop(self, connection: HostConnection) -> None:
        """Closes a connection given up on, asking its host to close the session (no wait)."""
        connection.close_session_quietly()
        if connection in self.connections:
            self.waits.forget_poller()
        connection.close()

    def close(self) -> None:
        """Closes every connection (their sessions are closed by the caller first)."""
        for connection in self.connections:
            connection.close()
        self.connections.clear()
        self.waits.forget_poller()

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
            failure = self.waits.all(requests.items(), deadline, what, timeout_s)
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
        """Waits for one request's reply from one host until ``deadline`` (``Waits.any``).

        Raises:
            As :meth:`ask`.
        """
        bound_s = deadline - time.monotonic()
        try:
            failure = self.waits.any([(connection, pending)], deadline, what, bound_s)
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
