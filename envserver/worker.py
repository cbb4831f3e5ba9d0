"""The envs of one session and the worker loop body that drives them.

:class:`EnvBlock` is the body of Gymnasium's vector worker loop applied to a contiguous block of
envs: it resets, steps and autoresets them exactly as ``gymnasium.vector.SyncVectorEnv`` does in
each :class:`~gymnasium.vector.AutoresetMode`, and returns per-env infos in the order the client
must merge them, so that the client's ``_add_info`` builds the very infos SyncVectorEnv builds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envserver.batching import check_batch

__all__ = ["EnvBlock", "EnvCallError", "InfoEntries"]

logger = logging.getLogger(__name__)

#: Per-env infos in merge order: ``[[local_index, info], ...]``, empty infos left out.
InfoEntries = list[list[Any]]

#: Methods that `call` must not reach: they would bypass the autoreset bookkeeping.
RESERVED_CALLS = frozenset({"reset", "step", "close"})


class EnvCallError(Exception):
    """An exception raised by the env at ``index`` (within the block), kept with its index."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"env {index}: {error!r}")
        self.index = index
        self.error = error


class EnvBlock:
    """A block of envs stepped together, with SyncVectorEnv's autoreset semantics.

    Args:
        envs: The envs, already made.
        autoreset_mode: How finished envs are reset.
    """

    def __init__(self, envs: Sequence[gym.Env], autoreset_mode: AutoresetMode) -> None:
        self.envs = list(envs)
        self.num_envs = len(self.envs)
        self.autoreset_mode = autoreset_mode
        self.single_observation_space = self.envs[0].observation_space
        self.action_space = batch_space(self.envs[0].action_space, self.num_envs)
        self._env_obs: list[Any] = [None] * self.num_envs
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)

    @classmethod
    def make(
        cls, factories: Sequence[Callable[[], gym.Env]], autoreset_mode: AutoresetMode
    ) -> EnvBlock:
        """Creates the envs one by one; on failure closes those already made.

        Args:
            factories: One callable per env.
            autoreset_mode: How finished envs are reset.

        Returns:
            The block.

        Raises:
            EnvCallError: If a factory raised or did not return an env.
        """
        envs: list[gym.Env] = []
        try:
            for i, factory in enumerate(factories):
                try:
                    env = factory()
                    if not isinstance(env, gym.Env):
                        raise TypeError(
                            f"the env factory returned {type(env).__qualname__}, "
                            "not a gymnasium.Env"
                        )
                except BaseException as exc:
                    raise EnvCallError(i, exc) from exc
                envs.append(env)
        except EnvCallError:
            _close_all(envs)
            raise
        return cls(envs, autoreset_mode)

    def _observations(self) -> Any:
        """Batches the current observations into fresh arrays.

        Never reused: a previous batch may still be queued for sending without a copy.
        """
        space = self.single_observation_space
        out = create_empty_array(space, n=self.num_envs, fn=np.zeros)
        return concatenate(space, self._env_obs, out)

    def reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | None,
        mask: Sequence[bool] | None,
    ) -> tuple[Any, InfoEntries]:
        """Resets the envs (all, or those in ``mask``) as SyncVectorEnv.reset does.

        Unlike a step, a reset goes on past an env that raises, so that every other env is in
        a known state afterwards; the first failure is raised at the end.

        Returns:
            The batched observations of the whole block and the info entries.

        Raises:
            EnvCallError: For the first env that raised.
        """
        entries: InfoEntries = []
        failure: EnvCallError | None = None
        for i, env in enumerate(self.envs):
            if mask is not None and not mask[i]:
                continue
            try:
                self._env_obs[i], info = env.reset(seed=seeds[i], options=options)
            except BaseException as exc:
                failure = failure or EnvCallError(i, exc)
                continue
            self._autoreset[i] = False
            if info:
                entries.append([i, info])
        if failure is not None:
            raise failure
        return self._observations(), entries

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, InfoEntries]:
        """Steps every env of the block as SyncVectorEnv.step does, autoresetting per mode.

        Args:
            actions: The block's batched actions.

        Returns:
            Batched observations, float64 rewards, bool terminations and truncations, info
            entries.
        """
        n = self.num_envs
        if self.autoreset_mode == AutoresetMode.DISABLED and self._autoreset.any():
            index = int(np.flatnonzero(self._autoreset)[0])
            raise EnvCallError(
                index,
                AssertionError(
                    "stepping an env whose episode ended, with autoreset_mode DISABLED: reset it "
                    "first (options={'reset_mask': ...})"
                ),
            )
        check_batch(self.envs[0].action_space, actions, n)
        rewards = np.zeros(n, dtype=np.float64)
        terminations = np.zeros(n, dtype=np.bool_)
        truncations = np.zeros(n, dtype=np.bool_)
        entries: InfoEntries = []
        for i, action in enumerate(iterate(self.action_space, actions)):
            env = self.envs[i]
            try:
                if self.autoreset_mode == AutoresetMode.NEXT_STEP and self._autoreset[i]:
                    self._env_obs[i], info = env.reset()
                else:
                    obs, rewards[i], terminations[i], truncations[i], info = env.step(action)
                    self._env_obs[i] = obs
                    if self.autoreset_mode == AutoresetMode.SAME_STEP and (
                        terminations[i] or truncations[i]
                    ):
                        entries.append([i, {"final_obs": obs, "final_info": info}])
                        self._env_obs[i], info = env.reset()
            except BaseException as exc:
                raise EnvCallError(i, exc) from exc
            self._autoreset[i] = terminations[i] or truncations[i]
            if info:
                entries.append([i, info])
        return self._observations(), rewards, terminations, truncations, entries

    def call(self, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        """Calls method ``name`` (or reads attribute ``name``) on every env."""
        if name in RESERVED_CALLS:
            raise ValueError(
                f"Trying to call function `{name}` with `call`, use `{name}` directly instead."
            )
        results = []
        for i, env in enumerate(self.envs):
            try:
                attr = env.get_wrapper_attr(name)
                results.append(attr(*args, **kwargs) if callable(attr) else attr)
            except BaseException as exc:
                raise EnvCallError(i, exc) from exc
        return results

    def set_attr(self, name: str, values: Sequence[Any]) -> None:
        """Sets attribute ``name`` on every env, one value each."""
        if len(values) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} values, got {len(values)}")
        for i, (env, value) in enumerate(zip(self.envs, values)):
            try:
                env.set_wrapper_attr(name, value)
            except BaseException as exc:
                raise EnvCallError(i, exc) from exc

    def render(self) -> list[Any]:
        """Renders every env."""
        frames = []
        for i, env in enumerate(self.envs):
            try:
                frames.append(env.render())
            except BaseException as exc:
                raise EnvCallError(i, exc) from exc
        return frames

    def close(self) -> None:
        """Closes every env; an env that fails to close is logged and skipped."""
        _close_all(self.envs)


def _close_all(envs: Sequence[gym.Env]) -> None:
    for env in envs:
        try:
            env.close()
        except BaseException:
            logger.exception("closing env %r failed", env)
