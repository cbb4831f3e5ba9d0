"""``envserver rollout``'s work: random actions on a vector env, and its tally.

The tally is kept as the rollout goes, so an interrupted rollout still has its partial summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["RandomRollout", "summary_lines"]


class RandomRollout:
    """Steps a vector env with random actions, keeping the tally as it goes.

    Args:
        envs: A ``gymnasium.vector.VectorEnv``.
        seed: Seeds the envs' reset and the action space.
    """

    def __init__(self, envs: Any, seed: int) -> None:
        self.envs = envs
        self.seed = seed
        self.env_steps = 0
        self.host_failures = 0
        self.seconds = 0.0
        self.finished: list[float] = []
        self._returns = np.zeros(envs.num_envs)

    def run(
        self, steps: int, progress: Any = None, check: Callable[[], None] | None = None
    ) -> None:
        """Resets, then takes ``steps`` vector steps (an interrupt leaves the tally so far).

        Args:
            steps: Vector steps to take (each steps every env).
            progress: A ``tqdm`` bar to update with env steps, or None.
            check: Called after each step; it raises to stop the rollout (a signal whose
                exception was lost: ``envserver.cli.interrupts.Interrupts.check``).
        """
        envs = self.envs
        envs.action_space.seed(self.seed)
        envs.reset(seed=self.seed)
        started = time.perf_counter()
        try:
            for _ in range(steps):
                _, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
                self.env_steps += len(rewards)
                self.host_failures += int(np.count_nonzero(infos.get("_host_failure", ())))
                self._returns += rewards
                done = terminations | truncations
                self.finished.extend(self._returns[done].tolist())
                self._returns[done] = 0.0
                if progress is not None:
                    progress.update(len(rewards))
                if check is not None:
                    check()
        finally:
            self.seconds = time.perf_counter() - started

    def summary(self) -> dict[str, Any]:
        """What happened so far: steps, speed, episodes and their mean return."""
        return {
            "env_steps": self.env_steps,
            "host_failures": self.host_failures,
            "seconds": self.seconds,
            "steps_per_second": self.env_steps / self.seconds if self.seconds > 0 else None,
            "episodes": len(self.finished),
            "mean_return": float(np.mean(self.finished)) if self.finished else None,
        }


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """A rollout's summary as the lines ``envserver rollout`` prints (keys may be missing)."""
    hosts = summary.get("hosts")
    lines = [
        f"env:                 {summary['env_id']} x {summary['num_envs']}"
        + ("" if hosts is None else f" on {len(hosts)} host(s)")
    ]
    if "setup_seconds" in summary:
        lines.append(f"setup:               {summary['setup_seconds']:.2f} s")
    if "env_steps" in summary:
        speed = summary["steps_per_second"]
        mean = summary["mean_return"]
        lines += [
            f"env steps:           {summary['env_steps']} in {summary['seconds']:.2f} s",
            f"steps/s:             {'n/a' if speed is None else f'{speed:,.0f}'}",
            f"episodes finished:   {summary['episodes']}",
            f"mean episode return: {'n/a' if mean is None else f'{mean:.2f}'}",
        ]
    if summary.get("host_restarts"):
        lines.append(f"host restarts:       {summary['host_restarts']}")
    if summary.get("envs_moved"):
        lines.append(f"envs moved:          {summary['envs_moved']} (off hosts that drained)")
    return lines
