"""What a snapshot mechanism is: how one layer's state is taken, checked and given back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from envserver.errors import StateMismatchError

__all__ = ["Mechanism", "check_version"]


def _accept(_layer: Any, _state: Any) -> None:
    return None


class Mechanism(NamedTuple):
    """How one layer of an env stack has its state taken and given back.

    Attributes:
        name: What a snapshot records it as (a restore by another mechanism is refused).
        get: ``get(layer) -> state``: plain data (numbers, strings, bytes, arrays, lists, maps).
        put: ``put(layer, state)``: gives the layer that state back.
        check: ``check(layer, state)`` raises :class:`~envserver.errors.StateMismatchError` if
            the state cannot go into this layer (another ROM, another simulator version), before
            any layer is changed.
        from_start: Exact only at an episode's start: a snapshot of such a stack is its state at
            the episode's start and the actions since, replayed on restore.
    """

    name: str
    get: Callable[[Any], Any]
    put: Callable[[Any, Any], None]
    check: Callable[[Any, Any], None] = _accept
    from_start: bool = False


def check_version(state: dict[str, Any], key: str, package: str, version: str) -> None:
    """Raises unless the state (at ``key``) was taken with this ``version`` of ``package``.

    Raises:
        StateMismatchError: Naming both versions.
    """
    if state.get(key) != version:
        raise StateMismatchError(
            f"the snapshot was taken with {package} {state.get(key)!r}, this host has {version}"
        )
