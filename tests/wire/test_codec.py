"""envserver.wire.codec and the message layout of envserver.wire.messages, against honest and
hostile peers."""

from __future__ import annotations

import dataclasses
import datetime
import fractions
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import cloudpickle
import msgpack
import numpy as np
import pytest
from gymnasium.spaces import GraphInstance
from helpers import assert_same

from envserver.errors import (
    PickleNotAllowedError,
    ProtocolError,
    ProtocolVersionError,
)
from envserver.wire import codec, messages
from envserver.wire.messages import Command, Status

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = 12  # elements: at most 12 * 16 bytes, always inline
LARGE = 2000  # elements: at least 2000 bytes, always a separate frame


# --------------------------------------------------------------------------------------------
# helpers


def wire(frames: list[Any]) -> list[bytes]:
    """What a ZeroMQ peer receives: every frame as plain bytes."""
    return [bytes(memoryview(frame)) for frame in frames]


def round_trip(value: Any, **kwargs: Any) -> Any:
    return codec.decode(wire(codec.encode(value, **kwargs)), **kwargs)


def sample_array(dtype: str, size: int) -> np.ndarray:
    """An array of ``size`` distinct-ish values of ``dtype``, with its extreme values."""
    dt = np.dtype(dtype)
    values = np.arange(size)
    if dt.kind == "b":
        return (values % 3 == 0).astype(dt)
    if dt.kind in "US":
        return values.astype(dt)
    if dt.kind == "c":
        out = (values - 1.5j * values[::-1]).astype(dt)
        out[0] = complex(np.inf, -np.inf)
        return out
    out = values.astype(dt)
    if dt.kind in "iu":
        out[0], out[-1] = np.iinfo(dt).min, np.iinfo(dt).max
    else:
        out[:4] = [np.inf, -np.inf, np.nan, -0.0]
        out[-1] = np.finfo(dt).max
    return out


def array_ext(dtype: Any, shape: Any, data: Any) -> bytes:
    """A hand-built msgpack document holding one ARRAY extension."""
    return msgpack.packb(msgpack.ExtType(codec.Ext.ARRAY, msgpack.packb([dtype, shape, data])))


def ext(code: int, payload: Any) -> bytes:
    return msgpack.packb(msgpack.ExtType(code, msgpack.packb(payload)))


def run_python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --------------------------------------------------------------------------------------------
# arrays

DTYPES = [
    "?",
    "i1",
    "i2",
    "i4",
    "i8",
    "u1",
    "u2",
    "u4",
    "u8",
    "f2",
    "f4",
    "f8",
    "c8",
    "c16",
    "U7",
    "S7",
    ">i4",
    ">f8",
    ">c16",
    ">U3",
]


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["inline", "frame"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_array_round_trip_keeps_dtype_shape_and_values(dtype: str, size: int) -> None:
    arr = sample_array(dtype, size)
    frames = codec.encode(arr)
    if size == SMALL:
        assert arr.nbytes <= codec.INLINE_ARRAY_MAX_BYTES
        assert len(frames) == 1
    else:
        assert arr.nbytes > codec.INLINE_ARRAY_MAX_BYTES
        assert len(frames) == 2
        assert bytes(memoryview(frames[1])) == arr.tobytes()
    out = codec.decode(wire(frames))
    assert_same(out, arr)


@pytest.mark.parametrize(
    ("nbytes", "frame_count"),
    [(0, 1), (1, 1), (codec.INLINE_ARRAY_MAX_BYTES, 1), (codec.INLINE_ARRAY_MAX_BYTES + 1, 2)],
)
def test_inline_threshold_is_exact(nbytes: int, frame_count: int) -> None:
    arr = np.arange(nbytes, dtype=np.int64).astype(np.uint8)
    frames = codec.encode(arr)
    assert len(frames) == frame_count
    assert_same(codec.decode(wire(frames)), arr)


def test_every_large_array_gets_its_own_frame_in_order() -> None:
    big = [np.full(300 + i, i, dtype=np.float64) for i in range(3)]
    small = np.arange(5, dtype=np.int16)
    value = {"a": big[0], "b": [big[1], small], "c": (big[2], {"d": small})}
    frames = codec.encode(value)
    assert len(frames) == 4
    assert [bytes(memoryview(f)) for f in frames[1:]] == [b.tobytes() for b in big]
    assert_same(codec.decode(wire(frames)), value)


_BASE = np.arange(4000, dtype=np.float64).reshape(40, 100)


@pytest.mark.parametrize(
    "view",
    [
        _BASE[::2],
        _BASE.T,
        _BASE[:, 3],
        _BASE[::-1, ::-3],
        np.asfortranarray(_BASE),
        _BASE[:3, :3].T,
        _BASE[5:6, ::7],
        _BASE.astype(np.int32)[::3, 1::2].T,
        np.broadcast_to(np.arange(3, dtype=np.int8), (500, 3)),
    ],
    ids=["rows", "T", "column", "negative", "fortran", "small-T", "strided", "int32-T", "bcast"],
)
def test_non_contiguous_arrays_round_trip(view: np.ndarray) -> None:
    assert not view.flags.c_contiguous
    assert_same(round_trip(view), np.ascontiguousarray(view))


@pytest.mark.parametrize(
    "arr",
    [
        np.zeros((0,), np.float32),
        np.zeros((3, 0, 2), np.int16),
        np.zeros((0, 0), np.bool_),
        np.array([], dtype="U4"),
        np.empty((0, 5), "S3"),
        np.empty((2, 0), np.complex128),
    ],
    ids=["f4-0", "i2-3x0x2", "bool-0x0", "U4-0", "S3-0x5", "c16-2x0"],
)
def test_zero_size_arrays_round_trip(arr: np.ndarray) -> None:
    assert_same(round_trip(arr), arr)


@pytest.mark.parametrize(
    "arr",
    [
        np.array(5),
        np.array(2.5, np.float32),
        np.array(True),
        np.array(1 - 2j, np.complex64),
        np.array("abc"),
        np.array(b"xy"),
    ],
    ids=repr,
)
def test_zero_dimensional_arrays_keep_shape(arr: np.ndarray) -> None:
    out = round_trip(arr)
    assert isinstance(out, np.ndarray)
    assert out.shape == ()
    assert_same(out, arr)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["inline", "frame"])
