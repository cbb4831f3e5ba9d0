"""The env of the chaos soak (tests/harness/chaos.py), registered with Gymnasium on import.

Each instance is told apart by a uuid made at construction, and counts its calls (every
``reset`` and ``step``, across episodes) from 1. It says both in every info (``"instance"``,
``"call"``), so the trainer can check that it saw each instance's calls exactly once and in
order. With a ``ledger`` folder, each instance also keeps there, in a file named
``<host pid>-<instance>``, the number of its last call (8 bytes, rewritten before each call
returns): what the host really ran, readable after the host was killed.

Hosts load it with ``envserver serve --import chaos_envs`` (with ``tests/`` on PYTHONPATH), the
trainer by id: ``chaos/Counter-v0``.
"""

from __future__ import annotations

import os
import struct
import uuid
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["ENV_ID", "QUIET_ID", "CounterEnv", "QuietCounterEnv", "instance_of_tag", "read_ledger"]

#: The id the trainer makes the env by.
ENV_ID = "chaos/Counter-v0"
#: The same, saying nothing in its infos (see :class:`QuietCounterEnv`).
QUIET_ID = "chaos/Quiet-v0"

_COUNT = struct.Struct("<q")


class CounterEnv(gym.Env):
    """Short episodes whose infos name the instance and count its calls since construction.

    Args:
        ledger: A folder where the instance writes its last call's number (None: nowhere).
        episode_steps: Episodes are truncated after this many steps.
        terminate_prob: Chance per step that the episode terminates before that.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self, ledger: str | None = None, episode_steps: int = 20, terminate_prob: float = 0.05
    ) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
        self.action_space = spaces.Discrete(2)
        self.episode_steps = episode_steps
        self.terminate_prob = terminate_prob
        self.instance = uuid.uuid4().hex
        self.calls = 0
        self._t = 0
        self._fd: int | None = None
        if ledger is not None:
            path = Path(ledger) / f"{os.getpid()}-{self.instance}"
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.pwrite(self._fd, _COUNT.pack(0), 0)

    def _call(self) -> dict[str, Any]:
        """Counts a call (and writes it to the ledger); returns the info every call carries."""
        self.calls += 1
        if self._fd is not None:
            os.pwrite(self._fd, _COUNT.pack(self.calls), 0)
        return {"instance": self.instance, "call": self.calls}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        info = self._call()
        return np.array([self.calls, 0.0]), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        info = self._call()
        self._t += 1
        terminated = bool(self.np_random.random() < self.terminate_prob)
        truncated = self._t >= self.episode_steps and not terminated
        return np.array([self.calls, float(action)]), 1.0, terminated, truncated, info

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        super().close()


class QuietCounterEnv(CounterEnv):
    """A :class:`CounterEnv` that says nothing in its infos: its observation carries its call
    number and its instance (the first 12 hex digits of the uuid, as a float), so its steps go
    raw with no info entries, the leanest reply there is."""

    def __init__(self, ledger: str | None = None, episode_steps: int = 20) -> None:
        super().__init__(ledger, episode_steps)
        self.tag = float(int(self.instance[:12], 16))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        obs, _ = super().reset(seed=seed, options=options)
        return np.array([obs[0], self.tag]), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, _ = super().step(action)
        return np.array([obs[0], self.tag]), reward, terminated, truncated, {}


def instance_of_tag(tag: float) -> str:
    """The instance prefix a :class:`QuietCounterEnv` observation's tag stands for."""
    return f"{int(tag):012x}"


def read_ledger(ledger: Path) -> dict[str, tuple[int, int]]:
    """What the hosts ran: each instance's ``(host pid, number of its last call)``."""
    found = {}
    for path in ledger.iterdir():
        pid, _, instance = path.name.partition("-")
        data = path.read_bytes()  # empty if the host died before the instance's first write
        calls = _COUNT.unpack(data[: _COUNT.size])[0] if len(data) >= _COUNT.size else 0
        found[instance] = (int(pid), calls)
    return found


gym.register(ENV_ID, entry_point=CounterEnv, disable_env_checker=True)
gym.register(QUIET_ID, entry_point=QuietCounterEnv, disable_env_checker=True)
