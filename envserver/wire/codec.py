"""msgpack encoding of envserver messages, with numpy arrays as raw buffer frames.

A message is a list of frames: frame 0 is a msgpack document, the following frames are raw array
buffers that the document refers to by index. Beyond msgpack's own types, values travel as msgpack
extension types:

======  ================  ========================================================================
code    name              payload (itself msgpack)
======  ================  ========================================================================
1       ARRAY             ``[dtype_str, shape, data]``; ``data`` is bytes (small arrays, inline)
                          or the index of the frame holding the buffer
2       SCALAR            ``[dtype_str, bytes]``: a numpy scalar, its dtype kept
3       TUPLE             the items, as an array (msgpack has no tuple)
4       GRAPH             ``[nodes, edges, edge_links]``: a ``gymnasium.spaces.GraphInstance``
5       GENERATOR         ``[bit_generator_name, state]``: a ``numpy.random.Generator``
6       OBJECT_ARRAY      ``[shape, items]``: an object-dtype array, its items encoded one by one
7       PICKLE            cloudpickle bytes; only produced and accepted where pickle is allowed
8       BIGINT            an integer outside msgpack's 64-bit range: its two's complement,
                          big-endian, in as few bytes as it takes (raw, not msgpack)
======  ================  ========================================================================

Decoding never trusts the peer: every array is checked against a dtype allowlist (booleans,
integers, floats, complex, fixed-size strings; never object or structured dtypes) and its shape
must account for exactly the bytes of its buffer before ``np.frombuffer`` builds it. Pickled
payloads are refused unless the decoder was told to allow them. Any defect raises
:class:`~envserver.errors.ProtocolError` (or :class:`~envserver.errors.PickleNotAllowedError`).
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Sequence
from typing import Any

import cloudpickle
import msgpack
import numpy as np
from gymnasium.spaces import GraphInstance

from envserver.errors import MessageTooLargeError, PickleNotAllowedError, ProtocolError

__all__ = [
    "INLINE_ARRAY_MAX_BYTES",
    "Ext",
    "decode",
    "encode",
    "pack_plain",
]

#: Arrays up to this many bytes travel inside the msgpack document; larger ones as frames.
INLINE_ARRAY_MAX_BYTES = 1024
#: The highest number of dimensions an incoming array may declare.
MAX_ARRAY_DIMS = 32
#: The deepest nesting of extension values (tuples in tuples, ...) accepted from a peer. Each
#: level recurses through msgpack's C unpacker, so the bound must hold well before a thread's
#: C stack runs out (Python's recursion limit does not guard C frames).
MAX_EXT_DEPTH = 64
#: Dtype kinds an incoming array may have: bool, signed, unsigned, float, complex, str, bytes.
ALLOWED_DTYPE_KINDS = frozenset("biufcUS")
#: Bit generators whose state may be rebuilt into a ``numpy.random.Generator``.
BIT_GENERATORS = {
    "PCG64": np.random.PCG64,
    "PCG64DXSM": np.random.PCG64DXSM,
    "MT19937": np.random.MT19937,
    "Philox": np.random.Philox,
    "SFC64": np.random.SFC64,
}


class Ext(enum.IntEnum):
    """msgpack extension type codes used by envserver."""

    ARRAY = 1
    SCALAR = 2
    TUPLE = 3
    GRAPH = 4
    GENERATOR = 5
    OBJECT_ARRAY = 6
    PICKLE = 7
    BIGINT = 8


Frame = bytes | memoryview | np.ndarray


_local = threading.local()


def _leaf_packer() -> msgpack.Packer:
    """This thread's packer for array and scalar headers (plain types, never re-entered).

    Reused because a fresh msgpack Packer per message costs more than the whole message.
    """
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    return packer


def pack_plain(obj: Any) -> bytes:
    """Packs a value of plain msgpack types (no extensions) with this thread's reused packer.

    For small fixed documents on the hot path (envelopes): a fresh packer, which ``packb``
    makes, costs more than packing them.
    """
    return _leaf_packer().pack(obj)


class _Encoder:
    """Packs messages, collecting out-of-band array buffers into ``frames``.

    One per thread and pickle setting is reused (see :func:`_encoder`): its top-level packer
    is made once. Values nested in extensions are packed by fresh packers (:meth:`pack`), as
    the top-level one is in use meanwhile.
    """

    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle
        self.frames: list[Frame] = [b""]
        self.busy = False  # packing a message (a value's __reduce__ may encode another)
        self._leaf = _leaf_packer()  # payloads of plain types only
        self._top = msgpack.Packer(default=self.default, use_bin_type=True, strict_types=True)

    def encode(self, obj: Any) -> list[Frame]:
        """The frames of one message (a new list each time)."""
        frames = self.frames = [b""]
        self.busy = True
        try:
            frames[0] = self._top.pack(obj)  # resets its buffer if it raises
        finally:
            self.busy = False
            self.frames = []  # the message's buffers are its caller's alone
        return frames

    def pack(self, obj: Any) -> bytes:
        return msgpack.packb(obj, default=self.default, use_bin_type=True, strict_types=True)

    def ext(self, code: Ext, payload: Any) -> msgpack.ExtType:
        return msgpack.ExtType(int(code), self.pack(payload))

    def default(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return self.array(obj)
        if isinstance(obj, np.generic):
            if obj.dtype.kind not in ALLOWED_DTYPE_KINDS:
                return self.fallback(obj)
            data = obj.tobytes() if obj.dtype.itemsize else b""  # np.str_("") has 4 bytes
            return msgpack.ExtType(Ext.SCALAR, self._leaf.pack([obj.dtype.str, data]))
        if isinstance(obj, GraphInstance):
            return self.ext(Ext.GRAPH, [obj.nodes, obj.edges, obj.edge_links])
        if isinstance(obj, tuple):
            return self.ext(Ext.TUPLE, list(obj))
        if isinstance(obj, _BigInt):
            size = (obj.value.bit_length() + 8) // 8  # room for the sign bit
            return msgpack.ExtType(Ext.BIGINT, obj.value.to_bytes(size, "big", signed=True))
        if isinstance(obj, np.random.Generator):
            state = obj.bit_generator.state
            return self.ext(Ext.GENERATOR, [state["bit_generator"], _ints_to_str(state)])
        if isinstance(obj, bool):  # bool subclasses cannot exist; kept for clarity
            return bool(obj)
        if isinstance(obj, int):  # IntEnum and other int subclasses
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, dict):
            return dict(obj)
        if isinstance(obj, list):
            return list(obj)
        return self.fallback(obj)

    def array(self, arr: np.ndarray) -> msgpack.ExtType:
        if arr.dtype.kind not in ALLOWED_DTYPE_KINDS or arr.dtype.fields is not None:
            if arr.dtype.kind == "O":
                return self.ext(Ext.OBJECT_ARRAY, [list(arr.shape), arr.ravel().tolist()])
            return self.fallback(arr)
        shape = list(arr.shape)  # before ascontiguousarray, which makes 0-d arrays 1-d
        if arr.nbytes <= INLINE_ARRAY_MAX_BYTES:
            data: Any = arr.tobytes()
        else:
            data = len(self.frames)
            self.frames.append(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
        return msgpack.ExtType(Ext.ARRAY, self._leaf.pack([arr.dtype.str, shape, data]))

    def fallback(self, obj: Any) -> msgpack.ExtType:
        if not self.allow_pickle:
            raise TypeError(
                f"cannot send a value of type {type(obj).__module__}.{type(obj).__qualname__} "
                "without pickle (allowed types: None, bool, int, float, str, bytes, list, tuple, "
                "dict, numpy arrays and scalars of plain dtypes, GraphInstance, Generator)"
            )
        return msgpack.ExtType(int(Ext.PICKLE), cloudpickle.dumps(obj))


def _ints_to_str(value: Any) -> Any:
    """Turns the (possibly 128-bit) integers of a bit generator state into strings."""
    if isinstance(value, dict):
        return {k: _ints_to_str(v) for k, v in value.items()}
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _str_to_ints(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _str_to_ints(v) for k, v in value.items()}
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def encode(obj: Any, *, allow_pickle: bool = False) -> list[Frame]:
    """Encodes ``obj`` as a list of frames: a msgpack document, then raw array buffers.

    Args:
        obj: The value to encode.
        allow_pickle: Whether values of other types may be sent cloudpickled. Without it they
            raise ``TypeError``.

    Returns:
        The frames, ready for ``send_multipart``.

    Raises:
        TypeError: If a value cannot be encoded.
    """
    try:
        return _encoder(allow_pickle).encode(obj)
    except OverflowError:  # rare (numpy's 128-bit seeds): mark big integers, then again
        encoder = _Encoder(allow_pickle)
        encoder.frames[0] = encoder.pack(_marking_big_ints(obj, 0))
        return encoder.frames


def _encoder(allow_pickle: bool) -> _Encoder:
    """This thread's encoder for ``allow_pickle``; a fresh one if it is busy (re-entered)."""
    encoders = getattr(_local, "encoders", None)
    if encoders is None:
        encoders = _local.encoders = {}
    encoder = encoders.get(allow_pickle)
    if encoder is None:
        encoder = encoders[allow_pickle] = _Encoder(allow_pickle)
    return _Encoder(allow_pickle) if encoder.busy else encoder


