"""First-ready batches (``send``/``recv``/``async_reset``): an object with its own state."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envserver.errors import EnvServerError, WaitTimeoutError
from envserver.wire.batching import check_batch, empty_batch, merge, select
from envserver.wire.bodies import RequestBody, Reset, Step
from envserver.wire.messages import Command, Status
from envserver.wire.replies import ResetReply

from ._env_results import EnvResults
from ._in_flight import Face, InFlight
from ._infos import InfoBatch
from ._recovery import Recovery
from ._results import Ready, add_infos, merged, reply_of, seeds_for
from ._transport.connection import HostConnection
from ._transport.error_replies import loss_of
from ._transport.pool import HostPool
from ._transport.requests import Flight, Pending

__all__ = ["FirstReady"]

Batch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]


class FirstReady(Face):
    """Envs sent without waiting, and handed out in batches of the first to finish.

    It owns the envs in flight (sent, held for a host that drains, or received and not yet
    handed out) and the results received and not yet handed out; its requests under way (one
    per sub-batch of a host's envs) are the engine's.

    Args:
        pool: The hosts.
        engine: The requests under way.
        recovery: Brings back a host that fails while envs are in flight (if it may).
        results: The envs' last results (the batches handed out are written there too).
        action_space: One env's action space.
        batch_size: How many envs :meth:`recv` returns.
        sub_batch_size: How many envs a host steps per request.
        info_format: ``"dict"`` or ``"list"``.
    """

    def __init__(
        self,
        pool: HostPool,
        engine: InFlight,
        recovery: Recovery,
        results: EnvResults,
        action_space: gym.Space,
        batch_size: int,
        sub_batch_size: int,
        info_format: str,
    ) -> None:
        num_envs = len(results.autoreset_envs)
        self._pool = pool
        self._engine = engine
        self._history = recovery.history
        self._recovery = recovery
        self._results = results
        self._action_space = action_space
        self.batch_size = batch_size
        self.sub_batch_size = sub_batch_size
        self._in_flight = np.zeros(num_envs, dtype=np.bool_)  # sent, or received not handed out
        self._ready: deque[Ready] = deque()
        self._infos = InfoBatch(batch_size, info_format)
        self._observations = empty_batch(results.space, batch_size)
        #: Steps held for hosts that drain (envs and actions), sent once those can move.
        self._held: list[tuple[np.ndarray, Any]] = []
        #: Whether envs are in flight or received and not yet handed out: kept as they change,
        #: an attribute for the lockstep step to read (see :meth:`_settle_busy`).
        self.busy = False

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None) -> None:
        """Sends actions to the envs ``env_ids`` (all if None), in sub-batches per host.

        Envs whose host was re-made are not sent: their step is the report of that loss. With
        ``"restore"``, the envs sent take their snapshots first where they are due.

        Raises:
            ValueError: If ``env_ids`` or the actions are wrong.
            UnsupportedStateError: With ``"restore"``, if an env's state cannot be taken.
        """
        ids = self._checked_idle_ids(env_ids)
        check_batch(self._action_space, actions, len(ids))
        self._results.refuse_finished(ids, "async_reset(env_ids=...)")
        if self._history.keeps_snapshots:  # the envs sent are idle: their snapshots, if due
            self._history.snapshot_due(ids[~self._recovery.ledger.lost_mask(ids)])
        self._engine.heal(self)
        self._dispatch(ids, actions)

    def _dispatch(self, ids: np.ndarray, actions: Any) -> None:
        """Sends the envs ``ids`` their actions (checked), but the lost and the held ones.

        A lost env's step is the report of its loss. An env of a host that drains waits
        (held, in flight for the trainer) until none of that host's envs is in flight: then
        they move to another host with their state (``Recovery.move``), and it is sent
        there (see :meth:`_release`).
        """
        lost = self._recovery.ledger.lost_mask(ids)
        if lost.any():
            for connection in self._pool.connections:
                block = connection.block
                gone = ids[lost & (ids >= block.start) & (ids < block.stop)]
                if gone.size:
                    local = (gone - block.start).tolist()
                    body = self._recovery.ledger.lost_step(connection, local)
                    self._ready.append(Ready.of(connection, gone, body))
                    self._in_flight[gone] = True
                    self.busy = True
            if lost.all():
                return
            actions = select(self._action_space, actions, np.flatnonzero(~lost).tolist())
            ids = ids[~lost]
        ids, actions = self._hold(ids, actions)
        if ids.size:
            space = self._action_space
            self._fly(
                Command.STEP,
                ids,
                lambda positions, local: Step(select(space, actions, positions), local),
            )

    def _hold(self, ids: np.ndarray, actions: Any) -> tuple[np.ndarray, Any]:
        """Moves the hosts that drain with no env in flight; holds the envs of the others.

        Returns:
            The envs to send now, and their actions.
        """
        if not self._recovery.draining():
            return ids, actions
        space = self._action_space
        for connection in self._engine.move_draining():  # envs in flight there: wait for them
            block = connection.block
            mine = (ids >= block.start) & (ids < block.stop)
            if mine.any():
                self._held.append(
                    (ids[mine], select(space, actions, np.flatnonzero(mine).tolist()))
                )
                self._in_flight[ids[mine]] = True
                self.busy = True
                rest = np.flatnonzero(~mine).tolist()
                ids, actions = ids[rest], select(space, actions, rest)
        return ids, actions

    def _release(self) -> None:
        """Sends the envs held for hosts that drain, where that host has no env in flight now."""
        if self._held:
            held, self._held = self._held, []
            try:
                for ids, actions in held:
                    self._in_flight[ids] = False  # _dispatch sends them, or holds them again
                    self._dispatch(ids, actions)
            finally:
                self._settle_busy()

    def reset(
        self,
        seed: int | Sequence[int | None] | None,
        options: dict[str, Any] | None,
        env_ids: Sequence[int] | np.ndarray | None,
    ) -> None:
        """Resets the envs ``env_ids`` (all if None) without waiting.

        Args:
            seed: None, an int (env ``i`` gets ``seed + i``) or one per env in ``env_ids``.
            options: Passed to every env's reset (checked by the caller).
            env_ids: The envs to reset.
        """
        ids = self._checked_idle_ids(env_ids)
        seeds = seeds_for(seed, ids.tolist())
        if len(seeds) != len(ids):
            raise ValueError(f"{len(seeds)} seeds for {len(ids)} envs")
        self._engine.heal(self)
        self._fly(
            Command.RESET,
            ids,
            lambda positions, local: Reset([seeds[p] for p in positions], options, local),
        )
        self._results.clear_ended(ids)

    def recv(self, timeout: float | None) -> Batch:
        """Returns the first ``batch_size`` envs to finish (see ``RemoteVectorEnv.recv``).

        Raises:
            RuntimeError: If fewer than ``batch_size`` envs are in flight or waiting.
            WaitTimeoutError: If not enough envs finished in time.
        """
        if int(self._in_flight.sum()) < self.batch_size:  # counts the received ones too
            raise RuntimeError(
                f"recv needs {self.batch_size} envs, but only "
                f"{int(self._in_flight.sum())} are in flight or waiting: send more first"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        engine = self._engine
        try:
            while self._count_received() < self.batch_size:
                self._release()
                failure = engine.wait(False, deadline, "recv", timeout)
                if isinstance(failure, WaitTimeoutError):
                    self._take_in(None)
                    raise failure
                self._take_in(failure)
        except BaseException:
            engine.interrupted = True
            raise
        finally:
            self._pool.tell()
        return self._take_batch()

    def drop(self) -> None:
        """Forgets every env in flight (closing): replies still to come are dropped."""
        if self.busy:  # (else what the engine has under way is a lockstep call's)
            self._engine.clear()
        self._ready.clear()
        self._held.clear()
        self._in_flight[:] = False
        self.busy = False

    # ------------------------------------------------------------- internals

    def _settle_busy(self) -> None:
        """Sets :attr:`busy` anew, after envs stopped being in flight."""
        self.busy = b"\x01" in self._in_flight.tobytes() or bool(self._ready)  # cheaper than any()

    def _take_in(self, failure: EnvServerError | None) -> None:
        """Takes in every reply that came, then recovers the failed hosts (or raises).

        A reply leaves the requests under way and joins the received ones in one step that a
        signal cannot split (``del`` then ``append``: no bytecode between them checks for
        signals), so an interrupted ``recv`` neither loses nor repeats it.
        """
        error: BaseException | None = None
        engine, ledger = self._engine, self._recovery.ledger
        recoverable = self._recovery.recoverable(Command.STEP)
        for pending, flight in list(engine.flights.items()):
            reply = pending.reply
            if reply is None or (recoverable and loss_of(reply) is not None):
                continue  # under way, or its host lost the envs: recovered below
            connection = flight.connection
            try:
                if reply.status == Status.ERROR:
                    raise connection.error(reply)
                result, found = reply_of(connection, flight.command, reply.body), []
                if isinstance(result, ResetReply):  # lost envs it brought back say so
                    found = ledger.found(connection, flight.ids - connection.block.start)
                    result = dataclasses.replace(result, infos=[*result.infos, *found])
                ready = Ready.of(connection, flight.ids, result)
            except Exception as exc:
                error = error or exc
                self.landed(engine.land([pending]))
                continue
            del engine.flights[pending]
            self._ready.append(ready)  # received, not yet handed out (still in _in_flight)
            if found:
                ledger.reported(connection, [i for i, _ in found])
        if recoverable:
            try:
                engine.recover_failed("recv", self)
            except Exception as exc:
                error = error or exc
        elif failure is not None:  # the failed hosts' envs are no longer in flight
            failed = {
                f.connection
                for f in engine.flights.values()
                if f.connection.health.failure is not None
            }
            for connection in failed:
                self.landed(engine.land(engine.of(connection)))
            error = error or failure
        if error is not None:
            raise error

    # ------------------------------------------------------------- the engine's face

    def remade(self, new: HostConnection, pending: Pending, flight: Flight) -> Pending | None:
        """What answers a request whose envs were re-made (see ``Face.remade``).

        A step's envs come back as the report of their loss; a reset is sent again to the new
        envs (the host's others report the loss at their next step).
        """
        if flight.command is Command.STEP:
            local = (flight.ids - new.block.start).tolist()
            ready = Ready.of(new, flight.ids, self._recovery.ledger.lost_step(new, local))
            del self._engine.flights[pending]
            self._ready.append(ready)
            return None
        return new.requests.send(flight.command, flight.body, views=True)

    def landed(self, flights: list[Flight]) -> None:
        """Marks the envs of ``flights`` as no longer in flight (see ``Face.landed``)."""
        for flight in flights:
            self._in_flight[flight.ids] = False
        self._settle_busy()

    def given(self, connection: HostConnection) -> Any:
        """With ``"restore"``, what ``connection``'s envs received last (see ``Face.given``)."""
        return self._received(connection) if self._history.keeps_snapshots else None

    def _received(self, connection: HostConnection) -> Any:
        """The last observations received of ``connection``'s envs (handed out, or not yet)."""
        space, start, stop = self._results.space, connection.block.start, connection.block.stop
        observations = self._results.last_observations(range(start, stop))
        for item in self._ready:
            ids = item.ids[item.offset :]
            positions = np.flatnonzero((ids >= start) & (ids < stop)) + item.offset
            if positions.size:
                block = select(space, item.obs, positions.tolist())
                local = (item.ids[positions] - start).tolist()
                observations = merge(space, observations, block, local)
        return observations

    def _count_received(self) -> int:
        """How many envs have results received and not yet handed out."""
        return sum(len(item.ids) - item.offset for item in self._ready)

    def _checked_idle_ids(self, env_ids: Sequence[int] | np.ndarray | None) -> np.ndarray:
        """``env_ids`` (all if None) as an array, checked: distinct, valid, none in flight."""
        num_envs = len(self._in_flight)
        ids = np.arange(num_envs) if env_ids is None else np.asarray(env_ids)
        if (
            ids.ndim != 1
            or ids.size == 0
            or ids.dtype.kind not in "iu"  # (an integer dtype, as np.issubdtype says)
            or ids.min() < 0
            or ids.max() >= num_envs
            or np.bincount(ids.astype(np.intp), minlength=num_envs).max() > 1
        ):
            raise ValueError(
                f"env_ids must be distinct env indices below {num_envs}, got {env_ids!r}"
            )
        busy = ids[self._in_flight[ids]]
        if busy.size:
            raise ValueError(f"envs {busy.tolist()} are already in flight: recv them first")
        return ids.astype(np.int64)

    def _fly(
        self,
        command: Command,
        ids: np.ndarray,
        body: Callable[[list[int], list[int]], RequestBody],
    ) -> None:
        """Sends ``command`` for envs ``ids`` as sub-batches, one request per sub-batch.

        ``body`` gives the request body of the envs at the given positions in ``ids``, which
        addresses them by the given indices in their host's block. All or
        nothing (``InFlight.prepare``); a send interrupted half-way is finished by ``recv``.
        """
        flights = []
        for connection in self._pool.connections:
            block = connection.block
            positions = ((ids >= block.start) & (ids < block.stop)).nonzero()[0]  # (1-d: a C call)
            for first in range(0, positions.size, self.sub_batch_size):
                chunk = positions[first : first + self.sub_batch_size].tolist()
                local = (ids[chunk] - block.start).tolist()
                flights.append(Flight(connection, command, body(chunk, local), ids[chunk]))
        prepared = self._engine.prepare(flights)
        # A reset is noted for re-created envs' first resets; a step only for a restore.
        if command == Command.RESET or self._history.keeps_snapshots:
            for flight in flights:
                self._history.sent(flight.ids.tolist(), flight.body)
        self._in_flight[ids] = True
        self.busy = True
        self._engine.transmit(prepared)  # recv sends what is left

    def _take_batch(self) -> Batch:
        """Hands out the first ``batch_size`` received envs, ordered by env id."""
        n = self.batch_size
        pieces: list[tuple[Ready, slice]] = []
        taken = 0
        while taken < n:  # the first n envs to arrive
            item = self._ready[0]
            take = min(n - taken, len(item.ids) - item.offset)
            pieces.append((item, slice(item.offset, item.offset + take)))
            item.offset += take
            taken += take
            if item.offset == len(item.ids):
                self._ready.popleft()
        env_ids = np.concatenate([item.ids[source] for item, source in pieces])
        rank = np.empty(n, dtype=np.int64)
        order = env_ids.argsort(kind="stable")  # (the methods: no Python layers)
        rank[order] = np.arange(n)
        rewards = np.zeros(n, dtype=np.float64)
        terminations = np.zeros(n, dtype=np.bool_)
        truncations = np.zeros(n, dtype=np.bool_)
        infos = self._infos.start()
        first = 0
        for item, source in pieces:
            target = rank[first : first + source.stop - source.start]
            first += len(target)
            self._place(item, source, target)
            rewards[target] = item.rewards[source]
            terminations[target] = item.terminations[source]
            truncations[target] = item.truncations[source]
            if item.entries:  # (most steps of most envs say nothing)
                start = item.connection.block.start
                positions = {
                    env - start: position
                    for env, position in zip(item.ids[source].tolist(), target.tolist())
                }
                entries = [entry for entry in item.entries if entry[0] in positions]
                infos = add_infos(
                    self._infos, infos, item.connection, entries, positions.__getitem__
                )
        env_ids = env_ids[order]
        self._in_flight[env_ids] = False
        self._settle_busy()
        self._results.note_batch(env_ids, self._observations, terminations | truncations)
        infos = self._infos.label(infos, env_ids)
        observations = self._results.hand_out(self._observations)
        return observations, rewards, terminations, truncations, infos

    def _place(self, item: Ready, source: slice, target: np.ndarray) -> None:
        """Writes observations ``source`` of a received sub-batch at ``target`` in the batch."""
        space = self._results.space
        block = select(space, item.obs, source)
        self._observations = merged(
            item.connection, space, self._observations, block, target.tolist()
        )
