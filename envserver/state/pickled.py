"""The mechanism of hosts started with ``--allow-pickle``: a layer's attributes, pickled.

A host that allows pickle runs what its peers send anyway (its clients are trusted), so a layer
no other mechanism covers may have its attributes (all but the layer it wraps) carried as a
pickle, and unpickled into the same layer of another stack on a host that allows pickle too.
Never an ``EzPickle`` layer (Gymnasium's MuJoCo and Box2D envs, ALE's): those unpickle to a
fresh env, and their attributes hold simulator objects that pickle no better (such an env is
re-created by its reset: :mod:`~envserver.state.replayed`).

It comes after the hooks, handlers and adapters, and, where pickle is allowed, before the
replay of a reset: it takes the env at any moment (a restore replays nothing, a snapshot does
not grow with the episode), with what the env keeps across its episodes (a count of its
resets), which a reset run again does not re-create.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle
from gymnasium.utils import EzPickle

from envserver.errors import StateMismatchError
from envserver.state.mechanism import Mechanism

__all__ = ["NAME", "mechanism"]

#: What a snapshot records the mechanism as.
NAME = "pickle"

#: The attribute a wrapper holds the layer it wraps in (that layer has a state of its own).
_INNER = "env"


def mechanism(layer: Any, name: str) -> Mechanism | None:
    """The pickle mechanism for ``layer`` (its class named ``name``); None for an ``EzPickle``."""
    if isinstance(layer, EzPickle):
        return None

    def get(e: Any) -> Any:
        return cloudpickle.dumps({k: v for k, v in vars(e).items() if k != _INNER})

    def check(e: Any, state: Any) -> None:
        if not isinstance(state, bytes):
            raise StateMismatchError(f"{name}'s pickled state is not bytes")

    def put(e: Any, state: Any) -> None:
        attributes = pickle.loads(state)
        if not isinstance(attributes, dict):
            raise StateMismatchError(f"{name}'s pickled state is not its attributes")
        vars(e).update(attributes)

    return Mechanism(NAME, get, put, check)
