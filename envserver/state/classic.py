"""Gymnasium's classic control: envs that keep their state in known attributes.

Restoring these attributes and the env's random generator restores the env bit for bit, its
later ``reset(seed=None)`` calls included (the generator goes on from where it was).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envserver.state.mechanism import Mechanism

__all__ = ["ATTRIBUTES", "mechanism"]

#: Per env class (``module.qualname``), the attributes that hold its state between steps.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "gymnasium.envs.classic_control.cartpole.CartPoleEnv": ("state", "steps_beyond_terminated"),
    "gymnasium.envs.classic_control.pendulum.PendulumEnv": ("state", "last_u"),
    "gymnasium.envs.classic_control.acrobot.AcrobotEnv": ("state",),
    "gymnasium.envs.classic_control.mountain_car.MountainCarEnv": ("state",),
    "gymnasium.envs.classic_control.continuous_mountain_car.Continuous_MountainCarEnv": ("state",),
}


def mechanism(env: gym.Env, name: str) -> Mechanism | None:
    """The mechanism for ``env`` (its class named ``name``), or None if not classic control."""
    attributes = ATTRIBUTES.get(name)
    if attributes is None:
        return None

    def get(e: gym.Env) -> Any:
        return {attribute: _plain(getattr(e, attribute)) for attribute in attributes}

    def put(e: gym.Env, state: Any) -> None:
        for attribute in attributes:
            value = state[attribute]
            setattr(e, attribute, np.array(value) if isinstance(value, np.ndarray) else value)

    return Mechanism("classic control", get, put)


def _plain(value: Any) -> Any:
    """A copy of ``value`` the codec carries (arrays stay arrays; tuples become arrays)."""
    if isinstance(value, tuple):
        return np.asarray(value)
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, np.generic):
        return value.item()
    return value
