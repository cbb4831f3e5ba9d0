"""Lockstep calls: one request to each host, then a wait for every reply, recovering failures.

Steps and resets also keep which hosts run them on which of their envs (a reset mask, envs
lost with a failed host that only report the loss), and merge the replies into the envs'
results. What they send goes in each env's history (``EnvHistory``): every reset, and with
``on_host_failure="restore"`` every step too, and every env's snapshot after each reset and
every ``snapshot_every`` steps.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AutoresetMode
from gymnasium.vector.async_vector_env import AsyncState

from envserver.errors import (
    EnvServerError,
    ProtocolError,
    WaitTimeoutError,
)
from envserver.wire.batching import check_batch, select
from envserver.wire.bodies import RequestBody, Reset, Step
from envserver.wire.messages import Command, Reply, Status

from ._env_results import EnvResults
from ._in_flight import Face, InFlight
from ._recovery import Recovery
from ._recovery.restore import lost_reset
from ._results import add_infos, copied, reply_of
from ._transport.connection import HostConnection
from ._transport.pool import HostPool
from ._transport.raw_step import RawStep
from ._transport.requests import Flight, Pending

__all__ = ["Lockstep"]

logger = logging.getLogger(__name__)


@dataclass
class _Call:
    """A lockstep call under way; its requests (one per host, in host order) are the engine's.

    Attributes:
        command: The command.
        lean: Whether it is a step sent the lean way (``RawStep``): its replies are read the
            lean way first.
        what: The call, for messages (``step_wait``, ``reset_wait``...), as its wait says.
        remade: The hosts whose envs were made anew after a failure during this call.
        reports: What envs lost earlier report in it, per host: their indices in its block,
            and the report (made once: the results it is merged into may be made again).
    """

    command: Command
    lean: bool = False
    what: str = ""
    remade: set[HostConnection] = field(default_factory=set)
    reports: dict[HostConnection, tuple[list[int], Any]] = field(default_factory=dict)


class Lockstep(Face):
    """The lockstep call under way: its requests, its async state, and the wait for its replies.

    A call ends when its wait returns, or raises an error of its own (a timeout, a host
    failure, a host's error). Anything else that interrupts the wait (a ``KeyboardInterrupt``
    from Ctrl-C, an exception a signal handler raised) leaves the call pending, as
    ``AsyncVectorEnv`` does: the requests stay under way, the replies already received stay
    taken, and the next ``*_wait`` goes on where it stopped and returns the call's results.

    Args:
        pool: The hosts.
        engine: The requests under way (one per host while a call is).
        recovery: Brings back a host that fails during a step or a reset (if it may).
        results: Where steps and resets write their results.
        action_space: One env's action space.
    """

    def __init__(
        self,
        pool: HostPool,
        engine: InFlight,
        recovery: Recovery,
        results: EnvResults,
        action_space: gym.Space,
    ) -> None:
        self._pool = pool
        self._engine = engine
        self._history = recovery.history
        self._raw = RawStep(pool)
        self._recovery = recovery
        self._results = results
        self._action_space = action_space
        self._call: _Call | None = None
        #: The call pending (``*_async`` sent, ``*_wait`` not yet called), as AsyncVectorEnv.
        self.state = AsyncState.DEFAULT
        self._reset_ids: dict[int, list[int] | None] = {}  # by the host's first env index
        self._step_ids: dict[int, list[int]] = {}  # hosts stepping part of their block

    def check_no_pending(self, method: str, dot: str = ".") -> None:
        """Raises Gymnasium's ``AlreadyPendingCallError`` if a call is pending."""
        if self.state != AsyncState.DEFAULT:
            raise AlreadyPendingCallError(
                f"Calling `{method}` while waiting for a pending call to "
                f"`{self.state.value}` to complete{dot}",
                str(self.state.value),
            )

    def check_waiting(self, state: AsyncState) -> None:
        """Raises Gymnasium's ``NoAsyncCallError`` unless the call pending is ``state``'s."""
        if self.state != state:
            raise NoAsyncCallError(
                f"Calling `{state.value}_wait` without any prior call to `{state.value}_async`.",
                state.value,
            )

    def send(
        self,
        command: Command,
        body: Callable[[HostConnection], RequestBody | None],
        targets: Sequence[HostConnection] | None = None,
        state: AsyncState = AsyncState.DEFAULT,
    ) -> None:
        """Sends one request to each host (all, or ``targets``): all of them, or none.

        Args:
            command: The command.
            body: The request body for each host.
            targets: The hosts (default: all).
            state: The async state while the call is pending (DEFAULT: a call waited for at
                once, not an ``*_async`` one).
        """
        engine = self._engine
        targets = self._pool.connections if targets is None else targets
        prepared = engine.prepare([Flight(c, command, body(c)) for c in targets])
        self._call, self.state = _Call(command), state
        engine.transmit(prepared)

    def wait(
        self, timeout_s: float | None, what: str, deadline: float | None = None
    ) -> list[tuple[HostConnection, Pending]]:
        """Waits for the reply of every request of the call, recovering failed hosts.

        A host that fails during a step or a reset is recovered (if the recovery may), and
        its request answered by the recovered host. The call ends when this raises an error of
        its own, or when the caller has made its results (:meth:`_end`); anything else
        interrupting it leaves the call pending (class docstring).

        Returns:
            Each host's connection and request (answered), in host order.

        Raises:
            WaitTimeoutError: If not every reply came in time.
            HostUnavailableError: If a host failed and was not recovered (and its kin).
            Exception: The first error a host reported (in host order), rebuilt.
        """
        call = self._call
        if deadline is None and timeout_s is not None:
            deadline = time.monotonic() + timeout_s
        call.what = what
        try:
            failure = self._collect(call, deadline, timeout_s)
        except BaseException:  # interrupted: the call stays pending, its requests under way
            self._engine.interrupted = True
            raise
        finally:
            self._pool.tell()
        if failure is not None:
            self._end()
            raise failure
        answered = self._engine.pairs()
        for connection, pending in answered:
            if not pending.ok:
                self._end()
                raise connection.error(pending.reply)
        return answered

    def settle(self, timeout_s: float) -> None:
        """Waits for the call pending to finish, dropping its results (the env is closing).

        Raises:
            Exception: As :meth:`wait`; the call is over either way.
        """
        try:
            self.wait(timeout_s, "close")
        finally:
            self._end()

    def _end(self) -> None:
        """Ends the call: no call is pending, the replies still to come are dropped."""
        self._wrap_up()
        self._call, self.state = None, AsyncState.DEFAULT

    def _wrap_up(self) -> None:
        """The call's bookkeeping before it ends: replies to come dropped, reports noted.

        A ``*_wait`` that returns results does this, then ends the call with the two stores
        of :meth:`_end`, right before its return: no call between them and the return gives a
        signal the chance to act, so an interruption leaves the call pending (its results
        made again by the next ``*_wait``; this bookkeeping may then be done twice).
        """
        call = self._call
        if call is not None:
            self._engine.clear()
            for connection, (local, _) in call.reports.items():
                self._recovery.ledger.reported(connection, local)

    def _collect(
        self, call: _Call, deadline: float | None, timeout_s: float | None
    ) -> Exception | None:
        """Waits until every request of ``call`` is answered, recovering the failed hosts.

        Returns:
            None once all are answered; else what ends the call: the wait's failure, or why a
            host could not be recovered.
        """
        engine, recovery = self._engine, self._recovery
        while True:
            failure = engine.wait(True, deadline, call.what, timeout_s)
            if isinstance(failure, WaitTimeoutError) or not recovery.recoverable(call.command):
                return failure
            try:
                if not engine.recover_failed(call.what, self):
                    return failure
            except Exception as exc:  # not recovered: the call ends with why
                return exc

    # ------------------------------------------------------------- the engine's face

    def remade(self, new: HostConnection, pending: Pending, flight: Flight) -> Pending:
        """What answers a request whose envs were re-made (see ``Face.remade``).

        A step's envs report the loss (see :meth:`step_result`); a reset is sent again to
        the host's whole block (the envs a mask left out are fresh too).
        """
        if flight.command is Command.STEP:
            return Pending.answered(Command.STEP, Reply(None, Status.OK, None))
        self._call.remade.add(new)
        return lost_reset(new, flight.body)

    # ------------------------------------------------------------- steps and resets

    def send_reset(
        self, seeds: list[int | None], options: dict[str, Any] | None, mask: np.ndarray | None
    ) -> None:
        """Sends a reset: each host resets its whole block, or (with a mask) the envs marked."""
        self._engine.heal(self)
        self._reset_ids = {
            b.start: None if mask is None else np.flatnonzero(mask[b.start : b.stop]).tolist()
            for b in (c.block for c in self._pool.connections)
            if mask is None or mask[b.start : b.stop].any()
        }

        def body(connection: HostConnection) -> Reset:
            block = connection.block
            env_ids = self._reset_ids[block.start]
            if env_ids is None:
                return Reset(seeds[block.start : block.stop], options)
            return Reset([seeds[block.start + i] for i in env_ids], options, env_ids)

        targets = [c for c in self._pool.connections if c.block.start in self._reset_ids]
        reset = range(len(seeds)) if mask is None else np.flatnonzero(mask).tolist()
        self.send(Command.RESET, body, targets, AsyncState.WAITING_RESET)
        self._history.sent(reset, Reset([seeds[i] for i in reset], options))
        self._results.clear_ended(slice(None) if mask is None else mask)

    def reset_result(self, timeout_s: float | None, what: str) -> tuple[Any, Any]:
        """Waits for the reset sent, and returns the observations and infos."""
        call = self._call
        answered = self.wait(timeout_s, what)
        results = self._results
        infos = results.infos.start()
        try:
            for connection, pending in answered:
                # A host whose envs were made anew reset its whole block (no env left out).
                remade = connection in call.remade
                env_ids = None if remade else self._reset_ids[connection.block.start]
                reset = reply_of(connection, Command.RESET, pending.reply.body)
                if connection not in call.reports:  # lost envs it brought back say so
                    found = self._recovery.ledger.found(
                        connection, env_ids or range(connection.block.count)
                    )
                    call.reports[connection] = ([i for i, _ in found], found)
                found = call.reports[connection][1]
                if found:
                    reset = dataclasses.replace(reset, infos=[*reset.infos, *found])
                infos = results.merge_reset(infos, connection, env_ids, reset)
            observations = results.observation_batch()
        except EnvServerError:  # a host's defect found in its reply ends the call
            self._end()
            raise
        self._wrap_up()
        self._call, self.state = None, AsyncState.DEFAULT  # (see _wrap_up)
        if self._history.keeps_snapshots and not self._recovery.ledger.any_lost:  # after a reset
            self._history.snapshot_due()
        return observations, infos

    def send_step(self, actions: Any) -> None:
        """Checks and sends a step (``actions``: a batch the caller may change once it returns).

        Raises:
            ValueError: If the number or shape of the actions is wrong.
            AssertionError: If envs whose episodes ended are stepped in DISABLED autoreset mode.
        """
        actions = copied(actions)
        pool, recovery, num_envs = self._pool, self._recovery, len(self._results.rewards)
        layout = pool.step_layout
        arrays = None if layout is None else layout.action_arrays(actions, num_envs)
        if arrays is None:  # (a batch that has arrays fits the layout exactly: checked)
            check_batch(self._action_space, actions, num_envs)
        if self._results.autoreset_mode is AutoresetMode.DISABLED:  # (else nothing to refuse)
            self._results.refuse_finished(None, "options={'reset_mask': mask}")
        engine, lost = self._engine, recovery.ledger.any_lost
        flights = None if lost else self._raw.prepare(actions, arrays)
        if flights is None and engine.heal(self):  # a host had failed or drains: mended first
            lost = recovery.ledger.any_lost
            flights = None if lost else self._raw.prepare(actions, arrays)
        self._step_ids = {}
        if self._history.keeps_snapshots:  # every env's, the lost ones' too (they have none)
            self._history.sent(None, Step(actions))
        if flights is not None:
            engine.flights = flights
            self._call = _Call(Command.STEP, lean=True)
            self.state = AsyncState.WAITING_STEP
            engine.transmit(flights)
            return
        space = self._action_space
        # Envs lost with a re-made host are not stepped: their step reports the loss.
        for connection in pool.connections if lost else ():
            gone = set(self._recovery.ledger.lost_in(connection))
            if gone:
                kept = [i for i in range(connection.block.count) if i not in gone]
                self._step_ids[connection.block.start] = kept

        def body(connection: HostConnection) -> Step:
            block = connection.block
            env_ids = self._step_ids.get(block.start)
            if env_ids is None:
                return Step(select(space, actions, slice(block.start, block.stop)))
            positions = [block.start + i for i in env_ids]
            return Step(select(space, actions, positions), env_ids)

        targets = [c for c in pool.connections if self._step_ids.get(c.block.start, True)]
        self.send(Command.STEP, body, targets, AsyncState.WAITING_STEP)

    def step_result(
        self, timeout_s: float | None, what: str
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Waits for the step sent, and returns what ``step`` returns."""
        results, ledger = self._results, self._recovery.ledger
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        call = self._call
        written = False  # whether the lean receive wrote every reply: nothing else to do
        engine = self._engine
        if call.lean:  # its replies first the lean way, then (if any are left) the wait's
            try:
                if engine.interrupted:  # what an interrupted send left
                    self._pool.transmit(engine.pairs())
                    engine.interrupted = False
                batches = (results.observations, results.rewards, results.flags)
                written = self._raw.receive(engine.flights, batches, deadline)
            except BaseException:
                engine.interrupted = True
                self._pool.tell()
                raise
        infos = results.infos.start()
        if written:  # every reply is in the batches: only their infos are left to merge
            for pending, flight in engine.flights.items():
                if pending.written:
                    infos = add_infos(results.infos, infos, flight.connection, pending.written)
            result = results.step_result(infos)
            # A lean call was sent with no env lost, and all written it met no failure: none
            # since. The call ends in one statement (see _wrap_up).
            engine.flights, self._call, self.state = {}, None, AsyncState.DEFAULT
            if self._history.keeps_snapshots:
                self._history.snapshot_due()
            return result
        answered = self.wait(timeout_s, what, deadline)
        try:
            for connection, pending in answered:
                if pending.written is not None:  # the lean receive wrote it into the batches
                    if pending.written:
                        infos = add_infos(results.infos, infos, connection, pending.written)
                elif pending.reply.body is not None:  # None: re-made, its envs report below
                    env_ids = self._step_ids.get(connection.block.start)
                    step = reply_of(connection, Command.STEP, pending.reply.body)
                    infos = results.merge_step(infos, connection, env_ids, step)
            for connection in self._pool.connections if ledger.any_lost or call.reports else ():
                if connection not in call.reports:
                    gone = ledger.lost_in(connection)
                    if gone:  # envs lost earlier report it now
                        call.reports[connection] = (gone, ledger.loss_report(connection, gone))
                if connection in call.reports:
                    gone, report = call.reports[connection]
                    infos = results.merge_step(infos, connection, gone, report)
            result = results.step_result(infos)
        except EnvServerError:  # a host's defect found in its reply ends the call
            self._end()
            raise
        self._wrap_up()
        self._call, self.state = None, AsyncState.DEFAULT  # (see _wrap_up)
        if self._history.keeps_snapshots and not ledger.any_lost:
            # Not while envs lost earlier have yet to report it: their hosts' envs are fresh.
            self._history.snapshot_due()
        return result

    def call_result(self, timeout_s: float | None, what: str) -> tuple[Any, ...]:
        """Waits for the call sent (a request to every host), and returns one result per env.

        Raises:
            ProtocolError: If a host sent another number of results than it has envs.
        """
        results: list[Any] = []
        for connection, pending in self.wait(timeout_s, what):
            values = pending.reply.body
            if not isinstance(values, list) or len(values) != connection.block.count:
                self._end()
                raise ProtocolError(f"{connection.block.name} sent a wrong number of results")
            results += values
        self._wrap_up()
        self._call, self.state = None, AsyncState.DEFAULT  # (see _wrap_up)
        return tuple(results)
