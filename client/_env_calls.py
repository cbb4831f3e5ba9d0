"""``RemoteVectorEnv``'s calls on its sub-envs: methods, attributes, wrappers and render."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gymnasium.vector.async_vector_env import AsyncState

from envserver.wire.bodies import Call, Empty, RequestBody, SetAttr, Wrappers
from envserver.wire.messages import Command

from ._lockstep import Lockstep
from ._options import call_rounds, checked_env_ids, values_by_env
from ._recovery import Recovery
from ._transport.connection import HostConnection

__all__ = ["EnvCalls"]


class EnvCalls:
    """The calls ``RemoteVectorEnv`` makes on its sub-envs, as Gymnasium's vector envs have them.

    A part of :class:`~envserver.client.RemoteVectorEnv` (its base class), which provides what
    is declared here: the env count, the lockstep calls, the recovery's record of attributes
    set, and the checks that the env is open and idle.
    """

    num_envs: int
    _lockstep: Lockstep
    _recovery: Recovery

    def _assert_is_running(self) -> None:
        raise NotImplementedError

    def _assert_idle(self, method: str, dot: str = ".") -> None:
        raise NotImplementedError

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
            lambda c, local: SetAttr(name, [by_env[c.start + i] for i in local], local, outermost),
            list(by_env),
        )
        self._recovery.note_set_attr(name, by_env, outermost)

    def _on_envs(
        self,
        command: Command,
        body: Callable[[HostConnection, list[int]], RequestBody],
        env_ids: Sequence[int],
    ) -> tuple[Any, ...]:
        """Runs a per-env command on the envs ``env_ids`` (distinct); see ``Lockstep.on_envs``."""
        self._assert_is_running()
        self._assert_idle(command.name.lower())
        return self._lockstep.on_envs(command, body, env_ids)

    def render(self) -> tuple[Any, ...]:
        """Returns the rendered frames of the sub-envs."""
        self._assert_is_running()
        self._assert_idle("call_async")  # Gymnasium's render is a call
        self._lockstep.send(Command.RENDER, lambda c: Empty())
        return self._lockstep.call_result(None, "render")
