"""What the trainer gave each env, kept to be given again to envs re-made after a host failure.

Per env: the attributes set with ``set_attr`` (the last value of each, in the order they were
last set), the seed of its last seeded reset, the options of its last reset, and how often it
was re-made. A re-made env gets, in this order: every attribute again (one ``SET_ATTR`` per
``set_attr`` call still in effect), then at its first reset (an autoreset or the trainer's),
where that reset gives none, the options of the lost env's last reset and the seed
:func:`derived_seed` gives.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from envserver.wire.bodies import SetAttr

__all__ = ["EnvMemory", "derived_seed"]


def derived_seed(last_seed: int | None, restarts: int) -> int | None:
    """The seed of an env's first reset after its ``restarts``-th re-make.

    Derived from the seed the env was last reset with, so a rerun reproduces, and from the
    restart count, so a second re-make does not repeat the first; envs seeded apart stay
    apart (``numpy.random.SeedSequence`` mixes both). An env never seeded stays unseeded.
    """
    if last_seed is None:
        return None
    state = np.random.SeedSequence(last_seed, spawn_key=(restarts,)).generate_state(1)
    return int(state[0])


def _snapshot(value: Any) -> Any:
    """A copy to replay later, unaffected by what the trainer does to its own object."""
    try:
        return copy.deepcopy(value)
    except Exception:  # not copyable: replay the object itself
        return value


class EnvMemory:
    """Remembers, per env, what a re-made env must be given again.

    Args:
        num_envs: The number of envs.
    """

    def __init__(self, num_envs: int) -> None:
        self._seeds: list[int | None] = [None] * num_envs
        self._options: list[dict[str, Any] | None] = [None] * num_envs
        self._restarts = [0] * num_envs
        # Per env: (name, outermost) -> (order of the set_attr call, value).
        self._attributes: list[dict[tuple[str, bool], tuple[int, Any]]] = [
            {} for _ in range(num_envs)
        ]
        self._calls = itertools.count()

    def reset(
        self, ids: Iterable[int], seeds: Sequence[int | None], options: dict[str, Any] | None
    ) -> None:
        """Notes a reset of ``ids`` (seeds in the same order; None keeps the last seed)."""
        options = _snapshot(options) if options else None
        for i, seed in zip(ids, seeds):
            if seed is not None:
                self._seeds[i] = seed
            self._options[i] = options

    def set_attr(self, name: str, values: dict[int, Any], outermost: bool) -> None:
        """Notes a ``set_attr`` call: ``values`` by env index."""
        call = next(self._calls)
        for i, value in values.items():
            attributes = self._attributes[i]
            attributes.pop((name, outermost), None)  # moves to the end: the order last set
            attributes[(name, outermost)] = (call, _snapshot(value))

    def set_attr_bodies(self, start: int, stop: int) -> list[SetAttr]:
        """``SET_ATTR`` bodies that set the attributes of envs ``start..stop-1`` again.

        One per ``set_attr`` call still in effect for them, in call order; env ids are local
        to the block.
        """
        calls: dict[int, SetAttr] = {}
        for local, attributes in enumerate(self._attributes[start:stop]):
            for (name, outermost), (call, value) in attributes.items():
                body = calls.setdefault(call, SetAttr(name, [], [], outermost))
                body.values.append(value)
                body.env_ids.append(local)
        return [calls[call] for call in sorted(calls)]

    def first_resets(self, start: int, stop: int) -> list[list[Any]]:
        """``[seed, options]`` of the first reset of envs ``start..stop-1`` made anew."""
        return [
            [derived_seed(self._seeds[i], self._restarts[i] + 1), self._options[i]]
            for i in range(start, stop)
        ]

    def remade(self, start: int, stop: int) -> None:
        """Counts a re-make of envs ``start..stop-1`` (once it succeeded)."""
        for i in range(start, stop):
            self._restarts[i] += 1
