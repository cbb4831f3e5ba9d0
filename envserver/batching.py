"""Splitting batched actions into per-host blocks and merging per-host observation blocks.

Batched values follow Gymnasium's layout (``gymnasium.vector.utils.batch_space``): Box,
Discrete, MultiDiscrete and MultiBinary batch into arrays with the env on axis 0; Tuple and Dict
batch element-wise; every other space batches into a tuple with one item per env.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["check_batch", "merge_block", "slice_block"]

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
    """
    if isinstance(space, _ARRAY_SPACES):
        expected = (num_envs, *space.shape)
        shape = np.shape(batch)
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


def slice_block(space: spaces.Space, batch: Any, start: int, stop: int) -> Any:
    """Returns the part of a batched value that belongs to envs ``start:stop``."""
    if isinstance(space, spaces.Tuple):
        return tuple(slice_block(s, b, start, stop) for s, b in zip(space.spaces, batch))
    if isinstance(space, spaces.Dict):
        return {key: slice_block(s, batch[key], start, stop) for key, s in space.spaces.items()}
    return batch[start:stop]


def merge_block(space: spaces.Space, out: Any, block: Any, start: int, stop: int) -> Any:
    """Writes a host's batched block for envs ``start:stop`` into the full batch ``out``.

    Arrays are written in place; tuple batches (which are immutable) are rebuilt.

    Returns:
        The full batch (``out`` itself for array batches).

    Raises:
        ValueError: If the block does not have the layout the space implies.
    """
    if isinstance(space, _ARRAY_SPACES):
        if not isinstance(block, np.ndarray) or block.shape != out[start:stop].shape:
            raise ValueError(
                f"observation block of shape {np.shape(block)} where "
                f"{out[start:stop].shape} was expected"
            )
        out[start:stop] = block
        return out
    if isinstance(space, spaces.Tuple):
        if not isinstance(block, tuple) or len(block) != len(space.spaces):
            raise ValueError("observation block does not match the Tuple space")
        return tuple(merge_block(s, o, b, start, stop) for s, o, b in zip(space.spaces, out, block))
    if isinstance(space, spaces.Dict):
        if not isinstance(block, dict) or set(block) != set(space.spaces):
            raise ValueError("observation block does not match the Dict space")
        return {
            key: merge_block(s, out[key], block[key], start, stop)
            for key, s in space.spaces.items()
        }
    if not isinstance(block, tuple) or len(block) != stop - start:
        raise ValueError(f"observation block must be a tuple of {stop - start} items")
    return (*out[:start], *block, *out[stop:])
