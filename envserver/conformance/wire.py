"""A bare wire connection for the conformance suite: a DEALER socket, frames and msgpack.

It speaks ``docs/protocol.md`` directly and checks every reply against it; it shares nothing
with ``envserver.client`` (the reference client), so the suite tests the protocol, not that
client. Bodies are encoded and decoded with :mod:`envserver.wire.codec`, whose rules (extension
types, array checks) are part of the protocol.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from envserver.wire import codec
from envserver.wire.endpoints import prepare_socket
from envserver.wire.messages import PROTOCOL_VERSION, Command
from envserver.wire.said import decode_said

__all__ = ["ERROR", "OK", "Wire", "WireReply", "envelope"]

#: Reply statuses, as the protocol numbers them.
OK = 0
ERROR = 1
#: The keys of an ERROR reply's body, and the types their values must have.
ERROR_KEYS = {"module": str, "type": str, "message": str, "traceback": str}


def envelope(*items: Any) -> bytes:
    """Packs an envelope frame as given, e.g. ``envelope(2, 7, 9, None)`` (no checks)."""
    return msgpack.packb(list(items), use_bin_type=True)


@dataclass(frozen=True)
class WireReply:
    """A reply as received, its envelope checked against the protocol.

    Attributes:
        frames: Every frame, as bytes.
        request_id: The echoed request id (None for ``nil``).
        status: 0 (OK) or 1 (ERROR).
        body: The decoded body.
        said: What the envs said (the checked said frame), or None.
    """

    frames: list[bytes]
    request_id: int | None
    status: int
    body: Any
    said: dict[str, Any] | None = None

    def ok(self) -> Any:
        """The body of an OK reply; fails the test with the error's details otherwise."""
        assert self.status == OK, f"expected an OK reply, got ERROR: {_describe_error(self.body)}"
        return self.body

    def error(self, type_name: str | tuple[str, ...], module: str | None = None) -> dict[str, Any]:
        """The body of an ERROR reply naming ``module.type_name``; fails the test otherwise.

        Args:
            type_name: The exception type's name, or the names accepted.
            module: The type's module, if it must be checked.
        """
        names = (type_name,) if isinstance(type_name, str) else type_name
        assert self.status == ERROR, f"expected an ERROR ({type_name}), got OK: {self.body!r:.300}"
        body = self.body
        assert isinstance(body, dict), f"an ERROR body must be a map, got {body!r:.200}"
        for key, kind in ERROR_KEYS.items():
            assert isinstance(body.get(key), kind), f"ERROR body key {key!r} must be a {kind}"
        index = body.get("env_index", "missing")
        assert index is None or type(index) is int, f"env_index must be int or nil, got {index!r}"
        assert body["type"] in names, f"expected {type_name}, got {_describe_error(body)}"
        if module is not None:
            assert body["module"] == module, f"expected {module}, got {_describe_error(body)}"
        return body


def _describe_error(body: Any) -> str:
    if isinstance(body, dict):
        return f"{body.get('module')}.{body.get('type')}: {body.get('message')!s:.300}"
    return f"{body!r:.300}"


