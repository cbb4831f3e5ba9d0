"""Gymnasium's MuJoCo envs: every fixed-size field of the simulation's ``MjData``, as arrays.

``MujocoEnv.set_state(qpos, qvel)`` is not the whole state, and neither is MuJoCo's integration
state: fields derived from the positions (``xpos``, ``cfrc_ext``, sensor data ...) lag them by
a substep after ``mj_step``, and the envs read them between steps (Ant's reward reads ``xpos``
before it steps). So a snapshot holds every array of ``MjData`` whose size the model fixes, and
the time. The constraint arrays sized by the contacts of the moment (``efc_*``, islands, the
contact list) are not carried: ``mj_step`` computes them anew before it uses them; a restore
recomputes them for the restored positions with ``mj_forward``, then puts every carried array
back, derived ones included. Exact, rewards included, on the same MuJoCo version (checked) and
CPU architecture (the fingerprint's).
"""

from __future__ import annotations

import weakref
from typing import Any

import gymnasium as gym
import numpy as np

from envserver.errors import StateMismatchError
from envserver.state.mechanism import Mechanism, check_version

__all__ = ["mechanism"]

#: Where Gymnasium's own MuJoCo envs live (others may keep state beside ``MjData``).
MODULE = "gymnasium.envs.mujoco."

# Per env, the names of the MjData arrays whose shape the model fixes (found once per env).
_FIXED: weakref.WeakKeyDictionary[gym.Env, dict[str, tuple[tuple[int, ...], np.dtype]]] = (
    weakref.WeakKeyDictionary()
)


def mechanism(env: gym.Env, name: str) -> Mechanism | None:
    """The mechanism for a Gymnasium MuJoCo env (its class named ``name``), or None."""
    if not name.startswith(MODULE) or not hasattr(env, "data") or not hasattr(env, "model"):
        return None
    import mujoco  # only where a MuJoCo env runs

    def get(e: Any) -> Any:
        data = e.data
        arrays = {field: getattr(data, field).copy() for field in _fixed(e)}
        return {"mujoco": mujoco.__version__, "time": float(data.time), "arrays": arrays}

    def check(e: Any, state: Any) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("arrays"), dict):
            raise StateMismatchError("a MuJoCo state without its arrays")
        check_version(state, "mujoco", "MuJoCo", mujoco.__version__)
        arrays = state["arrays"]
        for field, (shape, dtype) in _fixed(e).items():
            value = arrays.get(field)
            if not isinstance(value, np.ndarray) or value.shape != shape or value.dtype != dtype:
                raise StateMismatchError(
                    f"the snapshot's MjData.{field} is not a {dtype} array of shape {shape}"
                )

    def put(e: Any, state: Any) -> None:
        data, arrays = e.data, state["arrays"]
        fields = _fixed(e)
        for field in fields:
            getattr(data, field)[...] = arrays[field]
        data.time = state["time"]
        mujoco.mj_forward(e.model, data)  # the contact-sized arrays, for these positions
        for field in fields:  # and the derived fields back as they were (they lag a substep)
            getattr(data, field)[...] = arrays[field]

    return Mechanism("mujoco", get, put, check)


def _fixed(env: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The MjData arrays of ``env`` whose shape its model fixes: name -> (shape, dtype).

    Those whose shape a fresh ``MjData`` of the model has too; the others are sized by the
    contacts of the moment (they are empty in a fresh one).
    """
    fields = _FIXED.get(env)
    if fields is None:
        import mujoco

        data, fresh = env.data, mujoco.MjData(env.model)
        fields = {}
        for field in dir(fresh):
            value = getattr(fresh, field, None) if not field.startswith("_") else None
            if (
                isinstance(value, np.ndarray)
                and value.size
                and value.shape == getattr(data, field).shape
            ):
                fields[field] = (value.shape, value.dtype)
        _FIXED[env] = fields
    return fields
