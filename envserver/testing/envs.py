"""The small envs of :mod:`envserver.testing`, registered with Gymnasium on import.

They exercise what real envs do to a vector env: structured observation and action spaces,
episodes that end by termination and by truncation, infos with nested dicts, strings, arrays and
keys that only some steps carry, exceptions raised from ``step`` and ``reset``, output and
warnings, steps that wait or compute, and large pixel observations.
"""

from __future__ import annotations

import os
import string
import threading
import time
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "ChattyEnv",
    "DictTupleEnv",
    "EpisodicEnv",
    "FailingEnv",
    "GateEnv",
    "JitterEnv",
    "PixelEnv",
    "RingEnv",
    "RingSpace",
    "SimulatorCrash",
    "ToolEnv",
    "busy_wait",
]


def busy_wait(seconds: float) -> None:
    """Spends ``seconds`` of CPU time, as a compute-bound simulator step does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SimulatorCrash(Exception):
    """An exception type only this module knows (clients see it as RemoteEnvError)."""


class EpisodicEnv(gym.Env):
    """Random-length episodes that end by termination or truncation, with rich infos.

    Args:
        terminate_prob: Chance per step that the episode terminates.
        max_steps: The episode is truncated after this many steps.
        render_mode: None or ``"rgb_array"`` (a tiny frame derived from the state).
        step_delay_s: Seconds each step sleeps (a slow simulator).
        step_gate: A file path; when set, each step waits until that file exists (for tests
            that must control when a step finishes without relying on timing).
        step_started: A file path; when set, each step creates it as it begins (for tests
            that must know a step is under way on the host).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(
        self,
        terminate_prob: float = 0.05,
        max_steps: int = 25,
        render_mode: str | None = None,
        step_delay_s: float = 0.0,
        step_gate: str | None = None,
        step_started: str | None = None,
    ) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float64)
        self.action_space = spaces.Discrete(3)
        self.terminate_prob = terminate_prob
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.step_delay_s = step_delay_s
        self.step_gate = step_gate
        self.step_started = step_started
        self.resets = 0
        self._t = 0
        self._state = np.zeros(4)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.resets += 1
        self._t = 0
        self._state = self.np_random.normal(size=4)
        info: dict[str, Any] = {"resets": self.resets}
        if options and "offset" in options:
            self._state += options["offset"]
            info["offset"] = float(options["offset"])
        return self._state.copy(), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.step_started:
            with open(self.step_started, "a"):
                pass
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.step_gate:
            deadline = time.monotonic() + 120
            while not os.path.exists(self.step_gate):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gate {self.step_gate} never opened")
                time.sleep(0.005)
        self._t += 1
        self._state = self._state + self.np_random.normal(size=4) * 0.1 + int(action)
        terminated = bool(self.np_random.random() < self.terminate_prob)
        truncated = self._t >= self.max_steps and not terminated
        info: dict[str, Any] = {
            "phase": "late" if self._t > self.max_steps // 2 else "early",
            "stats": {"t": self._t, "vec": self._state[:2].copy(), "flag": terminated},
            "score": np.float32(self._state.sum()),
        }
        if self._t % 3 == 0:
            info["bonus"] = {"every_third": self._t, "tag": f"t{self._t}"}
        return self._state.copy(), float(self._state[0]), terminated, truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        frame = np.zeros((4, 6, 3), dtype=np.uint8)
        frame[..., 0] = np.uint8(self._t % 256)
        frame[0, 0] = np.clip(np.abs(self._state[:3]) * 50, 0, 255).astype(np.uint8)
        return frame


