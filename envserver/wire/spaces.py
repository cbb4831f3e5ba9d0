"""Gymnasium spaces to plain data and back, without pickle.

Supported: Box, Discrete, MultiDiscrete, MultiBinary, Tuple, Dict, Text, Sequence, Graph and
OneOf, nested in any way. The plain data is a dict with a ``"type"`` key and values the codec can
carry (numpy arrays for bounds). Decoding validates what it reads, so a peer's absurd space
becomes a :class:`~envserver.errors.ProtocolError`, never a crash. Seeds do not travel: a space
rebuilt here has a fresh random generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from envserver.errors import ProtocolError, UnsupportedSpaceError

__all__ = ["space_from_data", "space_to_data"]

#: The deepest nesting of composite spaces accepted from a peer.
MAX_SPACE_DEPTH = 32


def space_to_data(space: spaces.Space) -> dict[str, Any]:
    """Describes ``space`` as plain data.

    Args:
        space: A Gymnasium space of a supported type.

    Returns:
        A dict the codec can encode.

    Raises:
        UnsupportedSpaceError: If the space, or one nested in it, is of an unsupported type.
    """
    kind = type(space)
    if kind is spaces.Box:
        return {"type": "Box", "low": space.low, "high": space.high, "dtype": space.dtype.str}
    if kind is spaces.Discrete:
        return {
            "type": "Discrete",
            "n": int(space.n),
            "start": int(space.start),
            "dtype": np.dtype(space.dtype).str,
        }
    if kind is spaces.MultiDiscrete:
        return {"type": "MultiDiscrete", "nvec": space.nvec, "start": space.start}
    if kind is spaces.MultiBinary:
        n = space.n  # an int, or a shape (kept as given: MultiBinary(4) != MultiBinary([4]))
        return {
            "type": "MultiBinary",
            "n": int(n) if isinstance(n, (int, np.integer)) else [int(d) for d in n],
        }
    if kind is spaces.Tuple:
        return {"type": "Tuple", "spaces": [space_to_data(s) for s in space.spaces]}
    if kind is spaces.Dict:
        return {"type": "Dict", "spaces": [[k, space_to_data(s)] for k, s in space.spaces.items()]}
    if kind is spaces.Text:
        return {
            "type": "Text",
            "min_length": int(space.min_length),
            "max_length": int(space.max_length),
            "charset": space.characters,
        }
    if kind is spaces.Sequence:
        return {
            "type": "Sequence",
            "space": space_to_data(space.feature_space),
            "stack": bool(space.stack),
        }
    if kind is spaces.Graph:
        return {
            "type": "Graph",
            "node_space": space_to_data(space.node_space),
            "edge_space": None if space.edge_space is None else space_to_data(space.edge_space),
        }
    if kind is spaces.OneOf:
        return {"type": "OneOf", "spaces": [space_to_data(s) for s in space.spaces]}
    raise UnsupportedSpaceError(
        f"space type {kind.__module__}.{kind.__qualname__} cannot be sent as plain data"
    )


def space_from_data(data: Any, _depth: int = 0) -> spaces.Space:
    """Rebuilds a space described by :func:`space_to_data`.

    Args:
        data: The plain data, as decoded from a peer.

    Returns:
        The space.

    Raises:
        ProtocolError: If the description is malformed.
    """
    if _depth > MAX_SPACE_DEPTH:
        raise ProtocolError("space description nests too deeply")
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ProtocolError(f"a space description must be a dict with a type, got {data!r:.80}")
    builder = _BUILDERS.get(data["type"])
    if builder is None:
        raise ProtocolError(f"unknown space type {data['type']!r:.40}")
    try:
        return builder(data, _depth + 1)
    except KeyError as exc:
        raise ProtocolError(f"malformed {data['type']} space: missing {exc}") from exc
    except ProtocolError:
        raise
    except Exception as exc:  # the space constructors validate their arguments
        raise ProtocolError(f"invalid {data['type']} space: {exc}") from exc


def _array(value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise ProtocolError("space bounds must be arrays")
    return value


def _box(data: dict, depth: int) -> spaces.Box:
    low, high = _array(data["low"]), _array(data["high"])
    if low.shape != high.shape:
        raise ProtocolError("Box low and high differ in shape")
    return spaces.Box(low=low, high=high, shape=low.shape, dtype=np.dtype(data["dtype"]))


def _discrete(data: dict, depth: int) -> spaces.Discrete:
    dtype = np.dtype(data.get("dtype", "<i8"))
    if dtype == np.int64:  # Gymnasium releases before the dtype argument only know int64
        return spaces.Discrete(int(data["n"]), start=int(data["start"]))
    return spaces.Discrete(int(data["n"]), start=int(data["start"]), dtype=dtype)


def _sub(data: Any, depth: int) -> spaces.Space:
    return space_from_data(data, depth)


_BUILDERS = {
    "Box": _box,
    "Discrete": _discrete,
    "MultiDiscrete": lambda d, _: spaces.MultiDiscrete(
        _array(d["nvec"]), dtype=_array(d["nvec"]).dtype, start=_array(d["start"])
    ),
    "MultiBinary": lambda d, _: spaces.MultiBinary(d["n"]),
    "Tuple": lambda d, depth: spaces.Tuple([_sub(s, depth) for s in d["spaces"]]),
    # From pairs: from a mapping Gymnasium sorts the keys, and a layout's leaves with them.
    "Dict": lambda d, depth: spaces.Dict([(k, _sub(s, depth)) for k, s in d["spaces"]]),
    "Text": lambda d, _: spaces.Text(
        max_length=int(d["max_length"]), min_length=int(d["min_length"]), charset=d["charset"]
    ),
    "Sequence": lambda d, depth: spaces.Sequence(_sub(d["space"], depth), stack=bool(d["stack"])),
    "Graph": lambda d, depth: spaces.Graph(
        node_space=_sub(d["node_space"], depth),
        edge_space=None if d["edge_space"] is None else _sub(d["edge_space"], depth),
    ),
    "OneOf": lambda d, depth: spaces.OneOf([_sub(s, depth) for s in d["spaces"]]),
}
