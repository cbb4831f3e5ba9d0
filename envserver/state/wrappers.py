"""What Gymnasium's own stateful wrappers keep, taken and given back as plain data.

Each handler reads and writes the attributes the wrapper keeps between steps (some of them
Gymnasium's private ones: no public accessor exists; the tests pin them on the Gymnasium this
project installs). A wrapper listed in :data:`STATELESS` keeps nothing between steps. Any other
wrapper without ``get_state``/``set_state`` hooks is not covered.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import wrappers
from gymnasium.wrappers.utils import RunningMeanStd

__all__ = ["HANDLERS", "STATELESS", "Handler"]

#: A wrapper's state getter and setter.
Handler = tuple[Callable[[Any], Any], Callable[[Any, Any], None]]


def _copy(value: Any) -> Any:
    """A copy the wrapper cannot change under the snapshot (arrays, maps and lists of them)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value


def _time_limit() -> Handler:
    def get(w: wrappers.TimeLimit) -> Any:
        return {"elapsed_steps": w._elapsed_steps}

    def put(w: wrappers.TimeLimit, state: Any) -> None:
        w._elapsed_steps = state["elapsed_steps"]

    return get, put


def _order_enforcing() -> Handler:
    def get(w: wrappers.OrderEnforcing) -> Any:
        return {"has_reset": w._has_reset}

    def put(w: wrappers.OrderEnforcing, state: Any) -> None:
        w._has_reset = bool(state["has_reset"])

    return get, put


#: PassiveEnvChecker's flags, each set once its check ran.
_CHECKER_FLAGS = ("checked_reset", "checked_step", "checked_render", "checked_data_reuse")


def _passive_env_checker() -> Handler:
    """Gymnasium's checker: a restored stack is taken as checked, and is not checked again.

    Its checks run once per env object, on its first reset, step and render; the step's and
    the data-reuse check compare with objects of earlier calls in the same process, which a
    restored stack has not made. So a restore marks every check done (they ran, or will run,
    where the snapshot was taken), and the state it takes is nothing.
    """

    def get(w: wrappers.PassiveEnvChecker) -> Any:
        return {}

    def put(w: wrappers.PassiveEnvChecker, state: Any) -> None:
        for flag in _CHECKER_FLAGS:
            setattr(w, flag, True)

    return get, put


def _record_episode_statistics() -> Handler:
    def get(w: wrappers.RecordEpisodeStatistics) -> Any:
        return {
            "episode_count": w.episode_count,
            "episode_returns": float(w.episode_returns),
            "episode_lengths": w.episode_lengths,
            # How long the episode has run: its start is this process's clock, not another's.
            "episode_elapsed_s": time.perf_counter() - w.episode_start_time,
            "time_queue": list(w.time_queue),
            "return_queue": [float(r) for r in w.return_queue],
            "length_queue": list(w.length_queue),
        }

    def put(w: wrappers.RecordEpisodeStatistics, state: Any) -> None:
        w.episode_count = state["episode_count"]
        w.episode_returns = state["episode_returns"]
        w.episode_lengths = state["episode_lengths"]
        w.episode_start_time = time.perf_counter() - state["episode_elapsed_s"]
        for name in ("time_queue", "return_queue", "length_queue"):
            queue: deque = getattr(w, name)
            queue.clear()
            queue.extend(state[name])

    return get, put


def _autoreset() -> Handler:
    def get(w: wrappers.Autoreset) -> Any:
        return {"autoreset": bool(w.autoreset)}

    def put(w: wrappers.Autoreset, state: Any) -> None:
        w.autoreset = bool(state["autoreset"])

    return get, put


def _frame_stack() -> Handler:
    def get(w: wrappers.FrameStackObservation) -> Any:
        return {"queue": _copy(list(w.obs_queue)), "padding": _copy(w.padding_value)}

    def put(w: wrappers.FrameStackObservation, state: Any) -> None:
        w.padding_value = _copy(state["padding"])
        w.obs_queue.clear()
        w.obs_queue.extend(_copy(state["queue"]))

    return get, put


def _delay() -> Handler:
    def get(w: wrappers.DelayObservation) -> Any:
        return {"queue": _copy(list(w.observation_queue))}

    def put(w: wrappers.DelayObservation, state: Any) -> None:
        w.observation_queue.clear()
        w.observation_queue.extend(_copy(state["queue"]))

    return get, put


def _time_aware() -> Handler:
    def get(w: wrappers.TimeAwareObservation) -> Any:
        return {"timesteps": int(w.timesteps)}

    def put(w: wrappers.TimeAwareObservation, state: Any) -> None:
        w.timesteps = int(state["timesteps"])

    return get, put


