"""envserver.wire.spaces: Gymnasium spaces to plain data, over the codec, and back."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from envserver.errors import ProtocolError, UnsupportedSpaceError
from envserver.wire import codec
from envserver.wire.raw import StepLayout
from envserver.wire.spaces import MAX_SPACE_DEPTH, space_from_data, space_to_data


def over_the_wire(space: spaces.Space) -> spaces.Space:
    """space_to_data -> codec.encode -> bytes -> codec.decode -> space_from_data, without pickle."""
    frames = [bytes(memoryview(f)) for f in codec.encode(space_to_data(space))]
    return space_from_data(codec.decode(frames))


def nested(depth: int) -> spaces.Space:
    """A space nesting ``depth`` composite spaces (a Sequence, then Tuple/Dict/OneOf) on a leaf."""
    space: spaces.Space = spaces.Sequence(spaces.Discrete(3, start=1))
    wrappers = [
        lambda s: spaces.Tuple([s, spaces.Box(-1, 1, (2,))]),
        lambda s: spaces.Dict({"inner": s, "flag": spaces.MultiBinary(2)}),
        lambda s: spaces.OneOf([spaces.Discrete(2), s]),
    ]
    for level in range(depth - 1):
        space = wrappers[level % len(wrappers)](space)
    return space


SPACES = {
    "box-scalar-bounds": spaces.Box(-1.0, 2.0, (3,), np.float32),
    "box-array-bounds": spaces.Box(np.array([0.0, -1.0]), np.array([1.0, 5.5]), dtype=np.float64),
    "box-inf": spaces.Box(np.array([0.0, -np.inf]), np.array([np.inf, 1.0]), dtype=np.float64),
    "box-all-inf-f16": spaces.Box(-np.inf, np.inf, (2, 2), np.float16),
    "box-uint8-image": spaces.Box(0, 255, (4, 5, 3), np.uint8),
    "box-int64": spaces.Box(-5, 5, (2,), np.int64),
    "box-int32-inf": spaces.Box(-np.inf, np.inf, (2,), np.int32),
    "box-int8-mixed": spaces.Box(np.array([-128, 0], np.int8), np.array([0, 127], np.int8)),
    "box-bool": spaces.Box(0, 1, (3,), np.bool_),
    "box-large": spaces.Box(-np.ones((40, 10)), np.ones((40, 10)), dtype=np.float64),
    "box-empty": spaces.Box(0.0, 1.0, (0,), np.float32),
    "box-0d": spaces.Box(0.0, 1.0, shape=(), dtype=np.float32),
    "discrete": spaces.Discrete(5),
    "discrete-start": spaces.Discrete(5, start=-3),
    "multidiscrete": spaces.MultiDiscrete([3, 4]),
    "multidiscrete-int32": spaces.MultiDiscrete([3, 4], dtype=np.int32),
    "multidiscrete-2d-start": spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [-1, 2]]),
    "multibinary-int": spaces.MultiBinary(5),
    "multibinary-shape": spaces.MultiBinary([2, 3]),
    "multibinary-1-element-shape": spaces.MultiBinary([4]),
    "text": spaces.Text(5),
    "text-charset": spaces.Text(8, min_length=2, charset="abc"),
    "text-charset-set": spaces.Text(4, min_length=0, charset=frozenset("xyz")),
    "text-unicode": spaces.Text(3, charset="αβγ日本"),
    "sequence": spaces.Sequence(spaces.Discrete(3)),
    "sequence-stack": spaces.Sequence(spaces.Box(0, 1, (2,)), stack=True),
    "graph": spaces.Graph(spaces.Box(0, 1, (3,)), spaces.Discrete(4)),
    "graph-no-edges": spaces.Graph(spaces.Discrete(3), None),
    "oneof": spaces.OneOf([spaces.Discrete(2), spaces.Box(0, 1, (2,))]),
    "tuple": spaces.Tuple([spaces.Discrete(2), spaces.Box(-1, 1, (2,))]),
    "tuple-empty": spaces.Tuple([]),
    "dict-nested": spaces.Dict(
        {
            "b": spaces.Discrete(2),
            "a": spaces.Tuple([spaces.Discrete(3), spaces.Dict({"x": spaces.MultiBinary(2)})]),
            "c": spaces.Dict({"z": spaces.Text(2), "y": spaces.Box(0, 1, (1,))}),
        }
    ),
    "deep-mixed": nested(12),
    "deep-at-limit": nested(MAX_SPACE_DEPTH),
}
if "dtype" in inspect.signature(spaces.Discrete).parameters:  # Gymnasium 1.2 and later
    SPACES["discrete-int32"] = spaces.Discrete(3, dtype=np.int32)
    SPACES["discrete-uint8-start"] = spaces.Discrete(3, start=2, dtype=np.uint8)


@pytest.mark.parametrize("space", list(SPACES.values()), ids=list(SPACES))
def test_space_round_trip(space: spaces.Space) -> None:
    rebuilt = over_the_wire(space)
    assert type(rebuilt) is type(space)
    assert rebuilt == space
    assert space == rebuilt
    assert rebuilt.shape == space.shape
    assert rebuilt.dtype == space.dtype
    rebuilt.seed(0)
    for _ in range(3):
        sample = rebuilt.sample()
        assert space.contains(sample), f"{sample!r} not in {space}"


def test_box_bounds_and_dtype_are_exact() -> None:
    low = np.array([-np.inf, 0.5, -2.0], np.float32)
    space = spaces.Box(low, np.array([1.0, np.inf, 2.0], np.float32), dtype=np.float32)
    rebuilt = over_the_wire(space)
    assert rebuilt.low.dtype == rebuilt.high.dtype == np.float32
    np.testing.assert_array_equal(rebuilt.low, space.low)
    np.testing.assert_array_equal(rebuilt.high, space.high)
    np.testing.assert_array_equal(rebuilt.bounded_below, [False, True, True])
    np.testing.assert_array_equal(rebuilt.bounded_above, [True, False, True])


def test_discrete_and_multidiscrete_keep_start() -> None:
    discrete = over_the_wire(spaces.Discrete(4, start=-2))
    assert discrete.n == 4
    assert discrete.start == -2
    multi = over_the_wire(spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [-1, 2]]))
    np.testing.assert_array_equal(multi.nvec, [[2, 3], [4, 5]])
    np.testing.assert_array_equal(multi.start, [[1, 0], [-1, 2]])


def test_dict_keeps_key_order() -> None:
    """Built from pairs, a Dict keeps their order (from a mapping Gymnasium sorts the keys)."""
    space = spaces.Dict(
        [("b", spaces.Discrete(2)), ("a", spaces.Discrete(3)), ("c", spaces.Text(1))]
    )
    assert list(over_the_wire(space).spaces) == ["b", "a", "c"]
    box = spaces.Dict([("z", spaces.Box(0, 1, (2,))), ("a", spaces.Discrete(3))])
    action = spaces.Discrete(2)
    assert (
        StepLayout.of(over_the_wire(box), action).describe()
        == StepLayout.of(box, action).describe()
    )


@pytest.mark.parametrize("stack", [True, False])
def test_sequence_keeps_stack(stack: bool) -> None:
    rebuilt = over_the_wire(spaces.Sequence(spaces.Box(0, 1, (2,)), stack=stack))
    assert rebuilt.stack is stack
    assert rebuilt == spaces.Sequence(spaces.Box(0, 1, (2,)), stack=stack)
    assert rebuilt != spaces.Sequence(spaces.Box(0, 1, (2,)), stack=not stack)


def test_text_keeps_lengths_and_charset() -> None:
    rebuilt = over_the_wire(spaces.Text(7, min_length=3, charset="qrs"))
    assert (rebuilt.min_length, rebuilt.max_length) == (3, 7)
    assert rebuilt.character_set == frozenset("qrs")


class CustomSpace(spaces.Space):
    """A user-defined space envserver cannot describe."""

    def contains(self, x: Any) -> bool:
        return True


class BoxSubclass(spaces.Box):
    """A subclass of a supported type still has its own, unknown semantics."""


@pytest.mark.parametrize(
    "space",
    [
        CustomSpace(),
        BoxSubclass(0, 1, (2,)),
        spaces.Tuple([spaces.Discrete(2), CustomSpace()]),
        spaces.Dict({"ok": spaces.Discrete(2), "bad": spaces.Tuple([CustomSpace()])}),
        spaces.Sequence(CustomSpace()),
        spaces.OneOf([spaces.Discrete(2), BoxSubclass(0, 1, (1,))]),
    ],
    ids=["custom", "box-subclass", "in-tuple", "in-dict", "in-sequence", "in-oneof"],
)
def test_unsupported_space_raises(space: spaces.Space) -> None:
    with pytest.raises(UnsupportedSpaceError, match="cannot be sent as plain data"):
        space_to_data(space)


def box(**overrides: Any) -> dict[str, Any]:
    data = {
        "type": "Box",
        "low": np.zeros(2, np.float32),
        "high": np.ones(2, np.float32),
        "dtype": "<f4",
    }
    data.update(overrides)
    return data


def without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


def wrapped(depth: int) -> dict[str, Any]:
    data: dict[str, Any] = {"type": "Discrete", "n": 2, "start": 0}
    for _ in range(depth):
        data = {"type": "Tuple", "spaces": [data]}
    return data


MALFORMED = {
    "none": None,
    "list": [],
    "str": "Box",
    "int": 3,
    "no-type": {"n": 2},
    "type-not-str": {"type": 5},
    "unknown-type": {"type": "Foo"},
    "dunder-type": {"type": "__class__"},
    "box-no-low": without(box(), "low"),
    "box-no-high": without(box(), "high"),
    "box-no-dtype": without(box(), "dtype"),
    "box-shape-mismatch": box(high=np.ones(3, np.float32)),
    "box-shape-mismatch-2d": box(low=np.zeros((2, 1), np.float32)),
    "box-low-list": box(low=[0.0, 0.0]),
    "box-high-float": box(high=1.0),
    "box-dtype-object": box(dtype="O"),
    "box-dtype-garbage": box(dtype="nonsense"),
    "box-low-above-high": box(low=np.full(2, 2.0, np.float32)),
    "discrete-zero": {"type": "Discrete", "n": 0, "start": 0},
    "discrete-negative": {"type": "Discrete", "n": -3, "start": 0},
    "discrete-n-str": {"type": "Discrete", "n": "x", "start": 0},
    "discrete-no-n": {"type": "Discrete", "start": 0},
    "discrete-no-start": {"type": "Discrete", "n": 2},
    "multidiscrete-lists": {"type": "MultiDiscrete", "nvec": [2, 3], "start": [0, 0]},
    "multidiscrete-zero": {
        "type": "MultiDiscrete",
        "nvec": np.array([2, 0]),
        "start": np.array([0, 0]),
    },
    "multibinary-negative": {"type": "MultiBinary", "n": [-1]},
    "multibinary-no-n": {"type": "MultiBinary"},
    "tuple-no-spaces": {"type": "Tuple"},
    "tuple-spaces-int": {"type": "Tuple", "spaces": 5},
    "tuple-bad-child": {"type": "Tuple", "spaces": [None]},
    "tuple-unknown-child": {"type": "Tuple", "spaces": [{"type": "Foo"}]},
    "dict-bad-pair": {"type": "Dict", "spaces": [["k"]]},
    "dict-bad-child": {"type": "Dict", "spaces": [["k", {"type": "Discrete", "n": 0, "start": 0}]]},
    "text-min-above-max": {"type": "Text", "min_length": 5, "max_length": 2, "charset": "ab"},
    "text-no-charset": {"type": "Text", "min_length": 1, "max_length": 2},
    "sequence-no-space": {"type": "Sequence", "stack": False},
    "graph-no-edge-space": {
        "type": "Graph",
        "node_space": {"type": "Discrete", "n": 2, "start": 0},
    },
    "oneof-bad-child": {"type": "OneOf", "spaces": [{"type": "Box"}]},
    "too-deep": wrapped(MAX_SPACE_DEPTH + 1),
    "far-too-deep": wrapped(10_000),
}


@pytest.mark.parametrize("data", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_description_raises_protocol_error(data: Any) -> None:
    with pytest.raises(ProtocolError):
        space_from_data(data)


def test_nesting_bound_is_exact() -> None:
    space = space_from_data(wrapped(MAX_SPACE_DEPTH))
    for _ in range(MAX_SPACE_DEPTH):
        assert isinstance(space, spaces.Tuple)
        space = space.spaces[0]
    assert space == spaces.Discrete(2)
    with pytest.raises(ProtocolError, match="nests too deeply"):
        space_from_data(wrapped(MAX_SPACE_DEPTH + 1))


def test_malformed_description_after_the_wire_raises_protocol_error() -> None:
    data = space_to_data(spaces.Box(0.0, 1.0, (3,)))
    data["high"] = np.ones(4, np.float32)
    frames = codec.encode(data)
    with pytest.raises(ProtocolError, match="differ in shape"):
        space_from_data(codec.decode(frames))