def test_decoded_arrays_are_writable_and_do_not_alias_frames(size: int) -> None:
    arr = np.arange(size, dtype=np.int32)
    frames = [bytearray(memoryview(f)) for f in codec.encode({"x": arr, "y": [arr]})]
    out = codec.decode(frames)
    for decoded in (out["x"], out["y"][0]):
        assert decoded.flags.writeable
        decoded[0] = 42
        assert decoded[0] == 42
    for frame in frames:  # scribbling over the received buffers must not reach the arrays
        frame[:] = b"\xff" * len(frame)
    np.testing.assert_array_equal(out["x"][1:], arr[1:])
    assert out["x"][0] == 42


# --------------------------------------------------------------------------------------------
# numpy scalars and plain values

SCALARS = [
    np.bool_(True),
    np.bool_(False),
    np.int8(-128),
    np.int16(-3),
    np.int32(2**31 - 1),
    np.int64(-(2**63)),
    np.uint8(255),
    np.uint16(7),
    np.uint32(2**32 - 1),
    np.uint64(2**64 - 1),
    np.float16(0.5),
    np.float32(1.25),
    np.float64(-np.inf),
    np.complex64(1 + 2j),
    np.complex128(-3.5j),
    np.str_("héllo"),
    np.bytes_(b"\x00ab"),
]


@pytest.mark.parametrize("scalar", SCALARS, ids=lambda s: f"{type(s).__name__}({s!r})")
def test_numpy_scalars_keep_their_type_and_dtype(scalar: np.generic) -> None:
    out = round_trip(scalar)
    assert type(out) is type(scalar)
    assert_same(out, scalar)
    assert_same(round_trip([scalar, {"k": (scalar,)}]), [scalar, {"k": (scalar,)}])


@pytest.mark.parametrize(
    "scalar",
    [np.str_(""), np.bytes_(b""), np.array(["", "ab"])[0]],
    ids=["str_", "bytes_", "from-U2-array"],
)
def test_empty_string_scalars_round_trip(scalar: np.generic) -> None:
    assert_same(round_trip(scalar), scalar)


PLAIN_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    1.5,
    float("-inf"),
    "",
    "héllo 日本",
    b"",
    b"\x00\xff",
    [],
    (),
    [True, 1, 1.0, False, 0, 0.0],
    (1, (2, (3, ())), [4, (5,)]),
    [(1, 2), [3, 4]],
    {"a": 1, "b": None},
    {1: "one", -2: [True, 1], "1": "str key"},
    {"nested": [(), [()], {"t": (None, b"x")}]},
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=repr)
def test_plain_values_keep_their_exact_types(value: Any) -> None:
    assert_same(round_trip(value), value)


@pytest.mark.parametrize(
    "value",
    [
        2**64,
        -(2**63) - 1,
        2**127 + 12345,  # numpy's 128-bit entropy seeds, as np_random_seed returns them
        -(2**200),
        (2**70, [1, {"seed": 2**100, 2**90: "key"}], 2**64 - 1, -(2**63)),
    ],
    ids=repr,
)
def test_integers_beyond_64_bits_round_trip(value: Any) -> None:
    assert_same(round_trip(value), value)


