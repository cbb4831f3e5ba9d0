"""Splitting batched actions into per-host blocks and merging per-host observation blocks.

Batched values follow Gymnasium's layout (``gymnasium.vector.utils.batch_space``): Box,
Discrete, MultiDiscrete and MultiBinary batch into arrays with the env on axis 0; Tuple and Dict
batch element-wise; every other space batches into a tuple with one item per env.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_empty_array

from envserver.errors import BatchTypeError

__all__ = ["Index", "check_batch", "empty_batch", "merge", "select"]

_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def check_batch(space: spaces.Space, batch: Any, num_envs: int, path: str = "actions") -> None:
    """Checks that ``batch`` holds one value per env, shaped as ``space`` batches.

    Args:
        space: The single (per-env) space.
        batch: The batched value.
        num_envs: The number of envs.
        path: Where in the value we are, for the message.

    Raises:
        ValueError: If the number or shape of the values is wrong.
        BatchTypeError: (a TypeError and a ValueError) If a single value is given for an array
            space.
    """
    if isinstance(space, _ARRAY_SPACES):
        expected = (num_envs, *space.shape)
        shape = np.shape(batch)
        if shape == () and expected != ():
            raise BatchTypeError(
                f"{path} must have shape {expected} for {num_envs} envs of {space}, got the single "
                f"value {batch!r}: give one per env"
            )
        if shape != expected:
            raise ValueError(
                f"{path} must have shape {expected} for {num_envs} envs of {space}, got {shape}"
            )
    elif isinstance(space, spaces.Tuple):
        if not isinstance(batch, (tuple, list)) or len(batch) != len(space.spaces):
            raise ValueError(f"{path} must be a tuple of {len(space.spaces)} batched values")
        for k, (sub, value) in enumerate(zip(space.spaces, batch)):
            check_batch(sub, value, num_envs, f"{path}[{k}]")
    elif isinstance(space, spaces.Dict):
        if not isinstance(batch, dict) or set(batch) != set(space.spaces):
            raise ValueError(f"{path} must be a dict with keys {sorted(space.spaces)}")
        for key, sub in space.spaces.items():
            check_batch(sub, batch[key], num_envs, f"{path}[{key!r}]")
    else:
        try:
            count = len(batch)
        except TypeError:
            count = None
        if count != num_envs:
            raise ValueError(f"{path} must hold {num_envs} values, one per env, got {count}")


Index = slice | Sequence[int]


def empty_batch(space: spaces.Space, num_envs: int) -> Any:
    """A batch of ``num_envs`` placeholder values, laid out as :func:`merge` fills it.

    Gymnasium's ``create_empty_array`` gives None for a user-defined space (whose batch is a
    tuple with one item per env); here such a space gets a tuple of ``num_envs`` Nones instead,
    at any depth, so that every batch can be merged into.

    Args:
        space: The single (per-env) space.
        num_envs: The number of envs in the batch.

    Returns:
        Zeroed arrays for array spaces, tuples of placeholders for the others.
    """
    if isinstance(space, spaces.Tuple):
        return tuple(empty_batch(s, num_envs) for s in space.spaces)
    if isinstance(space, spaces.Dict):
        return {key: empty_batch(s, num_envs) for key, s in space.spaces.items()}
    batch = create_empty_array(space, n=num_envs, fn=np.zeros)
    return (None,) * num_envs if batch is None else batch


def select(space: spaces.Space, batch: Any, index: Index) -> Any:
    """Returns the part of a batched value that belongs to the envs at ``index``.

    Args:
        space: The single (per-env) space.
        batch: The batched value.
        index: A slice, or a sequence of env positions (in the order wanted).

    Returns:
        The selected batch, in the same layout.
    """
    if isinstance(space, spaces.Tuple):
        return tuple(select(s, b, index) for s, b in zip(space.spaces, batch))
    if isinstance(space, spaces.Dict):
        return {key: select(s, batch[key], index) for key, s in space.spaces.items()}
    if isinstance(index, slice):
        return batch[index]
    if isinstance(space, _ARRAY_SPACES):
        return np.asarray(batch)[list(index)]
    return tuple(batch[i] for i in index)


def merge(space: spaces.Space, out: Any, block: Any, index: Index) -> Any:
    """Writes a batched ``block`` into the batch ``out`` at the env positions ``index``.

    Arrays are written in place; tuple batches (which are immutable) are rebuilt.

    Args:
        space: The single (per-env) space.
        out: The whole batch.
        block: The part to write, one value per position in ``index``.
        index: A slice, or a sequence of positions in ``out``.

    Returns:
        The whole batch (``out`` itself for array batches).

    Raises:
        ValueError: If the block does not have the layout the space implies.
    """
    if isinstance(space, _ARRAY_SPACES):
        if isinstance(index, slice):
            target, expected = index, out[index].shape  # (a view)
        else:  # (not out[target].shape: a copy; a position out of range fails the write)
            target = list(index)
            expected = (len(target), *out.shape[1:])
        if not isinstance(block, np.ndarray) or block.shape != expected:
            raise ValueError(
                f"observation block of shape {np.shape(block)} where {expected} was expected"
            )
        out[target] = block
        return out
    if isinstance(space, spaces.Tuple):
        if not isinstance(block, tuple) or len(block) != len(space.spaces):
            raise ValueError("observation block does not match the Tuple space")
        return tuple(merge(s, o, b, index) for s, o, b in zip(space.spaces, out, block))
    if isinstance(space, spaces.Dict):
        if not isinstance(block, dict) or set(block) != set(space.spaces):
            raise ValueError("observation block does not match the Dict space")
        return {key: merge(s, out[key], block[key], index) for key, s in space.spaces.items()}
    positions = range(len(out))[index] if isinstance(index, slice) else index
    if not isinstance(block, tuple) or len(block) != len(positions):
        raise ValueError(f"observation block must be a tuple of {len(positions)} items")
    items = list(out)
    for position, item in zip(positions, block):
        items[position] = item
    return tuple(items)
