"""Conformance: the codec's rules for bodies and array frames, and the size bounds.

PING decodes its body like any other command and needs no session, so it carries the bodies.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from envserver.conformance.wire import Wire, envelope
from envserver.wire.messages import PROTOCOL_VERSION, Command

#: Up to this bound, the whole-message bound is tested (a larger one costs too much memory).
TESTABLE_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
ARRAY, SCALAR, TUPLE, PICKLE = 1, 2, 3, 7


def ext(code: int, payload: Any) -> msgpack.ExtType:
    """An extension value whose payload is a msgpack document."""
    return msgpack.ExtType(code, msgpack.packb(payload, use_bin_type=True))


def ping(wire: Wire, body: Any, *buffers: bytes) -> Any:
    """Sends PING with a hand-made body (and buffer frames); returns the reply."""
    request_id = wire.next_id()
    frames = [
        envelope(PROTOCOL_VERSION, request_id, int(Command.PING), None),
        msgpack.packb(body, use_bin_type=True),
        *buffers,
    ]
    reply = wire.ask(frames)
    assert reply.request_id == request_id
    return reply


def nested_tuples(depth: int) -> msgpack.ExtType:
    """A TUPLE in a TUPLE ... ``depth`` levels deep."""
    value = ext(TUPLE, [])
    for _ in range(depth - 1):
        value = ext(TUPLE, [value])
    return value


@pytest.mark.parametrize(
    ("body", "buffers"),
    [
        ({"a": ext(ARRAY, ["<f4", [300], 1])}, [np.arange(300, dtype="<f4").tobytes()]),
        ({"a": ext(ARRAY, ["<f4", [300], np.zeros(300, "<f4").tobytes()])}, []),
        ({"a": ext(ARRAY, ["|u1", [2], 1])}, [b"\x01\x02"]),
        ({"a": ext(ARRAY, ["|b1", [0, 3], 1])}, [b""]),
        ({"a": ext(ARRAY, ["<U2", [1], 2])}, [b"unused", "hi".encode("utf-32-le")]),
        ({"s": ext(SCALAR, ["<i2", b"\x05\x00"]), "t": nested_tuples(60)}, []),
    ],
    ids=["frame", "large-inline", "small-frame", "empty", "second-frame", "scalar-and-tuples"],
)
def test_valid_bodies_are_accepted(wire: Wire, body: Any, buffers: list[bytes]) -> None:
    """Arrays inline or in their own frame at any size, unreferenced frames and nesting up to
    the bound are all valid."""
    ping(wire, body, *buffers).ok()


@pytest.mark.parametrize(
    ("body", "buffers"),
    [
        ({"a": ext(ARRAY, ["|u1", [4], 1])}, []),
        ({"a": ext(ARRAY, ["|u1", [4], 0])}, []),
        ({"a": ext(ARRAY, ["<f4", [3], bytes(8)])}, []),
        ({"a": ext(ARRAY, ["<f4", [3], 1])}, [bytes(16)]),
        ({"a": ext(ARRAY, ["|O", [1], bytes(8)])}, []),
        ({"a": ext(ARRAY, ["|V8", [1], bytes(8)])}, []),
        ({"a": ext(ARRAY, ["<" + "f4" * 9, [1], bytes(4)])}, []),
        ({"a": ext(ARRAY, ["|u1", [1] * 33, bytes(1)])}, []),
        ({"a": ext(ARRAY, ["|u1", [-1], b""])}, []),
        ({"a": ext(ARRAY, ["|u1", [True], bytes(1)])}, []),
        ({"a": ext(ARRAY, ["|u1", [1]])}, []),
        ({"s": ext(SCALAR, ["<f8", bytes(4)])}, []),
        ({"x": msgpack.ExtType(42, b"\x90")}, []),
        ({"t": nested_tuples(70)}, []),
    ],
    ids=[
        "missing-frame",
        "frame-index-0",
        "inline-size-mismatch",
        "frame-size-mismatch",
        "object-dtype",
        "void-dtype",
        "long-dtype-string",
        "33-dimensions",
        "negative-dimension",
        "boolean-dimension",
        "array-header",
        "scalar-size",
        "unknown-extension",
        "nested-70-levels",
    ],
)
def test_invalid_bodies_get_a_protocol_error(wire: Wire, body: Any, buffers: list[bytes]) -> None:
    """Every array is checked (dtype allowlist, shape, size equal to its buffer) before use;
    a defect is a ProtocolError, and the host goes on serving."""
    ping(wire, body, *buffers).error("ProtocolError", "envserver.errors")
    ping(wire, {}).ok()


@pytest.mark.parametrize("raw", [b"\xc1", b"\x92\x01", b"\x81\xa1a"], ids=["c1", "short", "map"])
def test_unreadable_bodies_get_a_protocol_error(wire: Wire, raw: bytes) -> None:
    """A body that is not one msgpack document is a ProtocolError."""
    request_id = wire.next_id()
    reply = wire.ask([envelope(PROTOCOL_VERSION, request_id, int(Command.PING), None), raw])
    assert reply.request_id == request_id
    reply.error("ProtocolError", "envserver.errors")


def test_an_array_over_two_gib_is_too_large(wire: Wire) -> None:
    """An array that would take more than 2**31 bytes is refused before it is built."""
    body = {"a": ext(ARRAY, ["|u1", [2**31 + 1], b""])}
    ping(wire, body).error("MessageTooLargeError", "envserver.errors")


def test_pickle_is_refused_by_a_host_that_does_not_allow_it(
    wire: Wire, host_info: dict[str, Any]
) -> None:
    """A PICKLE value sent to a host without --allow-pickle is never unpickled."""
    if host_info["allow_pickle"]:
        pytest.skip("the host allows pickle")
    body = {"x": msgpack.ExtType(PICKLE, b"\x80\x05N.")}  # pickle of None
    ping(wire, body).error("PickleNotAllowedError", "envserver.errors")


def test_a_message_over_the_bound_is_refused(wire: Wire, host_info: dict[str, Any]) -> None:
    """A request whose frames together pass max_message_bytes (each frame within it) gets
    MessageTooLargeError, and the host goes on serving."""
    bound = host_info["max_message_bytes"]
    if bound > TESTABLE_MAX_MESSAGE_BYTES:
        pytest.skip(f"max_message_bytes {bound} is too large to test cheaply")
    half = bytes(bound // 2 + 1)
    ping(wire, {}, half, half).error("MessageTooLargeError", "envserver.errors")
    ping(wire, {}).ok()
