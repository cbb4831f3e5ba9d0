"""Adapters for simulators whose state the env itself does not give: which covers an env.

- classic control (:mod:`~envserver.state.classic`): known attributes, exact;
- MuJoCo (:mod:`~envserver.state.physics`): every fixed-size ``MjData`` array, exact;
- ALE (:mod:`~envserver.state.atari`): the emulator's state, exact; with sticky actions, from
  the episode's start plus the actions since.

Each looks at the env's class by name, so that the simulators a host does not run are never
imported.
"""

from __future__ import annotations

import gymnasium as gym

from envserver.state import atari, classic, physics
from envserver.state.mechanism import Mechanism

__all__ = ["adapter_of"]

_ADAPTERS = (classic.mechanism, physics.mechanism, atari.mechanism)


def adapter_of(env: gym.Env) -> Mechanism | None:
    """The mechanism of the first adapter that covers ``env``'s class, or None."""
    name = f"{type(env).__module__}.{type(env).__qualname__}"
    for adapter in _ADAPTERS:
        found = adapter(env, name)
        if found is not None:
            return found
    return None
