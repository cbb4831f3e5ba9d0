"""The in-flight engine: every request under way of one vector env, and where its failures go.

Both call styles send through it, wait on it and recover through it; nothing else differs
between them. A lockstep call sends one request to each host and waits for all of them
(``every=True``); a first-ready batch sends sub-batches and waits for any. Each request under
way is one record here, from its send until its caller takes it out: its
:class:`~._transport.requests.Pending` (the request and, once it came, its reply) and its
:class:`Flight` (the host, the envs, what it asked).

A failure verdict, from a wait or found before a call, comes to one place:
:meth:`InFlight.recover_failed`, which hands each failed host to the recovery policy
(``Recovery.recover``: resume, else restore, else re-make) with its requests under way, and
puts what answers each one in its place. The caller says only what stands for a request whose
envs were re-made (the report of a lost step, a reset sent again): that is a matter of what its
results cover, not of the policy. A drain's move is the same for both (:meth:`move_draining`).
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

from envserver.errors import EnvServerError
from envserver.wire.messages import Command

from ._recovery import Recovery
from ._transport.connection import HostConnection
from ._transport.error_replies import loss_of
from ._transport.pool import HostPool
from ._transport.requests import Flight, Pending

__all__ = ["Face", "InFlight"]


class Face(abc.ABC):
    """A call style, as the engine sees it when one of its hosts is recovered."""

    @abc.abstractmethod
    def remade(self, new: HostConnection, pending: Pending, flight: Flight) -> Pending | None:
        """What stands for a request whose envs were re-made on ``new``.

        Returns:
            A request under way on ``new``, or None: the face took the flight out itself, with
            its envs' results (the report of their loss).
        """

    def landed(self, flights: list[Flight]) -> None:
        """Notes that ``flights`` left the engine unanswered (their host was not recovered).

        By default nothing: a call whose host was not recovered ends.
        """
        return None

    def given(self, connection: HostConnection) -> Any:
        """The observations of ``connection``'s envs the trainer received last.

        None (the default): those it was given, which a restore checks against.
        """
        return None


class InFlight:
    """The requests under way of one vector env (see the module docstring).

    Args:
        pool: The hosts.
        recovery: The one recovery policy.
    """

    def __init__(self, pool: HostPool, recovery: Recovery) -> None:
        self._pool = pool
        self._recovery = recovery
        #: The requests under way, in the order sent (a recovered one keeps its place).
        self.flights: dict[Pending, Flight] = {}
        #: Whether an exception interrupted a send or a wait: the next wait finishes both.
        self.interrupted = False

    def prepare(self, flights: Sequence[Flight]) -> list[Pending]:
        """Encodes a request for each flight, all before any is sent, and keeps them under way.

        They leave with :meth:`transmit`: a call is sent to all of its hosts or to none.

        Raises:
            HostUnavailableError: If a host has failed (nothing is kept).
            MessageTooLargeError: If a request is over its host's bound (nothing is kept).
        """
        if not flights:
            return []
        prepared = self._pool.prepare_all(
            flights[0].command, [(flight.connection, flight.body) for flight in flights]
        )
        self.flights.update(zip(prepared, flights))
        return prepared

    def transmit(self, requests: Iterable[Pending]) -> None:
        """Sends ``requests`` (prepared, under way here), after one read of every host's monitor.

        The monitors first, so that a loss already reported is not dated after the sends. An
        interrupted send is finished by the wait.
        """
        try:
            self._pool.waits.read_monitors()
            now, flights = time.monotonic(), self.flights
            for pending in requests:
                flights[pending].connection.requests.transmit(pending, now)
        except BaseException:
            self.interrupted = True
            raise

    def pairs(self) -> list[tuple[HostConnection, Pending]]:
        """Every request under way with its connection, in order."""
        return [(flight.connection, pending) for pending, flight in self.flights.items()]

    def wait(
        self, every: bool, deadline: float | None, what: str, timeout_s: float | None
    ) -> EnvServerError | None:
        """Waits until every request (``every``) or some request is answered, or a host failed.

        First it finishes what an interrupted send or wait left. It decides nothing: it returns
        the wait's verdict (see ``Waits.all`` and ``Waits.any``), and any exception
        that interrupts it leaves the requests under way (:attr:`interrupted`).
        """
        pool = self._pool
        try:
            if self.interrupted:
                pool.transmit(self.pairs())
                self.interrupted = False
            wait = pool.waits.all if every else pool.waits.any
            return wait(self.pairs(), deadline, what, timeout_s)
        except BaseException:
            self.interrupted = True
            raise

    def of(self, connection: HostConnection) -> list[Pending]:
        """The requests under way to ``connection``, in order."""
        return [
            pending for pending, flight in self.flights.items() if flight.connection is connection
        ]

    def recover_failed(self, what: str, face: Face) -> bool:
        """Recovers every host that failed or said it lost the envs: where every verdict goes.

        A host that said so (its reply is the loss of our session) fails here. Each is
        recovered with its requests under way (:meth:`recover`), also one that failed with
        none (between calls, or owing nothing to this call).

        Returns:
            Whether there was any.

        Raises:
            Exception: The first reason a host could not be brought back, once every one was
                tried.
        """
        failed = {c: None for c in self._pool.connections if c.health.failure is not None}
        for pending, flight in self.flights.items():
            if pending.reply is not None and (lost := loss_of(pending.reply)) is not None:
                flight.connection.health.fail(lost)
                failed[flight.connection] = None
            elif flight.connection.health.failure is not None:
                failed[flight.connection] = None
        error = None
        for connection in failed:
            try:
                self.recover(connection, what, face)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
        return bool(failed)

    def recover(self, failed: HostConnection, what: str, face: Face) -> HostConnection:
        """Brings a failed host back by the one policy, with its requests under way.

        Each of them is answered on the new connection as the policy decided: resumed (it is
        answered), restored (it is sent again), or where the envs were re-made, by what the
        face gives (:meth:`Face.remade`); each keeps its place.

        Args:
            failed: The failed connection.
            what: The call it failed in, for the log.
            face: The call style whose requests these are.

        Returns:
            The new connection, in the failed one's place.

        Raises:
            Exception: Why it could not be brought back; its requests have left the engine
                (:meth:`Face.landed`).
        """
        requests = self.of(failed)
        mine = [(pending, self.flights[pending]) for pending in requests]
        bodies = [flight.body for _, flight in mine]
        try:
            new, answers, _ = self._recovery.recover(
                failed, requests, what, face.given(failed), bodies
            )
        except Exception:
            face.landed(self.land(requests))
            raise
        for (pending, flight), answer in zip(mine, answers):
            flight = dataclasses.replace(flight, connection=new)
            if answer is None:
                answer = face.remade(new, pending, flight)
            if answer is not None:  # in the place of the request it answers
                self.flights = {
                    (answer if p is pending else p): (flight if p is pending else f)
                    for p, f in self.flights.items()
                }
        return new

    def heal(self, face: Face) -> bool:
        """Readies the hosts for a step or a reset: moves what drains, recovers what failed.

        A host that drains with nothing under way moves its envs (:meth:`move_draining`); a
        host that failed outside a wait (in a call, a snapshot's round trip) is recovered with
        its requests under way, as a wait's failure is (:meth:`recover`). With nothing to do,
        it only reads attributes (the heartbeat's drain flag, each connection's failure).

        Returns:
            Whether there was something to do (a host drained or had failed).
        """
        heartbeat = self._pool.heartbeat
        if heartbeat is None or not heartbeat.any_draining:
            for connection in self._pool.connections:
                if connection.health.failure is not None:
                    break
            else:
                return False
        self.move_draining()
        if self._recovery.recoverable(Command.STEP):
            self.recover_failed("next step", face)
        return True

    def move_draining(self) -> list[HostConnection]:
        """Moves the envs of each host that drains with nothing under way (``Recovery.move``).

        Returns:
            The hosts that drain and still have requests under way (their envs move once
            those are answered and taken out).
        """
        busy = []
        for connection in self._recovery.draining():
            if any(flight.connection is connection for flight in self.flights.values()):
                busy.append(connection)
            else:
                self._recovery.move(connection)
        return busy

    def land(self, requests: Iterable[Pending]) -> list[Flight]:
        """Takes ``requests`` out (their replies, if they come, are dropped).

        Returns:
            Their flights, for those that were under way.
        """
        landed = [(p, f) for p in requests if (f := self.flights.pop(p, None)) is not None]
        self._pool.forget((flight.connection, pending) for pending, flight in landed)
        return [flight for _, flight in landed]

    def clear(self) -> None:
        """Takes every request out (a call ended, or the env closes)."""
        self._pool.forget(self.pairs())
        self.flights = {}
        self.interrupted = False