def test_integers_within_64_bits_stay_plain_msgpack() -> None:
    frames = codec.encode([2**64 - 1, -(2**63)])
    assert msgpack.unpackb(frames[0]) == [2**64 - 1, -(2**63)]


def test_moderately_nested_tuples_round_trip() -> None:
    value: Any = (None,)
    for i in range(50):
        value = (i, value) if i % 2 else [value]
    assert_same(round_trip(value), value)


def test_int_enums_become_plain_ints() -> None:
    value = [Command.STEP, {"status": Status.ERROR, Command.RESET: "key"}, (Command.PING,)]
    out = round_trip(value)
    expected = [int(Command.STEP), {"status": int(Status.ERROR), int(Command.RESET): "key"}]
    assert_same(out, [*expected, (int(Command.PING),)])
    assert type(out[0]) is int
    assert type(next(iter(out[1].keys() - {"status"}))) is int


@pytest.mark.parametrize(
    "graph",
    [
        GraphInstance(
            nodes=np.arange(6, dtype=np.float32).reshape(3, 2),
            edges=np.array([0, 1], dtype=np.int64),
            edge_links=np.array([[0, 1], [1, 2]], dtype=np.int32),
        ),
        GraphInstance(nodes=np.arange(4), edges=None, edge_links=None),
        GraphInstance(
            nodes=np.zeros((400, 3), np.float64),
            edges=np.ones((500, 2), np.float32),
            edge_links=np.zeros((500, 2), np.int64),
        ),
    ],
    ids=["small", "no-edges", "large"],
)
def test_graph_instance_round_trip(graph: GraphInstance) -> None:
    out = round_trip(graph)
    assert isinstance(out, GraphInstance)
    assert_same(out, graph)


@pytest.mark.parametrize("name", sorted(codec.BIT_GENERATORS))
def test_generator_is_rebuilt_with_the_same_state(name: str) -> None:
    original = np.random.Generator(codec.BIT_GENERATORS[name](1234))
    original.random(7)
    original.integers(0, 100, dtype=np.int32)  # leaves a buffered 32-bit half in the state
    rebuilt = round_trip({"rng": original})["rng"]
    assert isinstance(rebuilt, np.random.Generator)
    assert rebuilt is not original
    assert type(rebuilt.bit_generator) is type(original.bit_generator)
    np.testing.assert_array_equal(
        rebuilt.integers(0, 2**31 - 1, size=5, dtype=np.int32),
        original.integers(0, 2**31 - 1, size=5, dtype=np.int32),
    )
    np.testing.assert_array_equal(rebuilt.random(5), original.random(5))
    np.testing.assert_array_equal(rebuilt.normal(size=3), original.normal(size=3))