class _BigInt:
    """An integer outside msgpack's range, marked to travel as :attr:`Ext.BIGINT`."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


def _marking_big_ints(obj: Any, depth: int) -> Any:
    """``obj`` with every integer msgpack cannot hold wrapped in :class:`_BigInt`."""
    if depth > MAX_EXT_DEPTH:
        raise TypeError(f"values nest deeper than {MAX_EXT_DEPTH} levels")
    kind = type(obj)
    if kind is int:
        return obj if -(2**63) <= obj < 2**64 else _BigInt(obj)
    if kind in (list, tuple):
        return kind(_marking_big_ints(item, depth + 1) for item in obj)
    if kind is dict:
        return {
            _marking_big_ints(k, depth + 1): _marking_big_ints(v, depth + 1) for k, v in obj.items()
        }
    return obj


class _Decoder:
    """Unpacks one message, validating every array against its frame."""

    def __init__(
        self, frames: Sequence[Any], allow_pickle: bool, max_array_bytes: int, writable: bool
    ) -> None:
        self.frames = frames
        self.allow_pickle = allow_pickle
        self.max_array_bytes = max_array_bytes
        self.writable = writable
        self.depth = 0

    def unpack(self, data: Any) -> Any:
        return msgpack.unpackb(
            data,
            ext_hook=self.ext_hook,
            raw=False,
            strict_map_key=False,
            use_list=True,
            timestamp=0,
        )

    def ext_hook(self, code: int, data: bytes) -> Any:
        if code == Ext.ARRAY:  # the hot path; a leaf: its payload holds only plain values
            return self.array(msgpack.unpackb(data, raw=False))
        if self.depth >= MAX_EXT_DEPTH:
            raise ProtocolError(f"values nest deeper than {MAX_EXT_DEPTH} levels")
        self.depth += 1
        try:
            return self.extension(code, data)
        finally:
            self.depth -= 1

    def extension(self, code: int, data: bytes) -> Any:
        if code == Ext.BIGINT:
            return int.from_bytes(data, "big", signed=True)
        if code == Ext.PICKLE:
            if not self.allow_pickle:
                raise PickleNotAllowedError(
                    "received a pickled value, but this peer was not started to allow pickle"
                )
            try:
                return cloudpickle.loads(data)
            except Exception as exc:
                raise ProtocolError(
                    f"could not unpickle a value: {type(exc).__name__}: {exc}; every module a "
                    "pickled factory refers to by name must be importable on this side"
                ) from exc
        payload = self.unpack(data)
        if code == Ext.TUPLE:
            _expect(isinstance(payload, list), "a tuple must be encoded as an array")
            return tuple(payload)
        if code == Ext.SCALAR:
            _expect(_is_pair(payload) and isinstance(payload[1], bytes), "malformed scalar")
            dtype = _checked_dtype(payload[0])
            _expect(len(payload[1]) == dtype.itemsize, "scalar size does not match its dtype")
            if dtype.itemsize == 0:  # an empty np.str_ or np.bytes_
                return dtype.type()
            return np.frombuffer(payload[1], dtype=dtype)[0]
        if code == Ext.GRAPH:
            _expect(isinstance(payload, list) and len(payload) == 3, "malformed graph")
            return GraphInstance(*payload)
        if code == Ext.GENERATOR:
            return _generator(payload)
        if code == Ext.OBJECT_ARRAY:
            _expect(_is_pair(payload) and isinstance(payload[1], list), "malformed object array")
            shape = _checked_shape(payload[0])
            _expect(math.prod(shape) == len(payload[1]), "object array size mismatch")
            out = np.empty(len(payload[1]), dtype=object)
            for i, item in enumerate(payload[1]):  # item by item: tuples must not broadcast
                out[i] = item
            return out.reshape(shape)
        raise ProtocolError(f"unknown extension type {code}")

    def array(self, payload: Any) -> np.ndarray:
        if not isinstance(payload, list) or len(payload) != 3:
            raise ProtocolError("malformed array header")
        dtype = _checked_dtype(payload[0])
        shape = _checked_shape(payload[1])
        data = payload[2]
        if type(data) is int:
            if not 0 < data < len(self.frames):
                raise ProtocolError(f"array refers to missing frame {data}")
            buffer = memoryview(self.frames[data])
        elif isinstance(data, bytes):
            buffer = memoryview(data)
        else:
            raise ProtocolError("array data must be bytes or a frame index")
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if nbytes > self.max_array_bytes:
            raise MessageTooLargeError(f"array of {nbytes} bytes exceeds the bound")
        if nbytes != buffer.nbytes:
            raise ProtocolError(
                f"array of shape {shape} and dtype {dtype} needs {nbytes} bytes, "
                f"its buffer holds {buffer.nbytes}"
            )
        if dtype.itemsize == 0:  # empty strings: no bytes at all, so bound the element count
            if count > self.max_array_bytes:
                raise ProtocolError("too many empty strings")
            return np.zeros(shape, dtype=dtype)
        array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
        return array.copy() if self.writable else array


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ProtocolError(message)


def _is_pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2


#: Validated dtypes by their string, so the hot path parses each dtype string once.
_DTYPES: dict[str, np.dtype] = {}
_DTYPES_MAX = 1024


def _checked_dtype(spec: Any) -> np.dtype:
    dtype = _DTYPES.get(spec) if type(spec) is str else None
    if dtype is not None:
        return dtype
    _expect(isinstance(spec, str) and 0 < len(spec) <= 16, "dtype must be a short string")
    try:
        dtype = np.dtype(spec)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"invalid dtype {spec!r}") from exc
    if not (
        dtype.kind in ALLOWED_DTYPE_KINDS
        and dtype.fields is None
        and dtype.subdtype is None
        and (dtype.itemsize > 0 or dtype.kind in "US")
    ):
        raise ProtocolError(f"dtype {spec!r} is not allowed")
    if len(_DTYPES) < _DTYPES_MAX:
        _DTYPES[spec] = dtype
    return dtype


def _checked_shape(shape: Any) -> tuple[int, ...]:
    if not (isinstance(shape, list) and len(shape) <= MAX_ARRAY_DIMS):
        raise ProtocolError(f"invalid array shape {shape!r:.80}")
    for d in shape:
        if type(d) is not int or d < 0:
            raise ProtocolError(f"invalid array shape {shape!r:.80}")
    return tuple(shape)


def _generator(payload: Any) -> np.random.Generator:
    _expect(_is_pair(payload) and isinstance(payload[1], dict), "malformed generator")
    factory = BIT_GENERATORS.get(payload[0])
    _expect(factory is not None, f"unsupported bit generator {payload[0]!r}")
    bit_generator = factory()
    try:
        bit_generator.state = _str_to_ints(payload[1])
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"invalid generator state: {exc}") from exc
    return np.random.Generator(bit_generator)


def decode(
    frames: Sequence[Any],
    *,
    allow_pickle: bool = False,
    max_array_bytes: int = 1 << 31,
    writable: bool = True,
) -> Any:
    """Decodes a message produced by :func:`encode`.

    Args:
        frames: The frames as received (bytes, memoryviews or ``zmq.Frame`` buffers).
        allow_pickle: Whether pickled values may be unpickled. Never set this for a peer that
            is not trusted.
        max_array_bytes: The largest array that may be built.
        writable: Whether arrays carried in frames are copied out (writable) or returned as
            read-only views of the frames (zero-copy, for callers that copy them anyway).

    Returns:
        The decoded value.

    Raises:
        ProtocolError: If the message is malformed or breaks a bound.
        PickleNotAllowedError: If it holds a pickled value and pickle is not allowed.
    """
    if not frames:
        raise ProtocolError("empty message")
    decoder = _Decoder(frames, allow_pickle, max_array_bytes, writable)
    try:
        return decoder.unpack(frames[0])
    except (ProtocolError, PickleNotAllowedError):
        raise
    except RecursionError as exc:
        raise ProtocolError("message nests too deeply") from exc
    except Exception as exc:
        raise ProtocolError(f"malformed message: {type(exc).__name__}: {exc}") from exc
