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
from gymnasium import wrappers

__all__ = ["HANDLERS", "STATELESS", "Handler"]

#: A wrapper's state getter and setter.
Handler = tuple[Callable[[Any], Any], Callable[[Any, Any], None]]


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


#: The handler of each stateful wrapper class (exactly that class, not its subclasses).
HANDLERS: dict[type[gym.Wrapper], Handler] = {
    wrappers.TimeLimit: _time_limit(),
    wrappers.OrderEnforcing: _order_enforcing(),
    wrappers.PassiveEnvChecker: _passive_env_checker(),
    wrappers.RecordEpisodeStatistics: _record_episode_statistics(),
    wrappers.Autoreset: _autoreset(),
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
    }
)