def _object_array(items: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out.reshape(shape)


@pytest.mark.parametrize(
    "arr",
    [
        _object_array([(1, 2), (3, 4), (5, 6)], (3,)),
        _object_array(["a", None, "bc"], (3,)),
        _object_array([1, "x", None, (1, 2)], (2, 2)),
        _object_array([np.arange(3), {"k": (1.5,)}], (2,)),
        _object_array([(1, 2)], ()),
        _object_array([], (0, 4)),
    ],
    ids=["equal-tuples", "str-none", "2d-mixed", "nested-array", "0d-tuple", "empty"],
)
def test_object_arrays_round_trip_item_by_item(arr: np.ndarray) -> None:
    out = round_trip(arr)
    assert out.dtype == object
    assert out.shape == arr.shape  # equal-length tuples must not broadcast into a 2nd axis
    assert_same(out, arr)


# --------------------------------------------------------------------------------------------
# hostile input

HOSTILE = {
    "object-O8": [array_ext("|O8", [4], b"A" * 32)],
    "object-O": [array_ext("O", [1], b"A" * 8)],
    "object-in-frame": [array_ext("|O8", [4], 1), b"A" * 32],
    "structured": [array_ext("i4,i4", [1], b"A" * 8)],
    "structured-list": [array_ext("[('a','<i4')]", [1], b"A" * 4)],
    "void": [array_ext("V8", [1], b"A" * 8)],
    "subarray-huge": [array_ext("(1000000000,)i4", [1], b"A" * 8)],
    "subarray": [array_ext("(2,)i4", [1], b"A" * 8)],
    "datetime": [array_ext("M8[ns]", [1], b"A" * 8)],
    "dtype-int": [array_ext(5, [1], b"A" * 8)],
    "dtype-none": [array_ext(None, [1], b"A" * 8)],
    "dtype-bytes": [array_ext(b"<i8", [1], b"A" * 8)],
    "dtype-list": [array_ext(["<i8"], [1], b"A" * 8)],
    "dtype-long": [array_ext("<i8" + " " * 40, [1], b"A" * 8)],
    "dtype-garbage": [array_ext("not a dtype", [1], b"A" * 8)],
    "shape-larger-than-buffer": [array_ext("<i8", [2], b"A" * 8)],
    "shape-smaller-than-buffer": [array_ext("<i8", [1], b"A" * 16)],
    "frame-larger-than-shape": [array_ext("<f4", [2], 1), b"A" * 12],
    "frame-smaller-than-shape": [array_ext("<f4", [4], 1), b"A" * 12],
    "negative-dim": [array_ext("<i8", [-1], b"A" * 8)],
    "negative-dim-pair": [array_ext("<i8", [-1, -1], b"A" * 8)],
    "absurd-dims": [array_ext("<i8", [2**40, 2**40], b"A" * 8)],
    "absurd-dims-zero": [array_ext("<i8", [2**40, 2**40, 0], b"")],
    "dim-2**63": [array_ext("<i8", [2**63, 0], b"")],
    "float-dim": [array_ext("<i8", [1.0], b"A" * 8)],
    "bool-dim": [array_ext("<i8", [True], b"A" * 8)],
    "shape-not-list": [array_ext("<i8", 1, b"A" * 8)],
    "too-many-dims": [array_ext("|u1", [1] * (codec.MAX_ARRAY_DIMS + 1), b"A")],
    "frame-index-0": [array_ext("<i8", [1], 0), b"A" * 8],
    "frame-index-missing": [array_ext("<i8", [1], 2), b"A" * 8],
    "frame-index-negative": [array_ext("<i8", [1], -1), b"A" * 8],
    "frame-index-bool": [array_ext("<i8", [1], True), b"A" * 8],
    "data-str": [array_ext("<i8", [1], "AAAAAAAA")],
    "header-short": [ext(codec.Ext.ARRAY, ["<i8", [1]])],
    "header-not-list": [ext(codec.Ext.ARRAY, {"dtype": "<i8"})],
    "scalar-object": [ext(codec.Ext.SCALAR, ["|O8", b"A" * 8])],
    "scalar-size": [ext(codec.Ext.SCALAR, ["<i8", b"A" * 7])],
    "scalar-not-bytes": [ext(codec.Ext.SCALAR, ["<i8", 5])],
    "tuple-not-list": [ext(codec.Ext.TUPLE, 5)],
    "graph-short": [ext(codec.Ext.GRAPH, [1, 2])],
    "generator-unknown": [ext(codec.Ext.GENERATOR, ["Evil", {}])],
    "generator-bad-state": [ext(codec.Ext.GENERATOR, ["PCG64", {"x": 1}])],
    "object-array-size": [ext(codec.Ext.OBJECT_ARRAY, [[3], [1, 2]])],
    "object-array-neg-shape": [ext(codec.Ext.OBJECT_ARRAY, [[-1], []])],
    "ext-payload-garbage": [msgpack.packb(msgpack.ExtType(codec.Ext.TUPLE, b"\xc1"))],
    "truncated-document": [msgpack.packb({"a": [1, 2, 3], "b": "text"})[:-3]],
    "truncated-array": [array_ext("<i8", [4], b"A" * 32)[:-5]],
    "trailing-bytes": [msgpack.packb([1, 2]) + b"\x01"],
    "reserved-byte": [b"\xc1"],
    "empty-document": [b""],
    "no-frames": [],
}


@pytest.mark.parametrize("frames", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_input_is_refused_with_protocol_error(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        codec.decode(frames)
    with pytest.raises(ProtocolError):  # allowing pickle must not loosen anything else
        codec.decode(frames, allow_pickle=True)


@pytest.mark.parametrize("code", [0, 9, 42, 127, -5, -128])
def test_unknown_extension_codes_are_refused(code: int) -> None:
    document = b"\xd4" + (code & 0xFF).to_bytes(1, "big") + b"\xc0"  # fixext 1, payload nil
    with pytest.raises(ProtocolError, match=f"unknown extension type {code}"):
        codec.decode([document])


@pytest.mark.parametrize("seed", range(16))
def test_random_bytes_are_refused(seed: int) -> None:
    rng = np.random.default_rng(seed)
    document = rng.bytes(int(rng.integers(2, 300)))
    with pytest.raises(ProtocolError):
        codec.decode([document, rng.bytes(64)])


def test_dims_up_to_the_bound_are_accepted() -> None:
    shape = [1] * codec.MAX_ARRAY_DIMS
    out = codec.decode([array_ext("|u1", shape, b"\x07")])
    assert out.shape == tuple(shape)
    assert out.ravel()[0] == 7


def test_array_over_max_array_bytes_is_refused() -> None:
    frames = wire(codec.encode(np.zeros(100, np.int64)))
    assert codec.decode(frames, max_array_bytes=800).shape == (100,)
    with pytest.raises(ProtocolError, match="exceeds the bound"):
        codec.decode(frames, max_array_bytes=799)


DEEP_NESTING_SCRIPT = """
    import sys
    import threading

    import msgpack

    from envserver.wire import codec
    from envserver.errors import ProtocolError

    depth, code = int(sys.argv[1]), int(sys.argv[2])
    document = msgpack.packb(None)
    for _ in range(depth):
        if code == codec.Ext.TUPLE:  # [item]
            payload = b"\\x91" + document
        else:  # OBJECT_ARRAY: [[1], [item]]
            payload = b"\\x92\\x91\\x01\\x91" + document
        document = msgpack.packb(msgpack.ExtType(code, payload))
    result = []

    def decode():
        try:
            codec.decode([document])
            result.append("decoded")
        except ProtocolError as exc:
            result.append(f"refused: {exc}")
        except BaseException as exc:
            result.append(f"other: {type(exc).__name__}: {exc}")

    # a fixed 8 MiB stack, the usual Linux main-thread default, whatever `ulimit -s` says
    threading.stack_size(8 * 1024 * 1024)
    thread = threading.Thread(target=decode)
    thread.start()
    thread.join()
    print(result[0])
"""


@pytest.mark.parametrize("code", [codec.Ext.TUPLE, codec.Ext.OBJECT_ARRAY], ids=lambda c: c.name)
def test_deeply_nested_extensions_are_refused_without_crashing(code: codec.Ext) -> None:
    proc = run_python(DEEP_NESTING_SCRIPT, "2000", str(int(code)))
    assert proc.returncode == 0, (
        f"decoder process died with exit status {proc.returncode} (negative: killed by that "
        f"signal; -11 is a segfault)\nstdout: {proc.stdout}\nstderr: {proc.stderr[-2000:]}"
    )
    assert proc.stdout.startswith("refused: "), proc.stdout + proc.stderr


MSGPACK_NUMPY_SCRIPT = """
    import msgpack

    from envserver.wire import codec
    from envserver.errors import ProtocolError

    pointers = bytes(range(1, 33))  # four made-up PyObject* values
    cases = [
        [msgpack.packb(msgpack.ExtType(codec.Ext.ARRAY, msgpack.packb(["|O8", [4], pointers])))],
        [msgpack.packb(msgpack.ExtType(codec.Ext.ARRAY, msgpack.packb(["|O8", [4], 1]))), pointers],
        [msgpack.packb(msgpack.ExtType(codec.Ext.ARRAY, msgpack.packb(["O", [2, 2], pointers])))],
        [msgpack.packb(msgpack.ExtType(codec.Ext.SCALAR, msgpack.packb(["|O8", pointers[:8]])))],
    ]
    for allow_pickle in (False, True):
        for frames in cases:
            try:
                value = codec.decode(frames, allow_pickle=allow_pickle)
            except ProtocolError:
                continue
            print("decoded", repr(value))  # touching forged object pointers crashes here
            raise SystemExit(3)
    print("all refused")
"""


def test_peer_declared_object_dtype_cannot_crash_the_process() -> None:
    proc = run_python(MSGPACK_NUMPY_SCRIPT)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip() == "all refused"


# --------------------------------------------------------------------------------------------
# encoding limits and pickle


@dataclasses.dataclass(frozen=True)
class Opaque:
    """A value without a plain encoding."""

    name: str
    values: tuple[int, ...]


UNSUPPORTED = [
    {1, 2},
    frozenset({3}),
    object(),
    Opaque("x", (1, 2)),
    datetime.date(2020, 1, 2),
    fractions.Fraction(1, 3),
    1 + 2j,
    np.datetime64("2020-01-01"),
    np.array(["2020-01-01"], dtype="M8[D]"),
    np.zeros(2, dtype="i4,f8"),
    _object_array([{1, 2}], (1,)),
    [1, {"deep": (Opaque("y", ()),)}],
]


@pytest.mark.parametrize("value", UNSUPPORTED, ids=lambda v: type(v).__name__)
def test_unsupported_values_need_pickle(value: Any) -> None:
    with pytest.raises(TypeError, match="without pickle"):
        codec.encode(value)
    frames = wire(codec.encode(value, allow_pickle=True))
    with pytest.raises(PickleNotAllowedError):
        codec.decode(frames)
    out = codec.decode(frames, allow_pickle=True)
    if isinstance(value, np.ndarray):
        assert out.dtype == value.dtype
        assert out.tolist() == value.tolist()
    elif type(value) is object:
        assert type(out) is object
    else:
        assert out == value
        assert type(out) is type(value)


def test_plain_values_never_use_pickle_even_when_allowed() -> None:
    value = {"a": np.arange(3), "b": (1, "x"), "g": np.random.default_rng(0)}
    frames = wire(codec.encode(value, allow_pickle=True))
    codec.decode(frames)  # would raise PickleNotAllowedError if anything had been pickled


def test_an_encode_that_failed_leaves_nothing_in_the_next_message() -> None:
    with pytest.raises(TypeError, match="without pickle"):
        codec.encode({"big": np.arange(4096), "then": object()})
    frames = wire(codec.encode({"a": np.arange(512, dtype=np.int64)}))
    assert len(frames) == 2  # the failed message's array frame is not carried over
    assert codec.decode(frames)["a"].tolist() == list(range(512))


class EncodesWhilePickled:
    """A value whose pickling encodes another message on the same thread (a re-entered codec)."""

    def __reduce__(self) -> tuple[Any, ...]:
        inner = wire(codec.encode({"inner": np.arange(1000)}, allow_pickle=True))
        return (list, ([len(inner), codec.decode(inner)["inner"].sum()],))


def test_an_encode_inside_an_encode_gives_both_messages_their_own_frames() -> None:
    outer = {"before": np.arange(300), "value": EncodesWhilePickled(), "after": np.arange(400)}
    frames = wire(codec.encode(outer, allow_pickle=True))
    assert len(frames) == 3
    out = codec.decode(frames, allow_pickle=True)
    assert out["before"].tolist() == list(range(300))
    assert out["value"] == [2, sum(range(1000))]
    assert out["after"].tolist() == list(range(400))


@pytest.mark.parametrize("payload", [b"", b"not a pickle", b"\x80\x05\x95"])
def test_unreadable_pickle_is_a_protocol_error_even_when_allowed(payload: bytes) -> None:
    document = msgpack.packb([1, msgpack.ExtType(codec.Ext.PICKLE, payload)])
    with pytest.raises(PickleNotAllowedError):
        codec.decode([document])
    with pytest.raises(ProtocolError, match="unpickle"):
        codec.decode([document], allow_pickle=True)


class TouchOnUnpickle:
    """Unpickling this creates a file: a stand-in for arbitrary code execution."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (self.path,))


@pytest.mark.parametrize("wrap", ["top", "in-tuple", "in-dict", "in-object-array"])
def test_malicious_pickle_is_not_executed_when_pickle_is_not_allowed(
    tmp_path: pathlib.Path, wrap: str
) -> None:
    marker = tmp_path / "pwned"
    evil = msgpack.ExtType(codec.Ext.PICKLE, cloudpickle.dumps(TouchOnUnpickle(marker)))
    document = {
        "top": msgpack.packb(evil),
        "in-tuple": msgpack.packb(msgpack.ExtType(codec.Ext.TUPLE, msgpack.packb([1, evil]))),
        "in-dict": msgpack.packb({"obs": [0, {"x": evil}]}),
        "in-object-array": ext(codec.Ext.OBJECT_ARRAY, [[1], [evil]]),
    }[wrap]
    with pytest.raises(PickleNotAllowedError):
        codec.decode([document])
    request = [msgpack.packb([messages.PROTOCOL_VERSION, 1, int(Command.MAKE), b"s"]), document]
    with pytest.raises(PickleNotAllowedError):
        messages.decode_request(request, allow_pickle=False)
    assert not marker.exists()
    codec.decode([document], allow_pickle=True)  # the payload really is live
    assert marker.exists()


# --------------------------------------------------------------------------------------------
# protocol message layout

BODY = {
    "actions": np.arange(600, dtype=np.float64).reshape(300, 2),
    "mask": np.array([True, False]),
    "seeds": [1, None, (2, 3)],
}


@pytest.mark.parametrize("session", [b"\x00session-id", None])
@pytest.mark.parametrize(
    "command", [c for c in Command if c is not Command.STEP_RAW], ids=lambda c: c.name
)
def test_request_round_trip_and_layout(command: Command, session: bytes | None) -> None:
    frames = messages.encode_request(77, command, session, BODY, allow_pickle=False)
    assert msgpack.unpackb(frames[0]) == [messages.PROTOCOL_VERSION, 77, int(command), session]
    assert len(frames) == 3  # envelope, body document, one large array buffer
    assert wire(frames[1:]) == wire(codec.encode(BODY))
    request = messages.decode_request(wire(frames), allow_pickle=False)
    assert request.request_id == 77
    assert request.command is command
    assert request.session == session
    assert_same(request.body, BODY)
    assert messages.request_id_of(wire(frames)) == 77


@pytest.mark.parametrize("request_id", [0, 2**63 - 1, None])
@pytest.mark.parametrize("status", list(Status), ids=lambda s: s.name)
def test_reply_round_trip_and_layout(status: Status, request_id: int | None) -> None:
    try:
        raise KeyError("boom")
    except KeyError as exc:
        body = messages.error_body(exc, env_index=2) if status is Status.ERROR else BODY
    frames = messages.encode_reply(request_id, status, body)
    assert msgpack.unpackb(frames[0]) == [messages.PROTOCOL_VERSION, request_id, int(status), 0]
    reply = messages.decode_reply(wire(frames), allow_pickle=False)
    assert reply.request_id == request_id
    assert reply.status is status
    assert_same(reply.body, body)
    if status is Status.ERROR:
        assert reply.body["type"] == "KeyError"
        assert reply.body["module"] == "builtins"
        assert reply.body["env_index"] == 2
        assert "boom" in reply.body["traceback"]


@pytest.mark.parametrize("version", [0, messages.PROTOCOL_VERSION + 1, 99, "1", None])
def test_wrong_protocol_version_names_both_versions(version: Any) -> None:
    body = codec.encode(None)
    request = [msgpack.packb([version, 1, int(Command.PING), None]), *body]
    reply = [msgpack.packb([version, 1, int(Status.OK)]), *body]
    for frames, decode in ((request, messages.decode_request), (reply, messages.decode_reply)):
        with pytest.raises(ProtocolVersionError) as info:
            decode(frames, allow_pickle=False)
        message = str(info.value)
        assert f"speaks version {messages.PROTOCOL_VERSION}" in message
        assert f"sent version {version!r}" in message


@pytest.mark.parametrize(
    "envelope", [[99], [99, 1], [99, 1, 2, None, "extension"]], ids=["1", "2", "5"]
)
def test_version_is_checked_before_the_envelope_shape(envelope: list[Any]) -> None:
    frames = [msgpack.packb(envelope), *codec.encode(None)]
    for decode in (messages.decode_request, messages.decode_reply):
        with pytest.raises(ProtocolVersionError, match="sent version 99"):
            decode(frames, allow_pickle=False)


REQUEST_BODY = codec.encode({"x": 1})
STEP = int(Command.STEP)

BAD_REQUESTS = {
    "unknown-command": [msgpack.packb([messages.PROTOCOL_VERSION, 1, 999, None]), *REQUEST_BODY],
    "command-zero": [msgpack.packb([messages.PROTOCOL_VERSION, 1, 0, None]), *REQUEST_BODY],
    "command-str": [msgpack.packb([messages.PROTOCOL_VERSION, 1, "STEP", None]), *REQUEST_BODY],
    "command-list": [msgpack.packb([messages.PROTOCOL_VERSION, 1, [STEP], None]), *REQUEST_BODY],
    "command-map": [msgpack.packb([messages.PROTOCOL_VERSION, 1, {4: 4}, None]), *REQUEST_BODY],
    "session-str": [msgpack.packb([messages.PROTOCOL_VERSION, 1, STEP, "s"]), *REQUEST_BODY],
    "session-int": [msgpack.packb([messages.PROTOCOL_VERSION, 1, STEP, 5]), *REQUEST_BODY],
    "request-id-none": [
        msgpack.packb([messages.PROTOCOL_VERSION, None, STEP, b"s"]),
        *REQUEST_BODY,
    ],
    "request-id-bool": [
        msgpack.packb([messages.PROTOCOL_VERSION, True, STEP, b"s"]),
        *REQUEST_BODY,
    ],
    "request-id-str": [msgpack.packb([messages.PROTOCOL_VERSION, "1", STEP, b"s"]), *REQUEST_BODY],
    "envelope-short": [msgpack.packb([messages.PROTOCOL_VERSION, 1, STEP]), *REQUEST_BODY],
    "envelope-long": [msgpack.packb([messages.PROTOCOL_VERSION, 1, STEP, None, 0]), *REQUEST_BODY],
    "envelope-map": [msgpack.packb({"v": messages.PROTOCOL_VERSION}), *REQUEST_BODY],
    "envelope-empty": [msgpack.packb([]), *REQUEST_BODY],
    "envelope-garbage": [b"\xc1\xc1", *REQUEST_BODY],
    "envelope-truncated": [
        msgpack.packb([messages.PROTOCOL_VERSION, 1, STEP, b"ses"])[:-2],
        *REQUEST_BODY,
    ],
    "oversized-envelope": [
        msgpack.packb([messages.PROTOCOL_VERSION, 1, STEP, b"s" * messages.MAX_ENVELOPE_BYTES]),
        *REQUEST_BODY,
    ],
    "one-frame": [msgpack.packb([messages.PROTOCOL_VERSION, 1, STEP, None])],
    "no-frames": [],
    "too-many-frames": [
        msgpack.packb([messages.PROTOCOL_VERSION, 1, STEP, None]),
        *REQUEST_BODY,
        *[b""] * messages.MAX_FRAMES,
    ],
    "hostile-body": [
        msgpack.packb([messages.PROTOCOL_VERSION, 1, STEP, None]),
        array_ext("|O8", [1], b"A" * 8),
    ],
}


@pytest.mark.parametrize("frames", list(BAD_REQUESTS.values()), ids=list(BAD_REQUESTS))
def test_malformed_requests_are_refused(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError) as info:
        messages.decode_request(frames, allow_pickle=True)
    assert not isinstance(info.value, ProtocolVersionError)


def test_an_unreadable_envelope_is_named_by_its_size_and_first_bytes() -> None:
    """What a peer sent that cannot be read is described in the error: its frame's size, the
    message's frame count and the first bytes (what a log shows of a torn message)."""
    truncated = BAD_REQUESTS["envelope-truncated"]
    with pytest.raises(ProtocolError, match="unreadable envelope") as info:
        messages.decode_request(truncated, allow_pickle=False)
    message = str(info.value)
    assert f"of {len(truncated[0])} bytes in a message of {len(truncated)} frames" in message
    assert truncated[0][:4].hex(" ") in message
    with pytest.raises(ProtocolError, match=r"of 0 bytes .* starts with nothing"):
        messages.decode_request([b"", *REQUEST_BODY], allow_pickle=False)


BAD_REPLIES = {
    "unknown-status": [msgpack.packb([messages.PROTOCOL_VERSION, 1, 2]), *REQUEST_BODY],
    "negative-status": [msgpack.packb([messages.PROTOCOL_VERSION, 1, -1]), *REQUEST_BODY],
    "status-str": [msgpack.packb([messages.PROTOCOL_VERSION, 1, "OK"]), *REQUEST_BODY],
    "status-list": [msgpack.packb([messages.PROTOCOL_VERSION, 1, [0]]), *REQUEST_BODY],
    "request-id-str": [msgpack.packb([messages.PROTOCOL_VERSION, "1", 0]), *REQUEST_BODY],
    "envelope-long": [msgpack.packb([messages.PROTOCOL_VERSION, 1, 0, None]), *REQUEST_BODY],
    "oversized-envelope": [
        msgpack.packb([messages.PROTOCOL_VERSION, 1, 0, b"x" * 300]),
        *REQUEST_BODY,
    ],
    "one-frame": [msgpack.packb([messages.PROTOCOL_VERSION, 1, 0])],
    "too-many-frames": [
        msgpack.packb([messages.PROTOCOL_VERSION, 1, 0]),
        *[b""] * messages.MAX_FRAMES,
    ],
    "hostile-body": [msgpack.packb([messages.PROTOCOL_VERSION, 1, 0]), b"\xc1"],
}


@pytest.mark.parametrize("frames", list(BAD_REPLIES.values()), ids=list(BAD_REPLIES))
def test_malformed_replies_are_refused(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError) as info:
        messages.decode_reply(frames, allow_pickle=True)
    assert not isinstance(info.value, ProtocolVersionError)


def test_frame_count_bound_is_exact() -> None:
    small = np.zeros(codec.INLINE_ARRAY_MAX_BYTES + 1, np.uint8)
    arrays = [small] * (messages.MAX_FRAMES - 2)  # envelope + body + one frame per array
    frames = messages.encode_request(5, Command.STEP, b"s", arrays, allow_pickle=False)
    assert len(frames) == messages.MAX_FRAMES
    assert len(messages.decode_request(frames, allow_pickle=False).body) == len(arrays)
    frames = messages.encode_request(5, Command.STEP, b"s", [*arrays, small], allow_pickle=False)
    assert len(frames) == messages.MAX_FRAMES + 1
    with pytest.raises(ProtocolError, match="at most"):
        messages.decode_request(frames, allow_pickle=False)


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b""],
        [b"\xc1"],
        [b"\x94\x01"],
        [msgpack.packb(5)],
        [msgpack.packb([1])],
        [msgpack.packb({"a": 1})],
        [msgpack.packb([1, "7", 4, None])],
        [msgpack.packb([1, True, 4, None])],
        [msgpack.packb([1, 7.0, 4, None])],
        [msgpack.packb([1, None, 0])],
        [np.random.default_rng(3).bytes(40)],
        [None],
    ],
    ids=repr,
)
def test_request_id_of_garbage_is_none(frames: list[Any]) -> None:
    assert messages.request_id_of(frames) is None


def test_request_id_of_reads_a_broken_message_with_a_readable_envelope() -> None:
    frames = [msgpack.packb([messages.PROTOCOL_VERSION + 1, 31, 999]), b"\xc1"]
    assert messages.request_id_of(frames) == 31


def test_zero_itemsize_string_arrays_round_trip() -> None:
    for value in (np.zeros(3, dtype="<U0"), np.zeros((2, 0), dtype="|S0")):
        result = codec.decode(codec.encode(value))
        assert result.dtype == value.dtype and result.shape == value.shape


def test_zero_itemsize_arrays_cannot_declare_absurd_counts() -> None:
    frames = [array_ext("<U0", [2**40, 2**40], b"")]
    with pytest.raises(ProtocolError):
        codec.decode(frames)
