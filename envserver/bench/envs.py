"""Envs of the benchmark's own, registered with Gymnasium on import.

Hosts make them by ``envserver.bench.envs:bench/Compute-v0``: the ``envserver.bench.envs:``
prefix has ``gymnasium.make`` import this module first, which any process with envserver
installed can.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

from envserver.testing import JitterEnv

__all__ = ["COMPUTE_ID", "ComputeEnv", "calibrate_work", "spin"]

#: The id to make :class:`ComputeEnv` by, from any process with envserver installed.
COMPUTE_ID = "envserver.bench.envs:bench/Compute-v0"


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


class ComputeEnv(JitterEnv):
    """An env that computes: each step does a fixed amount of pure-Python work.

    The 1 ms-step env's observations, actions and episodes (8 floats, two choices), with work
    in place of its sleep, so that what a vector env adds to the work (processes, messages,
    copies) is small next to it.

    Args:
        work: :func:`spin` rounds per step (:func:`calibrate_work` gives the count for a time).
        episode_steps: The episode is truncated after this many steps.
    """

    def __init__(self, work: int = 20_000, episode_steps: int = 200) -> None:
        super().__init__(step_s=0.0, slow_prob=0.0, episode_steps=episode_steps)
        self.work = work

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Does the step's work, then the 1 ms-step env's step without its wait."""
        spin(self.work)
        return super().step(action)


gym.register("bench/Compute-v0", entry_point=ComputeEnv)
