"""``EnvCalls``: the base of ``RemoteVectorEnv``, its calls on the sub-envs and their order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError
from gymnasium.vector import VectorEnv
from gymnasium.vector.async_vector_env import AsyncState

from envserver.wire.batching import select
from envserver.wire.bodies import (
    Call,
    Empty,
    RequestBody,
    SetAttr,
    SetState,
    Wrappers,
)
from envserver.wire.messages import Command
from envserver.wire.replies import HeartbeatReply

from ._env_results import EnvResults
from ._first_ready import FirstReady
from ._lockstep import Lockstep
from ._options import FromPart, call_rounds, checked_env_ids, distinct_env_ids, values_by_env
from ._recovery import Recovery
from ._recovery.history import take_snapshots
from ._transport.connection import HostConnection
from ._transport.pool import HostPool

__all__ = ["EnvCalls"]


class EnvCalls(VectorEnv):
    """A vector env whose sub-envs live on env hosts: the calls on them, in the order allowed.

    The base of :class:`~envserver.client.RemoteVectorEnv`, as Gymnasium's ``VectorEnv`` is of
    ``AsyncVectorEnv``: like ``VectorEnv``, it declares the attributes its subclass sets once the
    envs are made (the env count, the pool, the parts), and works with those alone. It owns the
    async state machine every call goes through (Gymnasium's ``_assert_is_running`` and
    ``_state``, and the check that no call or first-ready batch is pending) and the requests on
    the sub-envs besides reset and step: ``call_async``/``call_wait``, calls on some envs,
    attributes set, wrappers, env state, render, and each host's env threads. ``call`` and
    ``get_attr`` are the subclass's own: a wrong call to them names it, as ``AsyncVectorEnv``'s
    name ``AsyncVectorEnv``.
    """

    num_envs: int
    _pool: HostPool
    _lockstep: Lockstep
    _first_ready: FirstReady
    _recovery: Recovery
    _results: EnvResults

    _state: AsyncState = FromPart("_lockstep", "state")
    """The call pending (an ``AsyncState``), as ``AsyncVectorEnv._state``."""

    def _assert_is_running(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`."
            )

    def _assert_idle(self, method: str, dot: str = ".") -> None:
        if self._first_ready.busy:
            raise AlreadyPendingCallError(
                f"Calling `{method}` while envs sent with `send` have not all been received; "
                "call `recv` until none is left first",
                "send",
            )
        self._lockstep.check_no_pending(method, dot)

    def call_async(self, name: str, /, *args: Any, **kwargs: Any) -> None:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env, asynchronously.

        Raises:
            ClosedEnvironmentError: If the env was closed.
            AlreadyPendingCallError: If another call is pending.
        """
        self._assert_is_running()
        self._assert_idle("call_async")
        body = Call(name, list(args), kwargs)
        self._lockstep.send(Command.CALL, lambda c: body, state=AsyncState.WAITING_CALL)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Waits for the call started by :meth:`call_async`.

        Returns:
            One result per sub-env.

        Raises:
            NoAsyncCallError: If no call is pending.
            WaitTimeoutError: If the hosts did not answer in time.
        """
        self._assert_is_running()
        self._lockstep.check_waiting(AsyncState.WAITING_CALL)
        return self._lockstep.call_result(timeout, "call_wait")

    def call_envs(
        self, env_ids: Sequence[int], name: str, *args: Any, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on the sub-envs ``env_ids`` only.

        An env named twice is called twice (in a second round of requests).

        Returns:
            One result per entry of ``env_ids``, in that order.
        """
        ids = checked_env_ids(env_ids, self.num_envs)
        results: list[Any] = [None] * len(ids)
        for positions in call_rounds(ids):
            answers = self._on_envs(
                Command.CALL,
                lambda c, local: Call(name, list(args), kwargs, local),
                [ids[p] for p in positions],
            )
            for position, answer in zip(positions, answers):
                results[position] = answer
        return tuple(results)

    def wrappers(self, env_ids: Sequence[int] | None = None) -> tuple[list[list[str]], ...]:
        """The wrapper chain of each sub-env (all, or ``env_ids``), outermost first.

        Each wrapper is the list of ``module.qualname`` names of its class's MRO, so that
        ``isinstance`` can be told without the class crossing the wire.
        """
        ids = range(self.num_envs) if env_ids is None else checked_env_ids(env_ids, self.num_envs)
        return self._on_envs(
            Command.WRAPPERS, lambda c, local: Wrappers(local), list(dict.fromkeys(ids))
        )

    def set_attr(
        self,
        name: str,
        values: list[Any] | tuple[Any, ...] | Any,
        *,
        env_ids: Sequence[int] | None = None,
        outermost: bool = False,
    ) -> None:
        """Sets attribute ``name`` on every sub-env, or on ``env_ids`` only.

        Args:
            name: The attribute.
            values: One value per sub-env (a list or tuple), or one value for all.
            env_ids: The sub-envs to set it on (default: all); ``values`` then has one value
                per entry.
            outermost: Set it on each env's outermost wrapper, as SB3 does, instead of where
                Gymnasium's ``set_wrapper_attr`` puts it (the wrapper or env that has it).

        Raises:
            ValueError: If a list or tuple of values does not have one value per sub-env.
        """
        self._assert_is_running()
        ids = range(self.num_envs) if env_ids is None else checked_env_ids(env_ids, self.num_envs)
        by_env = values_by_env(values, ids)
        self._on_envs(
            Command.SET_ATTR,
            lambda c, local: SetAttr(
                name, [by_env[c.block.start + i] for i in local], local, outermost
            ),
            list(by_env),
        )
        self._recovery.history.set_attr(name, by_env, outermost)

    def get_state(self, env_ids: Sequence[int] | None = None) -> list[bytes]:
        """A snapshot of each sub-env (all, or ``env_ids``): bytes to store or restore.

        A snapshot holds the env's whole stack (every wrapper's state, the env's, its random
        generator's), the host's bookkeeping of it (its last observation and infos, whether its
        episode ended) and a fingerprint; :meth:`set_state` restores it into this vector env or
        another made from the same spec, on any host. Envs whose state no mechanism covers are
        refused (``UnsupportedStateError``), never approximated (see :mod:`envserver.state`).

        Args:
            env_ids: Distinct sub-envs (default: all), in the order of the snapshots returned.

        Returns:
            One snapshot per env.
        """
        ids = distinct_env_ids(env_ids, self.num_envs)
        self._assert_is_running()
        self._assert_idle("get_state")
        return take_snapshots(self._pool, ids)

    def set_state(
        self, states: Sequence[bytes], env_ids: Sequence[int] | None = None
    ) -> tuple[Any, tuple[dict[str, Any], ...]]:
        """Restores sub-envs from snapshots :meth:`get_state` took (here or in another vector env).

        Each env goes on from the snapshot's moment: its next step is the step that followed
        it there (a reset first, in NEXT_STEP mode, if its episode had just ended).

        Args:
            states: One snapshot per env.
            env_ids: Distinct sub-envs (default: all), in the order of ``states``.

        Returns:
            The observations of the snapshots' moment, batched in ``env_ids`` order, and each
            env's infos of that moment.

        Raises:
            StateMismatchError: If a snapshot is of another env, stack, version or machine.
            ValueError: If there is not one snapshot (bytes) per env.
        """
        ids = distinct_env_ids(env_ids, self.num_envs)
        if len(states) != len(ids) or not all(isinstance(s, bytes) for s in states):
            raise ValueError(f"expected {len(ids)} snapshots (bytes), one per env")
        by_env = dict(zip(ids, states))
        answers = self._on_envs(
            Command.SET_STATE,
            lambda c, local: SetState([by_env[c.block.start + i] for i in local], local),
            ids,
        )
        self._recovery.history.snapshots_taken(ids, states)  # what "restore" starts from now
        observations = [answer[0] for answer in answers]
        self._results.restored(ids, observations, [bool(answer[2]) for answer in answers])
        batch = self._results.hand_out(select(self._results.space, self._results.observations, ids))
        return batch, tuple(answer[1] for answer in answers)

    def _on_envs(
        self,
        command: Command,
        body: Callable[[HostConnection, list[int]], RequestBody],
        env_ids: Sequence[int],
    ) -> tuple[Any, ...]:
        """Runs a per-env command on the envs ``env_ids`` (distinct); see ``HostPool.on_envs``."""
        self._assert_is_running()
        self._assert_idle(command.name.lower())
        return self._pool.on_envs(command, body, env_ids)

    def env_threads_in_use(self) -> tuple[int, ...]:
        """How many envs each host steps at once now (1: one after another), in host order.

        With ``env_threads=None`` (the default), what each host has chosen so far from how
        its envs spend their steps; asked of the hosts (one HEARTBEAT each, which renews the
        sessions' leases and changes nothing else).
        """
        self._assert_is_running()
        self._assert_idle("env_threads_in_use")
        replies = self._pool.round_trip(Command.HEARTBEAT, lambda c: None, None)
        beats = [connection.read(HeartbeatReply, body) for connection, body in replies]
        return tuple(beat.env_threads or 1 for beat in beats)

    def render(self) -> tuple[Any, ...]:
        """Returns the rendered frames of the sub-envs."""
        self._assert_is_running()
        self._assert_idle("call_async")  # Gymnasium's render is a call
        self._lockstep.send(Command.RENDER, lambda c: Empty())
        return self._lockstep.call_result(None, "render")
