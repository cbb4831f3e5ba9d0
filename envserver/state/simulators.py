"""Adapters for envs that keep their state in known attributes: Gymnasium's classic control.

Restoring these attributes and the env's random generator restores the env bit for bit, its
later ``reset(seed=None)`` calls included (the generator goes on from where it was).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["ATTRIBUTES", "adapter_of"]

#: Per env class (``module.qualname``), the attributes that hold its state between steps.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "gymnasium.envs.classic_control.cartpole.CartPoleEnv": ("state", "steps_beyond_terminated"),
    "gymnasium.envs.classic_control.pendulum.PendulumEnv": ("state", "last_u"),
    "gymnasium.envs.classic_control.acrobot.AcrobotEnv": ("state",),
    "gymnasium.envs.classic_control.mountain_car.MountainCarEnv": ("state",),
    "gymnasium.envs.classic_control.continuous_mountain_car.Continuous_MountainCarEnv": ("state",),
}


def _name(env: gym.Env) -> str:
    return f"{type(env).__module__}.{type(env).__qualname__}"


def adapter_of(env: gym.Env) -> tuple[str, Any, Any] | None:
    """``(name, get, put)`` for ``env``'s class, or None if no adapter covers it."""
    attributes = ATTRIBUTES.get(_name(env))
    if attributes is None:
        return None

    def get(e: gym.Env) -> Any:
        return {name: _plain(getattr(e, name)) for name in attributes}

    def put(e: gym.Env, state: Any) -> None:
        for name in attributes:
            value = state[name]
            setattr(e, name, np.array(value) if isinstance(value, np.ndarray) else value)

    return "classic control", get, put


def _plain(value: Any) -> Any:
    """A copy of ``value`` the codec carries (arrays stay arrays; tuples become arrays)."""
    if isinstance(value, tuple):
        return np.asarray(value)
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, np.generic):
        return value.item()
    return value
