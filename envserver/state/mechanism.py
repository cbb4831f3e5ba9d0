"""What a snapshot mechanism is: how one layer's state is taken, checked and given back."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, NamedTuple

from envserver.errors import StateMismatchError

__all__ = ["Exact", "Mechanism", "check_version", "ignore", "nothing"]


def nothing(_layer: Any) -> None:
    """The state of a layer that keeps none of its own: None."""
    return None


def ignore(_layer: Any, _state: Any) -> None:
    """Puts (or checks) nothing."""
    return None


class Exact(enum.Enum):
    """When the state a mechanism takes gives its layer back exactly.

    Attributes:
        ANYTIME: At any moment.
        AFTER_RESET: Only right after a reset (ALE with sticky actions): a snapshot of the stack
            is its state at the episode's start and the actions since, stepped again on
            restore.
        BEFORE_RESET: Only right before a reset (an env re-created by its reset alone: see
            :mod:`~envserver.state.replayed`): a snapshot of the stack is its state before the
            reset, the reset and the actions since, run again on restore. Covers the layers
            exact after a reset too (the reset run again brings them to the episode's start).
    """

    ANYTIME = "any time"
    AFTER_RESET = "after a reset"
    BEFORE_RESET = "before a reset"


class Mechanism(NamedTuple):
    """How one layer of an env stack has its state taken and given back.

    Attributes:
        name: What a snapshot records it as (a restore by another mechanism is refused).
        get: ``get(layer) -> state``: plain data (numbers, strings, bytes, arrays, lists, maps).
        put: ``put(layer, state)``: gives the layer that state back.
        check: ``check(layer, state)`` raises :class:`~envserver.errors.StateMismatchError` if
            the state cannot go into this layer (another ROM, another simulator version), before
            any layer is changed.
        exact: When the state taken is exact: other than :attr:`Exact.ANYTIME`, a snapshot of
            the stack is taken from a record of its episode
            (:class:`~envserver.state.snapshot.Episode`), and replayed on restore.
    """

    name: str
    get: Callable[[Any], Any]
    put: Callable[[Any, Any], None]
    check: Callable[[Any, Any], None] = ignore
    exact: Exact = Exact.ANYTIME


def check_version(state: dict[str, Any], key: str, package: str, version: str) -> None:
    """Raises unless the state (at ``key``) was taken with this ``version`` of ``package``.

    Raises:
        StateMismatchError: Naming both versions.
    """
    if state.get(key) != version:
        raise StateMismatchError(
            f"the snapshot was taken with {package} {state.get(key)!r}, this host has {version}"
        )
