"""Checks of the body fields several commands share: which envs, and how new envs reset first.

Every value comes from a peer: each is checked, and a bad one raises
:class:`~envserver.errors.ProtocolError`, which the host answers as an error reply.
"""

from __future__ import annotations

from typing import Any

from envserver.errors import ProtocolError

__all__ = ["env_ids_of", "first_resets_of"]


def env_ids_of(body: dict[str, Any], num_envs: int) -> list[int] | None:
    """Reads the optional ``env_ids`` of a request: distinct env indices of the block."""
    env_ids = body.get("env_ids")
    if env_ids is None:
        return None
    if (
        not isinstance(env_ids, list)
        or not env_ids
        or not all(type(i) is int and 0 <= i < num_envs for i in env_ids)
        or len(set(env_ids)) != len(env_ids)
    ):
        raise ProtocolError(
            f"env_ids must be a non-empty list of distinct env indices below {num_envs}"
        )
    return env_ids


def first_resets_of(value: Any, num_envs: int) -> list[tuple[int | None, dict[str, Any] | None]]:
    """MAKE's ``first_resets``: one ``[seed, options]`` per env, checked."""
    if not isinstance(value, list) or len(value) != num_envs:
        raise ProtocolError(f"first_resets must be a list of {num_envs} [seed, options] pairs")
    resets = []
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ProtocolError("each of first_resets must be a [seed, options] pair")
        seed, options = item
        if not (seed is None or (isinstance(seed, int) and not isinstance(seed, bool))):
            raise ProtocolError("a first_resets seed must be an integer or nil")
        if options is not None and not isinstance(options, dict):
            raise ProtocolError("first_resets options must be a map or nil")
        resets.append((seed, options))
    return resets