class Wire:
    """One DEALER connection to an endpoint, sending frames and checking the replies' envelopes.

    Args:
        endpoint: The host's endpoint.
        curve: ``(server_public, client_public, client_secret)`` CURVE keys, or None.
        timeout_s: How long to wait for each reply; no reply in time fails the test.
    """

    def __init__(
        self,
        endpoint: str,
        curve: tuple[bytes, bytes, bytes] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            self._socket.curve_serverkey, self._socket.curve_publickey = curve[0], curve[1]
            self._socket.curve_secretkey = curve[2]
        prepare_socket(self._socket, endpoint)
        self._socket.connect(endpoint)
        self._ids = itertools.count(1)

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the socket and its context."""
        self._socket.close(linger=0)
        self._context.term()

    def next_id(self) -> int:
        """A request id greater than every one this connection handed out before."""
        return next(self._ids)

    def send(self, frames: list[Any]) -> None:
        """Sends a message of raw frames, as given."""
        self._socket.send_multipart(frames)

    def receive(self, timeout_s: float | None = None, *, raw: bool = False) -> WireReply:
        """Receives one reply and checks its envelope (3 items, version, id, status).

        Args:
            timeout_s: How long to wait (default: the connection's timeout).
            raw: The reply answers a STEP_RAW: an OK reply's body is its raw frames.

        Returns:
            The reply.

        Raises:
            AssertionError: If no reply arrives in time or it breaks the protocol.
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        assert self._socket.poll(int(timeout_s * 1000)), (
            f"{self.endpoint} sent no reply within {timeout_s:g} s (every request gets one)"
        )
        frames = [bytes(frame) for frame in self._socket.recv_multipart()]
        return check_reply(frames, raw=raw)

    def pending(self, timeout_s: float = 0.0) -> bool:
        """Whether a message is waiting to be received (within ``timeout_s``)."""
        return bool(self._socket.poll(int(timeout_s * 1000)))

    def ask(self, frames: list[Any], *, raw: bool = False) -> WireReply:
        """Sends raw frames and receives the reply (``raw``: as for :meth:`receive`)."""
        self.send(frames)
        return self.receive(raw=raw)

    def request(
        self,
        command: int,
        body: Any = None,
        *,
        session: bytes | None = None,
        request_id: int | None = None,
        version: int = PROTOCOL_VERSION,
    ) -> WireReply:
        """Sends a well-framed request and receives its reply, checking the echoed id.

        Args:
            command: The command code.
            body: The body, encoded with the codec (arrays over 1024 bytes in their own frames).
            session: The session id, or None.
            request_id: The id (default: :meth:`next_id`).
            version: The protocol version to claim.

        Returns:
            The reply.
        """
        request_id = self.next_id() if request_id is None else request_id
        frames = request_frames(command, body, session=session, request_id=request_id)
        if version != PROTOCOL_VERSION:
            frames[0] = envelope(version, request_id, int(command), session)
        reply = self.ask(frames)
        assert reply.request_id == request_id, (
            f"the reply to request {request_id} carries request id {reply.request_id!r}"
        )
        return reply

    def hello(self, client: str = "envserver-conformance") -> bytes:
        """Opens a session; returns its id."""
        body = self.request(Command.HELLO, {"client": client, "pickle": False}).ok()
        assert isinstance(body, dict), f"the HELLO reply must be a map, got {body!r:.200}"
        session = body.get("session")
        assert isinstance(session, bytes) and session, "HELLO must return a non-empty bin session"
        return session


def request_frames(
    command: int, body: Any, *, session: bytes | None, request_id: int
) -> list[bytes]:
    """The frames of a request, built from the documented layout (not from ``protocol``)."""
    frames = codec.encode(body)
    return [envelope(PROTOCOL_VERSION, request_id, int(command), session)] + [
        bytes(memoryview(frame).cast("B")) for frame in frames
    ]


def check_reply(frames: list[bytes], *, raw: bool = False) -> WireReply:
    """Checks a reply's framing and envelope against the protocol and decodes its body.

    Args:
        frames: The reply's frames.
        raw: The reply answers a STEP_RAW: an OK reply's body is its frames between the
            envelope and a said frame, as bytes (checked by the caller).

    Raises:
        AssertionError: If the reply breaks the protocol.
    """
    assert 2 <= len(frames) <= 4096, f"a reply has 2 to 4096 frames, got {len(frames)}"
    assert len(frames[0]) <= 256, f"the envelope frame is at most 256 bytes: {len(frames[0])}"
    try:
        head = msgpack.unpackb(frames[0], raw=False)
    except Exception as exc:
        raise AssertionError(f"the reply envelope is not msgpack: {exc}") from exc
    assert isinstance(head, list) and len(head) == 4, (
        f"a reply envelope is an array [version, request_id, status, said], got {head!r:.200}"
    )
    version, request_id, status, flag = head
    assert version == PROTOCOL_VERSION, f"reply version {version!r}, expected {PROTOCOL_VERSION}"
    assert request_id is None or type(request_id) is int, f"bad request id {request_id!r}"
    assert status in (OK, ERROR) and type(status) is int, f"unknown status {status!r}"
    assert flag in (0, 1) and type(flag) is int, f"said must be 0 or 1, got {flag!r}"
    assert len(frames) >= 2 + flag, "a reply with said 1 has a said frame after its body"
    said = None
    if flag:
        try:
            said = decode_said(frames[-1])
        except Exception as exc:
            raise AssertionError(f"the said frame breaks the protocol: {exc}") from exc
    if raw and status == OK:
        return WireReply(frames, request_id, status, frames[1 : len(frames) - flag], said)
    try:
        body = codec.decode(frames[1 : len(frames) - flag])
    except Exception as exc:
        raise AssertionError(
            f"the reply body breaks the codec: {type(exc).__name__}: {exc}"
        ) from exc
    return WireReply(frames, request_id, status, body, said)
