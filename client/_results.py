"""What the client keeps about requests and results, shared by its modules."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from envserver.errors import ProtocolError
from envserver.wire.batching import Index, merge
from envserver.wire.messages import Command
from envserver.wire.replies import ResetReply, StepReply
from envserver.wire.spaces import space_from_data

from ._infos import InfoBatch
from ._transport.connection import HostConnection

__all__ = [
    "Ready",
    "add_infos",
    "merged",
    "reply_of",
    "reset_mask",
    "seeds_for",
    "space_of",
    "writable",
]


@dataclass
class Ready:
    """A sub-batch of results received from a host, handed out by ``recv`` in order."""

    connection: HostConnection
    ids: np.ndarray
    obs: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    entries: list[Any]
    offset: int = 0

    @classmethod
    def of(
        cls, connection: HostConnection, ids: np.ndarray, reply: StepReply | ResetReply
    ) -> Ready:
        """The results of envs ``ids`` in a host's STEP or RESET reply (a reset: no reward)."""
        count = len(ids)
        try:
            if isinstance(reply, ResetReply):
                zeros = np.zeros(count, dtype=np.bool_)
                return cls(connection, ids, reply.obs, np.zeros(count), zeros, zeros.copy(),
                           list(reply.infos))  # fmt: skip
            return cls(
                connection,
                ids,
                reply.obs,
                _checked_column(reply.rewards, np.float64, count),
                _checked_column(reply.terminations, np.bool_, count),
                _checked_column(reply.truncations, np.bool_, count),
                list(reply.infos),
            )
        except (TypeError, ValueError) as exc:
            raise connection.invalid(f"a malformed reply: {exc!r}") from exc


def reply_of(connection: HostConnection, command: Command, body: Any) -> StepReply | ResetReply:
    """A host's OK reply to a STEP or a RESET, read (``connection`` is failed if it is not one).

    Raises:
        ProtocolError: If the body is not that command's reply.
    """
    return connection.read(ResetReply if command is Command.RESET else StepReply, body)


def _checked_column(value: Any, dtype: type, count: int) -> np.ndarray:
    """A step's rewards (float64) or flags (bool), sent as a list or an array, checked exactly.

    Nothing is coerced: a host that sends anything else is broken, and its data is not used.
    """
    if isinstance(value, list):
        kind = float if dtype is np.float64 else bool
        if len(value) == count and all(type(v) is kind for v in value):
            return np.array(value, dtype=dtype)
    elif isinstance(value, np.ndarray) and value.dtype == dtype and value.shape == (count,):
        return value
    raise ValueError(f"rewards and flags must be {count} values of dtype {np.dtype(dtype)}")


def add_infos(
    batch: InfoBatch,
    infos: Any,
    connection: HostConnection,
    entries: Any,
    positions: Callable[[int], int] | None = None,
) -> Any:
    """Adds a host's per-env infos in order, as SyncVectorEnv adds its envs' infos.

    Args:
        batch: The batch the infos are built for.
        infos: The infos built so far.
        connection: The host.
        entries: ``[[env index in the host's block, info], ...]``.
        positions: Maps an env index to its position in the batch (default: its global env
            index).

    Returns:
        The infos.

    Raises:
        ProtocolError: If an entry names an env the host does not hold.
    """
    for index, info in entries:
        if type(index) is not int or not 0 <= index < connection.block.count:
            raise ProtocolError(f"{connection.block.name} sent info for env {index!r}")
        position = connection.block.start + index if positions is None else positions(index)
        infos = batch.add(infos, writable(info), position)
    return infos


def merged(connection: HostConnection, space: gym.Space, out: Any, block: Any, index: Index) -> Any:
    try:
        return merge(space, out, block, index)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise connection.invalid(f"observations that do not fit: {exc}") from exc


def seeds_for(seed: int | Sequence[int | None] | None, ids: Sequence[int]) -> list[int | None]:
    """One seed per env: None for all, ``seed + id`` from an int, or the given list."""
    if seed is None:
        return [None] * len(ids)
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + int(i) for i in ids]
    return [None if s is None else _seed(s) for s in seed]


def check_options(options: Any) -> None:
    """Refuses reset options that are not a dict (or None): they travel as a map."""
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"reset options must be a dict or None, got {type(options).__name__}")


def reset_mask(
    options: dict[str, Any] | None, num_envs: int
) -> tuple[dict[str, Any] | None, np.ndarray | None]:
    """Takes ``options["reset_mask"]`` out of reset options (the caller's dict is not changed).

    Returns:
        The options without the mask, and the mask (None if there is none).

    Raises:
        TypeError: If the mask is not a bool numpy array.
        ValueError: If its shape is not ``(num_envs,)`` or it marks no env.
    """
    if options is None or "reset_mask" not in options:
        return options, None
    options = dict(options)
    mask = options.pop("reset_mask")
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (num_envs,):
        raise ValueError(
            f"`options['reset_mask']` must have shape `({num_envs},)`, got {mask.shape}"
        )
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not np.any(mask):
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one "
            f"True value, got reset_mask={mask}"
        )
    return options, mask


def _seed(value: Any) -> int:
    if not isinstance(value, (int, np.integer)):  # bools are ints, as for Gymnasium
        raise gym.error.Error(f"Seed must be a python integer, actual type: {type(value)}")
    return int(value)


def copied(value: Any) -> Any:
    """A deep copy; for an array of plain values, its copy (the same, made cheaper)."""
    if type(value) is np.ndarray and not value.dtype.hasobject:
        return value.copy(order="K")
    return copy.deepcopy(value)


def writable(value: Any) -> Any:
    """Copies the read-only (zero-copy) arrays in an info, so users get ordinary arrays."""
    if isinstance(value, np.ndarray):
        return value if value.flags.writeable else value.copy()
    if isinstance(value, dict):
        return {key: writable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(writable(item) for item in value)
    return value


def space_of(value: Any) -> gym.Space:
    return value if isinstance(value, gym.Space) else space_from_data(value)
