"""First-ready batches checked env by env: one 1-env ``SyncVectorEnv`` per env as its oracle.

Envs come back in any order, so each env's results are compared with its own oracle's, stepped
with the same actions when the env is sent (and, in DISABLED mode, reset with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv


class PerEnvOracles:
    """The oracles of ``count`` envs made by ``make``, reset as a vector env's are with ``seed``.

    Args:
        make: Makes one env.
        count: How many envs.
        mode: The vector env's autoreset mode.
        seed: The seed of the first reset (env ``i`` gets ``seed + i``).
    """

    def __init__(
        self, make: Callable[[], gym.Env], count: int, mode: AutoresetMode, seed: int
    ) -> None:
        self.mode = mode
        self.oracles = [SyncVectorEnv([make], autoreset_mode=mode) for _ in range(count)]
        self.last = [oracle.reset(seed=seed + i) for i, oracle in enumerate(self.oracles)]
        self.steps = np.zeros(count, dtype=int)

    def check(self, got: tuple) -> list[int]:
        """Asserts a batch ``recv`` returned is each env's oracle's; returns its env ids."""
        obs, rewards, terminations, truncations, infos = got
        assert "host_failure" not in infos
        env_ids = [int(i) for i in infos["env_id"]]
        for k, env_id in enumerate(env_ids):
            expected = self.last[env_id]
            np.testing.assert_array_equal(obs[k], expected[0][0], f"env {env_id}")
            if len(expected) == 5:  # a step's (a reset's has no reward or flags)
                assert rewards[k] == expected[1][0], f"env {env_id}"
                assert (terminations[k], truncations[k]) == (expected[2][0], expected[3][0])
        return env_ids

    def send_next(self, envs: Any, env_ids: list[int]) -> None:
        """Sends the envs their next actions (DISABLED mode: the envs that ended are reset)."""
        last = self.last
        ended = [e for e in env_ids if len(last[e]) == 5 and (last[e][2][0] or last[e][3][0])]
        if self.mode == AutoresetMode.DISABLED and ended:
            for e in ended:
                last[e] = self.oracles[e].reset(options={"reset_mask": np.array([True])})
            envs.async_reset(env_ids=ended)
            env_ids = [e for e in env_ids if e not in ended]
        if env_ids:
            actions = np.array([(e * 7 + int(self.steps[e]) * 3) % 2 for e in env_ids])
            for e, action in zip(env_ids, actions):
                last[e] = self.oracles[e].step(np.array([action]))
                self.steps[e] += 1
            envs.send(actions, env_ids)

    def close(self) -> None:
        for oracle in self.oracles:
            oracle.close()
