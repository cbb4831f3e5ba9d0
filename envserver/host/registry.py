"""Gymnasium's registry while a MAKE makes its envs: the trainer's specs, and a hint.

A MAKE may carry env specs the trainer registered (``"specs"``, pickled, so only to hosts that
allow pickle): :func:`registered` puts them in Gymnasium's registry while the session's envs are
made, and takes them out again, so one session's specs never reach another's. An id the host
does not know raises Gymnasium's own error with a line on how to make the host know it
(:func:`hinted`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

__all__ = ["hinted", "registered"]

#: Gymnasium's errors for an id its registry does not hold.
UNKNOWN_ID = (gym.error.NameNotFound, gym.error.NamespaceNotFound)


@contextlib.contextmanager
def registered(specs: Sequence[EnvSpec]) -> Iterator[None]:
    """Gymnasium's registry holds ``specs`` (over its own of the same ids) while in the block.

    A module imported meanwhile (an entry point's) may register the same ids again: without
    Gymnasium's warning that it overrides them, and its registration stays.
    """
    registry = gym.envs.registration.registry
    before = {spec.id: registry.get(spec.id) for spec in specs}
    registry.update((spec.id, spec) for spec in specs)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*Overriding environment", UserWarning)
            yield
    finally:
        for spec in specs:
            if registry.get(spec.id) is not spec:  # registered anew meanwhile
                continue
            if before[spec.id] is None:
                del registry[spec.id]
            else:
                registry[spec.id] = before[spec.id]


def hinted(factory: Callable[[], gym.Env], env_id: str | None) -> Callable[[], gym.Env]:
    """``factory``, whose error for an unknown id says how the host would know it.

    Args:
        factory: Makes one env.
        env_id: The id it makes (None: a factory of the trainer's, its id unknown here).
    """

    def make() -> gym.Env:
        try:
            return factory()
        except UNKNOWN_ID as exc:
            module, colon, _ = (env_id or "").rpartition(":")
            if colon:
                exc.args = (f"{exc} Importing {module} on this host did not register it.",)
            else:
                asked = f"'MODULE:{env_id}'" if env_id is not None else "'MODULE:ID'"
                exc.args = (
                    f"{exc} This host does not have it registered: start it with `envserver "
                    f"serve --import MODULE` (MODULE: the module that registers it), or ask for "
                    f"{asked}",
                )
            raise

    return make