class DictTupleEnv(gym.Env):
    """Dict observations with a nested Tuple, and Tuple actions."""

    def __init__(self, max_steps: int = 20) -> None:
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32),
                "pair": spaces.Tuple(
                    (spaces.Discrete(5), spaces.Box(0, 255, shape=(2, 2), dtype=np.uint8))
                ),
                "count": spaces.Discrete(1000),
            }
        )
        self.action_space = spaces.Tuple(
            (spaces.Discrete(3), spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32))
        )
        self.max_steps = max_steps
        self._t = 0
        self._position = np.zeros(3, dtype=np.float32)

    def _obs(self) -> dict[str, Any]:
        return {
            "position": self._position.copy(),
            "pair": (
                int(self.np_random.integers(5)),
                self.np_random.integers(0, 256, size=(2, 2), dtype=np.uint8),
            ),
            "count": self._t,
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._position = self.np_random.uniform(-1, 1, size=3).astype(np.float32)
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        discrete, box = action
        self._t += 1
        self._position = np.clip(
            self._position + np.append(box, discrete - 1).astype(np.float32), -10, 10
        )
        terminated = bool(np.abs(self._position).max() >= 10 or self.np_random.random() < 0.08)
        truncated = self._t >= self.max_steps
        return (
            self._obs(),
            float(-np.abs(self._position).sum()),
            terminated,
            truncated,
            {"t": self._t},
        )


class FailingEnv(gym.Env):
    """Raises on command: in ``step`` at a given step count, in ``reset`` at a given reset.

    Args:
        step_error_at: Raise in the step with this number (1-based) of each episode.
        reset_error_at: Raise in the reset with this number (1-based) of the env's life.
        error: ``"value"`` (ValueError), ``"gym"`` (gymnasium.error.ResetNeeded) or ``"custom"``
            (:class:`SimulatorCrash`).
    """

    def __init__(
        self,
        step_error_at: int | None = None,
        reset_error_at: int | None = None,
        error: str = "value",
    ) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.step_error_at = step_error_at
        self.reset_error_at = reset_error_at
        self.error = error
        self.resets = 0
        self._t = 0

    def _raise(self, where: str) -> None:
        message = f"simulated failure in {where}"
        if self.error == "gym":
            raise gym.error.ResetNeeded(message)
        if self.error == "custom":
            raise SimulatorCrash(message)
        raise ValueError(message)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.resets += 1
        self._t = 0
        if self.reset_error_at is not None and self.resets == self.reset_error_at:
            self._raise("reset")
        return self.np_random.uniform(-1, 1, size=2).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._t += 1
        if self.step_error_at is not None and self._t == self.step_error_at:
            self._raise("step")
        obs = self.np_random.uniform(-1, 1, size=2).astype(np.float32)
        return obs, 1.0, False, self._t >= 50, {}


class PixelEnv(gym.Env):
    """Atari-sized frames (84x84x4 uint8) at an adjustable CPU cost per step.

    Frames are cut from a bank of noise made at reset, so producing one costs a copy, not a
    random draw; the step cost is spent on the CPU, as an emulator would.

    Args:
        step_cost_s: CPU seconds each step spends.
        episode_steps: The episode is truncated after this many steps.
        dict_obs: Observations as ``{"pixels": frame, "t": [step count]}`` (float32), a Dict
            space of two leaves, one large and one small.
    """

    def __init__(
        self, step_cost_s: float = 0.0, episode_steps: int = 1000, dict_obs: bool = False
    ) -> None:
        pixels = spaces.Box(0, 255, shape=(84, 84, 4), dtype=np.uint8)
        self.dict_obs = dict_obs
        self.observation_space: spaces.Space = pixels
        if dict_obs:
            t = spaces.Box(0, np.inf, shape=(1,), dtype=np.float32)
            self.observation_space = spaces.Dict({"pixels": pixels, "t": t})
        self.action_space = spaces.Discrete(6)
        self.step_cost_s = step_cost_s
        self.episode_steps = episode_steps
        self._bank = np.zeros((96, 84, 4), dtype=np.uint8)
        self._t = 0

    def _obs(self, frame: np.ndarray) -> Any:
        if self.dict_obs:
            return {"pixels": frame, "t": np.array([self._t], dtype=np.float32)}
        return frame

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._bank = self.np_random.integers(0, 256, size=(96, 84, 4), dtype=np.uint8)
        self._t = 0
        return self._obs(self._bank[:84].copy()), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.step_cost_s:
            busy_wait(self.step_cost_s)
        self._t += 1
        offset = (self._t * 7 + int(action)) % 12
        frame = self._bank[offset : offset + 84].copy()
        reward = float(action == self._t % 6)
        return self._obs(frame), reward, False, self._t >= self.episode_steps, {}


class ChattyEnv(gym.Env):
    """An env that says things, as simulators do: prints, warns, and writes from native code.

    Each reset prints ``reset <seed>`` and warns once (a ``UserWarning``); each step prints
    ``step <n>`` and ``hello from every env`` (the same line in every env), and writes ``native
    <n>`` straight to file descriptor 2 as C code would.

    Args:
        print_bytes: More characters printed by each step, on one line (a chatty env).
        out_of_space: Observations outside the observation space, for Gymnasium's env checker
            to warn about.
        episode_steps: The episode is truncated after this many steps.
    """

    def __init__(
        self, print_bytes: int = 0, out_of_space: bool = False, episode_steps: int = 100
    ) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.print_bytes = print_bytes
        self.out_of_space = out_of_space
        self.episode_steps = episode_steps
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.full(2, 5.0 if self.out_of_space else 0.5, dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        print(f"reset {seed}")
        warnings.warn("ChattyEnv was reset", UserWarning, stacklevel=1)
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._t += 1
        print(f"step {self._t}")
        print("hello from every env")
        if self.print_bytes:
            print("x" * self.print_bytes)
        os.write(2, f"native {self._t}\n".encode())
        return self._obs(), 1.0, False, self._t >= self.episode_steps, {}

    def shout(self, text: str) -> None:
        """Prints ``text``, then fails (with a ``ZeroDivisionError``)."""
        print(text)
        raise ZeroDivisionError(text)


class JitterEnv(gym.Env):
    """A slow simulator with heavy-tailed step times: it waits (sleeps) for each step.

    Most steps take about ``step_s``; with probability ``slow_prob`` a step takes
    ``slow_factor`` times longer, the way a remote simulator or a physics engine under
    contact sometimes does. What first-ready batches are for.

    Args:
        step_s: The usual step time.
        slow_prob: The chance that a step is slow.
        slow_factor: How much slower a slow step is.
        episode_steps: The episode is truncated after this many steps.
    """

    def __init__(
        self,
        step_s: float = 0.001,
        slow_prob: float = 0.1,
        slow_factor: float = 10.0,
        episode_steps: int = 200,
    ) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(8,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.step_s = step_s
        self.slow_prob = slow_prob
        self.slow_factor = slow_factor
        self.episode_steps = episode_steps
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, size=8).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        slow = self.np_random.random() < self.slow_prob
        if self.step_s:
            time.sleep(self.step_s * (self.slow_factor if slow else 1.0))
        self._t += 1
        obs = self.np_random.uniform(-1, 1, size=8).astype(np.float32)
        return obs, float(action), False, self._t >= self.episode_steps, {}


class RingSpace(gym.Space):
    """A user-defined space (none of Gymnasium's): the cells of a ring, as plain ints.

    Gymnasium batches a space it does not know as a tuple with one value per env, and so
    must every vector env.

    Args:
        size: The number of cells.
        seed: The seed of its random generator.
    """

    def __init__(self, size: int = 6, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.size = size

    def sample(self, mask: Any = None, probability: Any = None) -> int:
        return int(self.np_random.integers(self.size))

    def contains(self, x: Any) -> bool:
        return isinstance(x, int) and 0 <= x < self.size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RingSpace) and other.size == self.size

    def __hash__(self) -> int:
        return hash(("RingSpace", self.size))

    def __repr__(self) -> str:
        return f"RingSpace({self.size})"


class RingEnv(gym.Env):
    """A walk on a ring whose observation and action spaces are user-defined (:class:`RingSpace`).

    The action is how many cells to move; reaching cell 0 pays 1 and may end the episode.

    Args:
        size: The number of cells.
        nested: Observe ``{"cell": <RingSpace>, "noise": <Box>}`` instead of the cell alone.
    """

    def __init__(self, size: int = 6, nested: bool = False) -> None:
        cell = RingSpace(size)
        noise = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = spaces.Dict({"cell": cell, "noise": noise}) if nested else cell
        self.action_space = RingSpace(size)
        self.size = size
        self.nested = nested
        self._cell = 0
        self._t = 0

    def _obs(self) -> Any:
        if not self.nested:
            return self._cell
        return {"cell": self._cell, "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32)}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._cell = int(self.np_random.integers(1, self.size))
        self._t = 0
        return self._obs(), {"cell": self._cell}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._cell = (self._cell + int(action)) % self.size
        self._t += 1
        home = self._cell == 0
        terminated = home and bool(self.np_random.random() < 0.5)
        return self._obs(), float(home), terminated, self._t >= 15, {"cell": self._cell}


class ToolEnv(gym.Env):
    """A text env whose steps wait, as an LLM agent's tool calls do: guess the number.

    The observation is text (``"guess a number below 100"``, ``"higher"``, ``"lower"``,
    ``"correct"``, ``"not a number"``), the action a text of digits. Each step waits (sleeps,
    the GIL released) about ``wait_s``, by a factor from 0.5 to 1.5 drawn from the env's RNG.
    A correct guess ends the episode with a reward of 1; every other guess costs 0.01; the
    episode is truncated after ``max_turns`` guesses.

    Args:
        wait_s: The usual wait of a step.
        below: The secret is drawn from ``[0, below)`` at each reset.
        max_turns: The most guesses in an episode.
        drifts: Whether its answers do not repeat, as a tool whose answers change between
            calls: each ends with the id of the process that gave it, which no state holds.
    """

    def __init__(
        self, wait_s: float = 0.0, below: int = 100, max_turns: int = 12, drifts: bool = False
    ) -> None:
        self.observation_space = spaces.Text(32, charset=string.ascii_lowercase + " 0123456789")
        self.action_space = spaces.Text(8, min_length=1, charset=string.digits)
        self.wait_s, self.below, self.max_turns, self.drifts = wait_s, below, max_turns, drifts
        self._secret = 0
        self._turns = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._secret = int(self.np_random.integers(self.below))
        self._turns = 0
        return f"guess a number below {self.below}", {"turns": 0}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.wait_s:
            time.sleep(self.wait_s * (0.5 + self.np_random.random()))
        self._turns += 1
        truncated = self._turns >= self.max_turns
        info = {"turns": self._turns}
        said = f" {os.getpid()}" if self.drifts else ""
        if not action.isdigit():
            return "not a number" + said, -0.01, False, truncated, info
        guess = int(action)
        if guess == self._secret:
            return "correct" + said, 1.0, True, False, info
        answer = "higher" if guess < self._secret else "lower"
        return answer + said, -0.01, False, truncated, info

    def think(self, seconds: float) -> int:
        """Waits ``seconds`` (a slow method of the env's own, for ``call``); its turns so far."""
        time.sleep(seconds)
        return self._turns

    def get_state(self) -> dict[str, int]:
        """What it keeps between steps (its RNG is taken beside it): for snapshots and forks."""
        return {"secret": self._secret, "turns": self._turns}

    def set_state(self, state: dict[str, int]) -> None:
        """Takes back what :meth:`get_state` gave."""
        self._secret, self._turns = int(state["secret"]), int(state["turns"])


class GateEnv(gym.Env):
    """Envs whose steps meet: a ``"wait"`` env's step waits for an ``"open"`` env's step.

    The gate is shared by the envs of one process that name it. It shows, with no clock, that
    a host steps two envs at the same time: one after another, the waiting one would wait its
    whole timeout.

    Args:
        role: ``"wait"`` or ``"open"``.
        gate: The gate's name.
        timeout_s: The longest a ``"wait"`` step waits; its info says whether the gate opened.
    """

    _gates: dict[str, threading.Event] = {}
    _lock = threading.Lock()

    observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, role: str = "wait", gate: str = "gate", timeout_s: float = 60.0) -> None:
        if role not in ("wait", "open"):
            raise ValueError(f"role must be 'wait' or 'open', got {role!r}")
        self.role, self.timeout_s = role, timeout_s
        with GateEnv._lock:
            self._gate = GateEnv._gates.setdefault(gate, threading.Event())

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.role == "open":
            self._gate.set()
            return np.ones(1, np.float32), 0.0, False, False, {"opened": True}
        opened = self._gate.wait(self.timeout_s)
        return np.ones(1, np.float32), 1.0, False, False, {"opened": opened}


gym.register("envserver/Episodic-v0", entry_point=EpisodicEnv)
gym.register("envserver/Ring-v0", entry_point=RingEnv)
gym.register("envserver/Pixels-v0", entry_point=PixelEnv)
gym.register("envserver/Jitter-v0", entry_point=JitterEnv)
gym.register("envserver/DictTuple-v0", entry_point=DictTupleEnv)
gym.register("envserver/Failing-v0", entry_point=FailingEnv)
gym.register("envserver/Chatty-v0", entry_point=ChattyEnv)
gym.register("envserver/Tool-v0", entry_point=ToolEnv)
gym.register("envserver/Gate-v0", entry_point=GateEnv)
