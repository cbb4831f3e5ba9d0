"""Envs of the benchmark's own, registered with Gymnasium on import.

Hosts make them by ``bench_envs:bench/Compute-v0``: the ``bench_envs:`` prefix has
``gymnasium.make`` import this module first, which hosts can, since they get the trainer's
import path (``benchmarks/``, the script's directory, is on it).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["COMPUTE_ID", "ComputeEnv", "calibrate_work", "spin"]

#: The id to make :class:`ComputeEnv` by, from any process with ``benchmarks/`` on its path.
COMPUTE_ID = "bench_envs:bench/Compute-v0"


def spin(iterations: int) -> int:
    """Pure-Python busy work: ``iterations`` rounds of integer arithmetic, holding the GIL.

    A fixed amount of work, not a wall-clock deadline: an env preempted by another process
    takes longer, as a real computing env does, instead of finishing on time on a core it
    did not get.

    Args:
        iterations: How many rounds.

    Returns:
        A value depending on every round (so the loop does its work).
    """
    x = 0
    for i in range(iterations):
        x = (x * 31 + i) & 0xFFFF
    return x


def calibrate_work(seconds: float = 0.001, trials: int = 9, warm_up_s: float = 0.3) -> int:
    """The number of :func:`spin` rounds that takes ``seconds`` on this machine, when quiet.

    The CPU first spins for ``warm_up_s`` (an idle core runs at a lower clock for a while: timed
    cold, the rounds would be too few by a third); then the fastest of ``trials`` timings of a
    fixed count is scaled: on a busy machine the fastest is the one least disturbed.

    Args:
        seconds: The time the work should take.
        trials: How many timings to take the fastest of.
        warm_up_s: How long to spin before timing.

    Returns:
        The number of rounds (at least 1).
    """
    probe = 20_000
    end = time.perf_counter() + warm_up_s
    while time.perf_counter() < end:
        spin(probe)
    fastest = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        spin(probe)
        fastest = min(fastest, time.perf_counter() - start)
    return max(1, round(probe * seconds / fastest))


class ComputeEnv(gym.Env):
    """An env that computes: each step does a fixed amount of pure-Python work.

    Observations are 8 floats and actions two choices, so what a vector env adds to the
    work (processes, messages, copies) is small next to it.

    Args:
        work: :func:`spin` rounds per step (:func:`calibrate_work` gives the count for a time).
        episode_steps: The episode is truncated after this many steps.
    """

    def __init__(self, work: int = 20_000, episode_steps: int = 200) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(8,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.work = work
        self.episode_steps = episode_steps
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode; the observation is drawn from the env's generator."""
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, size=8).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Does the step's work, then returns a random observation and the action as reward."""
        spin(self.work)
        self._t += 1
        obs = self.np_random.uniform(-1, 1, size=8).astype(np.float32)
        return obs, float(action), False, self._t >= self.episode_steps, {}


if "bench/Compute-v0" not in gym.registry:
    gym.register("bench/Compute-v0", entry_point=ComputeEnv)