def _running(rms: RunningMeanStd) -> dict[str, Any]:
    return {"mean": np.array(rms.mean), "var": np.array(rms.var), "count": float(rms.count)}


def _set_running(rms: RunningMeanStd, state: dict[str, Any]) -> None:
    rms.mean, rms.var, rms.count = np.array(state["mean"]), np.array(state["var"]), state["count"]


def _normalize_observation() -> Handler:
    """Its running statistics (``update_running_mean`` is the trainer's setting: kept too)."""

    def get(w: wrappers.NormalizeObservation) -> Any:
        return {"rms": _running(w.obs_rms), "update": bool(w.update_running_mean)}

    def put(w: wrappers.NormalizeObservation, state: Any) -> None:
        _set_running(w.obs_rms, state["rms"])
        w.update_running_mean = bool(state["update"])

    return get, put


def _normalize_reward() -> Handler:
    def get(w: wrappers.NormalizeReward) -> Any:
        return {
            "rms": _running(w.return_rms),
            "discounted": np.array(w.discounted_reward),
            "update": bool(w.update_running_mean),
        }

    def put(w: wrappers.NormalizeReward, state: Any) -> None:
        _set_running(w.return_rms, state["rms"])
        w.discounted_reward = np.array(state["discounted"])
        w.update_running_mean = bool(state["update"])

    return get, put


def _max_and_skip() -> Handler:
    """Its buffer of the last two frames (an episode that ends early keeps older ones)."""

    def get(w: wrappers.MaxAndSkipObservation) -> Any:
        return {"frames": w._obs_buffer.copy()}

    def put(w: wrappers.MaxAndSkipObservation, state: Any) -> None:
        w._obs_buffer[...] = state["frames"]

    return get, put


def _sticky_action() -> Handler:
    def get(w: wrappers.StickyAction) -> Any:
        return {
            "last_action": _copy(w.last_action),
            "sticky": bool(w.is_sticky_actions),
            "repeats": int(w.num_repeats),
            "taken": int(w.repeats_taken),
        }

    def put(w: wrappers.StickyAction, state: Any) -> None:
        w.last_action = _copy(state["last_action"])
        w.is_sticky_actions = bool(state["sticky"])
        w.num_repeats, w.repeats_taken = int(state["repeats"]), int(state["taken"])

    return get, put


def _atari_preprocessing() -> Handler:
    def get(w: wrappers.AtariPreprocessing) -> Any:
        return {
            "frames": _copy(w.obs_buffer),
            "lives": int(w.lives),
            "game_over": bool(w.game_over),
        }

    def put(w: wrappers.AtariPreprocessing, state: Any) -> None:
        for buffer, frame in zip(w.obs_buffer, state["frames"], strict=True):
            buffer[...] = frame
        w.lives, w.game_over = int(state["lives"]), bool(state["game_over"])

    return get, put


#: The handler of each stateful wrapper class (exactly that class, not its subclasses).
HANDLERS: dict[type[gym.Wrapper], Handler] = {
    wrappers.TimeLimit: _time_limit(),
    wrappers.OrderEnforcing: _order_enforcing(),
    wrappers.PassiveEnvChecker: _passive_env_checker(),
    wrappers.RecordEpisodeStatistics: _record_episode_statistics(),
    wrappers.Autoreset: _autoreset(),
    wrappers.FrameStackObservation: _frame_stack(),
    wrappers.DelayObservation: _delay(),
    wrappers.TimeAwareObservation: _time_aware(),
    wrappers.NormalizeObservation: _normalize_observation(),
    wrappers.NormalizeReward: _normalize_reward(),
    wrappers.MaxAndSkipObservation: _max_and_skip(),
    wrappers.StickyAction: _sticky_action(),
    wrappers.AtariPreprocessing: _atari_preprocessing(),
}

#: Wrappers that keep nothing between steps (exactly these classes).
STATELESS: frozenset[type[gym.Wrapper]] = frozenset(
    {
        wrappers.ClipAction,
        wrappers.RescaleAction,
        wrappers.FlattenObservation,
        wrappers.DtypeObservation,
        wrappers.TransformObservation,
        wrappers.TransformAction,
        wrappers.TransformReward,
        wrappers.ClipReward,
        wrappers.ResizeObservation,
        wrappers.ReshapeObservation,
        wrappers.GrayscaleObservation,
        wrappers.RescaleObservation,
        wrappers.DiscretizeAction,
    }
)
