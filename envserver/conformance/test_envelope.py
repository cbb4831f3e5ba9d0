"""Conformance: framing, envelopes, protocol versions, request ids, exactly one reply."""

from __future__ import annotations

import msgpack
import pytest

from envserver.conformance.examples import EXAMPLES, Example
from envserver.conformance.wire import Wire, envelope, request_frames
from envserver.wire.messages import PROTOCOL_VERSION, Command

V = PROTOCOL_VERSION
EMPTY_MAP = msgpack.packb({})
HOST_INFO_TYPES = {
    "name": str,
    "pid": int,
    "instance": str,
    "envserver": str,
    "protocol": int,
    "allow_pickle": bool,
    "max_message_bytes": int,
    "sessions": int,
    "session_lease_s": float,
}


def check_host_info(info: object) -> None:
    """Host info is a map with the documented keys and types."""
    assert isinstance(info, dict), f"host info must be a map, got {info!r:.200}"
    for key, kind in HOST_INFO_TYPES.items():
        assert type(info.get(key)) is kind, f"host info {key!r} must be {kind.__name__}"
    assert info["protocol"] == PROTOCOL_VERSION
    for key in ("max_envs", "max_envs_per_session"):  # optional: the limits a host says
        if key in info:
            assert type(info[key]) is int and info[key] >= 1, f"host info {key!r}: {info[key]!r}"


def test_ping_needs_no_session_and_returns_host_info(wire: Wire) -> None:
    """PING with a nil session is answered with the host info."""
    check_host_info(wire.request(Command.PING, {}).ok())


@pytest.mark.parametrize("request_id", [0, 1, 2**31, 2**63 - 1])
def test_reply_echoes_the_request_id(wire: Wire, request_id: int) -> None:
    """Any integer request id in [0, 2**63) comes back in the reply's envelope."""
    wire.request(Command.PING, {}, request_id=request_id).ok()


@pytest.mark.parametrize("version", [V + 1, V - 1, 1000], ids=["newer", "older", "far-future"])
def test_another_protocol_version_is_refused(wire: Wire, version: int) -> None:
    """A request of another version gets ProtocolVersionError in an envelope of the host's
    version, with the request id echoed (also for HELLO: no session is opened)."""
    for command in (Command.PING, Command.HELLO):
        reply = wire.request(command, {}, version=version)
        reply.error("ProtocolVersionError", "envserver.errors")


def test_the_version_is_checked_before_the_envelope_length(wire: Wire) -> None:
    """A future version's envelope may have another length: it is still a version error."""
    reply = wire.ask([envelope(V + 1, 5, int(Command.PING), None, "extra"), EMPTY_MAP])
    assert reply.request_id == 5
    reply.error("ProtocolVersionError", "envserver.errors")


@pytest.mark.parametrize(
    ("frames", "request_id"),
    [
        ([envelope(V, 7, int(Command.PING), None)], 7),
        ([envelope(V, 7, int(Command.PING)), EMPTY_MAP], 7),
        ([envelope(V, 7, int(Command.PING), None, None), EMPTY_MAP], 7),
        ([envelope(V, 7, 99, None), EMPTY_MAP], 7),
        ([envelope(V, 7, int(Command.HELLO), "a-str-session"), EMPTY_MAP], 7),
        ([envelope(V, 7, int(Command.PING), b"s" * 300), EMPTY_MAP], 7),
        ([envelope(V, 7, int(Command.PING), None), EMPTY_MAP, *[b""] * 4095], 7),
        ([b"\xc1 not msgpack", EMPTY_MAP], None),
        ([msgpack.packb({"version": V}), EMPTY_MAP], None),
        ([envelope(V, True, int(Command.PING), None), EMPTY_MAP], None),
        ([envelope(V, "7", int(Command.PING), None), EMPTY_MAP], None),
    ],
    ids=[
        "one-frame",
        "short-envelope",
        "long-envelope",
        "unknown-command",
        "str-session",
        "envelope-over-256-bytes",
        "4097-frames",
        "unreadable-envelope",
        "envelope-not-an-array",
        "boolean-request-id",
        "string-request-id",
    ],
)
def test_malformed_envelopes_get_a_protocol_error(
    wire: Wire, frames: list[bytes], request_id: int | None
) -> None:
    """A malformed envelope gets a ProtocolError reply, with the request id where it can be
    read (else nil), and the host goes on serving."""
    reply = wire.ask(frames)
    assert reply.request_id == request_id
    reply.error("ProtocolError", "envserver.errors")
    wire.request(Command.PING, {}).ok()


def test_exactly_one_reply_per_request_in_order(wire: Wire) -> None:
    """Requests sent without waiting, good and bad, get one reply each, in order: the reply
    to a final PING comes right after theirs, so no request got a second reply."""
    batch = [
        (request_frames(Command.PING, {}, session=None, request_id=11), 11),
        ([envelope(V, 12, 99, None), EMPTY_MAP], 12),
        ([envelope(V + 1, 13, int(Command.PING), None), EMPTY_MAP], 13),
        (request_frames(Command.STEP, {}, session=bytes(16), request_id=14), 14),
        ([envelope(V, 15, int(Command.PING), None), b"\xc1"], 15),
        (request_frames(Command.RESET, {}, session=None, request_id=16), 16),
        ([b"\xff\xfe", b"garbage"], None),
        (request_frames(Command.PING, {}, session=None, request_id=18), 18),
    ]
    for frames, _ in batch:
        wire.send(frames)
    wire.send(request_frames(Command.PING, {}, session=None, request_id=99))
    received = [wire.receive().request_id for _ in range(len(batch) + 1)]
    assert received == [request_id for _, request_id in batch] + [99]


@pytest.mark.parametrize(
    "example", [e for e in EXAMPLES if e.session is None], ids=lambda e: e.title
)
def test_documented_example_requests_are_answered(wire: Wire, example: Example) -> None:
    """The example request bytes of docs/protocol.md, sent as they are, get an OK reply."""
    reply = wire.ask(example.request_frames())
    assert reply.request_id == example.request_id
    body = reply.ok()
    check_host_info({key: value for key, value in body.items() if key != "session"})
    if "session" in body:
        wire.request(Command.CLOSE, None, session=body["session"]).ok()
