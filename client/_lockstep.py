"""Lockstep calls: one request to each host, then a wait for every reply, recovering failures.

Steps and resets also keep which hosts run them on which of their envs (a reset mask, envs
lost with a failed host that only report the loss), and merge the replies into the envs'
results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector.async_vector_env import AsyncState

from envserver.errors import ProtocolError
from envserver.wire.batching import select
from envserver.wire.messages import Command, Reply

from ._connection import HostConnection
from ._env_results import EnvResults
from ._pool import HostPool
from ._raw_step import RawStep
from ._recovery import Recovery
from ._results import Request

__all__ = ["Lockstep"]


class Lockstep:
    """The lockstep call under way: its requests, its async state, and the wait for its replies.

    Args:
        pool: The hosts.
        recovery: Brings back a host that fails during a step or a reset (if it may).
        results: Where steps and resets write their results.
        action_space: One env's action space.
    """

    def __init__(
        self, pool: HostPool, recovery: Recovery, results: EnvResults, action_space: gym.Space
    ) -> None:
        self._pool = pool
        self._raw = RawStep(pool, results, action_space)
        self._recovery = recovery
        self._results = results
        self._action_space = action_space
        self._pending: dict[HostConnection, Request] = {}
        #: The call pending (``*_async`` sent, ``*_wait`` not yet called), as AsyncVectorEnv.
        self.state = AsyncState.DEFAULT
        self._reset_ids: dict[int, list[int] | None] = {}  # by the host's first env index
        self._step_ids: dict[int, list[int]] = {}  # hosts stepping part of their block
        # The connections of the last wait whose envs were made anew after a failure (their
        # reset reply covers their whole block).
        self._remade: set[HostConnection] = set()

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
        body: Callable[[HostConnection], Any],
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
        self._pending = {}
        self._pending = self._pool.send(command, body, targets)
        self.state = state

    def wait(
        self, timeout_s: float | None, what: str, deadline: float | None = None
    ) -> list[tuple[HostConnection, Any]]:
        """Waits for the reply of every pending request, in host order (``HostPool.gather``).

        Whatever happens, no call is pending afterwards. A host that fails during a step or a
        reset is recovered (if the recovery may), and the request answered by the recovered
        host.

        Returns:
            Each host's connection and reply body, in host order.
        """
        pending, self._pending = self._pending or self._raw.requests(), {}
        self._remade = set()
        try:
            return self._pool.gather(pending, timeout_s, what, self, deadline)
        finally:
            self.state = AsyncState.DEFAULT

    def recoverable(self, command: Command) -> bool:
        """Whether a host failing during ``command`` is recovered now (see ``Recovery``)."""
        return self._recovery.recoverable(command)

    def recover(self, failed: HostConnection, request: Request) -> tuple[HostConnection, Reply]:
        """Recovers a host for :meth:`wait`, noting whether its envs were made anew."""
        new, reply, remade = self._recovery.recover(failed, request)
        if remade:
            self._remade.add(new)
        return new, reply

    # ------------------------------------------------------------- steps and resets

    def send_reset(
        self, seeds: list[int | None], options: dict[str, Any] | None, mask: np.ndarray | None
    ) -> None:
        """Sends a reset: each host resets its whole block, or (with a mask) the envs marked."""
        self._recovery.recover_failed()
        self._reset_ids = {
            c.start: None if mask is None else np.flatnonzero(mask[c.start : c.stop]).tolist()
            for c in self._pool.connections
            if mask is None or mask[c.start : c.stop].any()
        }

        def body(connection: HostConnection) -> dict[str, Any]:
            env_ids = self._reset_ids[connection.start]
            if env_ids is None:
                return {"seeds": seeds[connection.start : connection.stop], "options": options}
            return {
                "seeds": [seeds[connection.start + i] for i in env_ids],
                "options": options,
                "env_ids": env_ids,
            }

        targets = [c for c in self._pool.connections if c.start in self._reset_ids]
        reset = range(len(seeds)) if mask is None else np.flatnonzero(mask).tolist()
        self.send(Command.RESET, body, targets, AsyncState.WAITING_RESET)
        self._recovery.note_reset(reset, [seeds[i] for i in reset], options)
        self._results.clear_ended(slice(None) if mask is None else mask)

    def reset_result(self, timeout_s: float | None, what: str) -> tuple[Any, Any]:
        """Waits for the reset sent, and returns the observations and infos."""
        replies = self.wait(timeout_s, what)
        results = self._results
        infos = results.infos.start()
        for connection, body in replies:
            # A host whose envs were made anew reset its whole block (the mask left none out).
            env_ids = None if connection in self._remade else self._reset_ids[connection.start]
            self._recovery.found(connection, env_ids or range(connection.count), body)
            infos = results.merge_reset(infos, connection, env_ids, body)
        return results.observation_batch(), infos

    def send_step(self, actions: Any) -> None:
        """Sends a step (``actions``: a checked batch the caller will not change)."""
        self._recovery.recover_failed()
        self._step_ids = {}
        if not self._recovery.any_lost and self._raw.send(actions):
            self._pending = {}
            self.state = AsyncState.WAITING_STEP
            return
        space = self._action_space
        # Envs lost with a re-made host are not stepped: their step reports the loss.
        for connection in self._pool.connections if self._recovery.any_lost else ():
            gone = set(self._recovery.lost_in(connection))
            if gone:
                kept = [i for i in range(connection.count) if i not in gone]
                self._step_ids[connection.start] = kept

        def body(connection: HostConnection) -> dict[str, Any]:
            env_ids = self._step_ids.get(connection.start)
            if env_ids is None:
                return {"actions": select(space, actions, slice(connection.start, connection.stop))}
            positions = [connection.start + i for i in env_ids]
            return {"actions": select(space, actions, positions), "env_ids": env_ids}

        targets = [c for c in self._pool.connections if self._step_ids.get(c.start, True)]
        self.send(Command.STEP, body, targets, AsyncState.WAITING_STEP)

    def step_result(
        self, timeout_s: float | None, what: str
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Waits for the step sent, and returns what ``step`` returns."""
        results, recovery = self._results, self._recovery
        infos = results.infos.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._raw.sent:  # the lean step's replies first, then (if any are left) the wait's
            try:
                infos = self._raw.receive(infos, deadline)
            except BaseException:
                self._raw.abandon()
                self.state = AsyncState.DEFAULT
                raise
            if not self._raw.sent:
                self.state = AsyncState.DEFAULT
                return results.step_result(infos)
        for connection, body in self.wait(timeout_s, what, deadline):
            if body is not None:  # None: the host was re-made, its envs are reported below
                env_ids = self._step_ids.get(connection.start)
                infos = results.merge_step(infos, connection, env_ids, body)
        for connection in self._pool.connections if recovery.any_lost else ():
            gone = recovery.lost_in(connection)
            if gone:  # envs lost earlier report it now
                report = recovery.lost_step(connection, gone)
                infos = results.merge_step(infos, connection, gone, report)
        return results.step_result(infos)

    # ------------------------------------------------------------- per-env commands

    def on_envs(
        self,
        command: Command,
        body: Callable[[HostConnection, list[int]], dict[str, Any]],
        env_ids: Sequence[int],
    ) -> tuple[Any, ...]:
        """Runs a per-env command on the hosts holding ``env_ids`` (distinct), each for its own.

        Args:
            command: The command.
            body: The request body for a host and its envs (indices in its block).
            env_ids: The envs.

        Returns:
            One result per entry of ``env_ids``, in that order.

        Raises:
            ProtocolError: If a host answers for other envs than it was asked about.
        """
        if not env_ids:
            return ()
        local = {
            c: sorted(i - c.start for i in env_ids if c.start <= i < c.stop)
            for c in self._pool.connections
        }
        targets = [c for c in self._pool.connections if local[c]]
        replies = self._pool.round_trip(
            command, lambda c: {**body(c, local[c]), "env_ids": local[c]}, None, targets
        )
        found: dict[int, Any] = {}
        for connection, values in replies:
            values = [None] * len(local[connection]) if values is None else values
            if not isinstance(values, list) or len(values) != len(local[connection]):
                raise connection.invalid(f"{command.name} results for other envs than asked")
            found.update(zip((connection.start + i for i in local[connection]), values))
        return tuple(found[i] for i in env_ids)

    def call_result(self, timeout_s: float | None, what: str) -> tuple[Any, ...]:
        """Waits for the call sent (a request to every host), and returns one result per env.

        Raises:
            ProtocolError: If a host sent another number of results than it has envs.
        """
        results: list[Any] = []
        for connection, values in self.wait(timeout_s, what):
            if not isinstance(values, list) or len(values) != connection.count:
                raise ProtocolError(f"{connection.name} sent a wrong number of results")
            results += values
        return tuple(results)
