"""The last mechanism, on hosts started with ``--allow-pickle``: a layer's attributes, pickled.

A host that allows pickle runs what its peers send anyway (its clients are trusted), so a layer
no other mechanism covers may have its attributes (all but the layer it wraps) carried as a
pickle, and unpickled into the same layer of another stack on a host that allows pickle too.
Never an ``EzPickle`` layer (Gymnasium's MuJoCo and Box2D envs, ALE's): those unpickle to a
fresh env, and their attributes hold simulator objects that pickle no better.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle
from gymnasium.utils import EzPickle

from envserver.errors import StateMismatchError, UnsupportedStateError
from envserver.state.mechanism import Mechanism

__all__ = ["mechanism"]

#: The attribute a wrapper holds the layer it wraps in (that layer has a state of its own).
_INNER = "env"


def mechanism(layer: Any, name: str) -> Mechanism:
    """The pickle mechanism for ``layer`` (its class named ``name``).

    Raises:
        UnsupportedStateError: If the layer is an ``EzPickle`` (never pickled).
    """
    if isinstance(layer, EzPickle):
        raise UnsupportedStateError(
            f"{name} keeps state no snapshot mechanism covers, and is an EzPickle: its pickle "
            "makes a fresh env, not this one"
        )

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

    return Mechanism("pickle", get, put, check)
