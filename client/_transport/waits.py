"""The two waits on a host pool's requests, any and all, over one poller of all its hosts.

A wait reads every reply that comes, for whichever request it answers (each is taken into its
own :class:`~.requests.Pending`), until the requests it waits on are answered, a host that owes
one of them failed, or its deadline passed. It returns what happened and decides nothing:
lockstep calls, first-ready batches and recovery each decide what a failure means for them.

:class:`Waits` owns the ZeroMQ poller over every connection's socket and monitor: built once,
rebuilt only when a connection is replaced (:meth:`Waits.forget_poller`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import zmq

from envserver.errors import EnvServerError, WaitTimeoutError

from .connection import HostConnection
from .link import AWAIT_REPLY_MS
from .requests import Pending

__all__ = ["IN_ORDER_WAIT_S", "LIVENESS_CHECK_INTERVAL_S", "Requests", "Waits"]

#: How often a long wait looks at the liveness of the hosts it waits on.
LIVENESS_CHECK_INTERVAL_S = 0.5
#: How long a wait receives host after host before it polls every host and watches their
#: liveness (see ``Waits.all``), at most.
IN_ORDER_WAIT_S = AWAIT_REPLY_MS / 1000

#: Requests waited on, each with the connection that owes its reply.
Requests = Iterable[tuple[HostConnection, Pending]]


class Waits:
    """The waits on the requests of one pool's connections (see the module docstring).

    Args:
        connections: The pool's connections, in host order: the pool's own list, which it
            changes in place (and then calls :meth:`forget_poller`); read here, never changed.
    """

    def __init__(self, connections: list[HostConnection]) -> None:
        self._connections = connections
        self._poller: zmq.Poller | None = None
        self._monitor_items: list[tuple[zmq.Socket, int]] = []  # built with _poller
        self._monitors: dict[zmq.Socket, HostConnection] = {}  # by monitor socket

    def forget_poller(self) -> None:
        """The connections or a socket of theirs changed: the poller is built anew when used."""
        self._poller = None

    def all(
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
        to :meth:`any`'s rounds, which watch every host's liveness.

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
            failure = self.any(owed, deadline, what, timeout_s)
            if failure is not None:
                return failure

    def any(
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
        watched, poller = self._connections, self._poller_of_all()
        if [c for c, _ in requests if c not in watched]:  # one a recovery tries, not in place
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

    def _collect(self, events: list[tuple[Any, int]], watched: list[HostConnection]) -> None:
        """Reads what a poll of ``watched`` found: monitor events, every ready socket's replies."""
        if not events:
            return
        ready = {socket for socket, _ in events}
        for connection in watched:
            link, requests = connection.link, connection.requests
            if link.monitor in ready:
                requests.read_events()
            posted = False
            for channel in requests.channels:
                if channel.fileno() in ready:
                    channel.drain()
                    posted = True
            if posted or link.socket in ready:
                requests.receive()

    def _poller_of_all(self) -> zmq.Poller:
        """One poller of every connection's socket and monitor, built once per set of them."""
        if self._poller is None:
            connections = self._connections
            self._poller = _poller_of(connections)
            self._monitors = {c.link.monitor: c for c in connections}
            self._monitor_items = [(monitor, zmq.POLLIN) for monitor in self._monitors]
        return self._poller


def _poller_of(connections: list[HostConnection]) -> zmq.Poller:
    """A poller of the connections' sockets, monitors and channels."""
    poller = zmq.Poller()
    for connection in connections:
        poller.register(connection.link.socket, zmq.POLLIN)
        poller.register(connection.link.monitor, zmq.POLLIN)
        for channel in connection.requests.channels:
            poller.register(channel.fileno(), zmq.POLLIN)
    return poller
