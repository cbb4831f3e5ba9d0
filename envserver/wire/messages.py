"""The envserver wire protocol: version, commands, statuses and the message layout.

Both sides import this module; it holds no host-only code. ``docs/protocol.md`` describes the
same protocol in prose, and the two change together.

A request, sent by a client's DEALER socket to a host's ROUTER socket, is a multipart message::

    frame 0   envelope: msgpack [version, request_id, command, session]
    frame 1   body: a codec document (see :mod:`envserver.wire.codec`)
    frame 2+  raw array buffers the body refers to
    (STEP_RAW: frames 1+ are raw arrays in the session's layout, see :mod:`envserver.wire.raw`)

A reply echoes the request id::

    frame 0   envelope: msgpack [version, request_id, status, said]
    frame 1   body (for an error: see :func:`error_body`)
    frame 2+  raw array buffers
    last      when ``said`` is 1: what the envs said (see :mod:`envserver.wire.said`)

The host sends exactly one reply per well-framed request; a client drops replies whose request
id is not the one it waits for (late answers to abandoned requests).
"""

from __future__ import annotations

import enum
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from envserver.errors import ProtocolError, ProtocolVersionError
from envserver.wire import codec
from envserver.wire.said import decode_said

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_ENVELOPE_BYTES",
    "MAX_FRAMES",
    "MAX_RETRY_WINDOW",
    "PROTOCOL_VERSION",
    "Command",
    "RawStepEnvelopes",
    "Reply",
    "Request",
    "Status",
    "add_said",
    "decode_reply",
    "decode_request",
    "encode_raw_reply",
    "encode_raw_request",
    "encode_reply",
    "encode_request",
    "error_body",
    "peek_request",
    "raw_reply_envelope",
    "request_id_of",
]

#: Bumped on every incompatible change of the layout or of a command's body.
PROTOCOL_VERSION = 7  # 2: env_ids in CALL and SET_ATTR, WRAPPERS, SET_ATTR outermost
# 3: HEARTBEAT, and the session lease (a session whose client is not heard from is closed)
# 4: a MAKE without "env_threads" lets the host choose (it meant 1); HEARTBEAT states them
# 5: replies carry what the envs said (warnings, output) when HELLO asked for it
# 6: STEP_RAW, and the MAKE reply's "step_layout"
# 7: MAKE's "kind": PettingZoo Parallel envs, in the agents layout; GET_STATE and SET_STATE
#: Default bound on one whole message, all frames together (ZMQ_MAXMSGSIZE applies per frame).
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: The most frames one message may have.
MAX_FRAMES = 4096
#: The largest envelope frame accepted.
MAX_ENVELOPE_BYTES = 256
#: The most replies a session keeps for retries (MAKE's ``"retry_window"``).
MAX_RETRY_WINDOW = 4096


class Command(enum.IntEnum):
    """What a request asks the host to do."""

    HELLO = 1
    """Open a session. Body: ``{"client": str, "pickle": bool, "said": bool}`` (every envelope
    carries the protocol version, so a mismatch is refused from the first request on);
    ``"said"``: send what the envs say with the replies."""
    MAKE = 2
    """Create the session's envs from an env id and kwargs, or from pickled factories.

    Body: ``{"autoreset_mode", "env_id", "kwargs", "num_envs"}`` or ``{"autoreset_mode",
    "factories"}``, plus optional ``"autoreset_pending"``, ``"env_threads"`` (step up to that
    many envs at once on threads, capped by the host; absent, the host chooses) and
    ``"retry_window"`` (keep the replies of that many latest requests for retries; 1 if
    absent). The reply
    carries every env's spaces, so the client checks them itself (a separate space-check command
    would add a round trip and nothing else), and the ``"env_threads"`` the host uses."""
    RESET = 3
    """Reset envs: ``{"seeds": [...], "options": {...} | None, "env_ids": [int] | None}``."""
    STEP = 4
    """Step envs: ``{"actions": <batched actions>, "env_ids": [int] | None}`` (None: all)."""
    CALL = 5
    """Call a method or read an attribute: ``{"name", "args", "kwargs", "env_ids"}``."""
    SET_ATTR = 6
    """Set an attribute: ``{"name": str, "values": [one per env], "env_ids", "outermost"}``."""
    RENDER = 7
    """Render every env."""
    CLOSE = 8
    """Close the session's envs and forget the session."""
    PING = 9
    """Liveness check; needs no session."""
    WRAPPERS = 10
    """The wrapper chain of each env: ``{"env_ids"}``; per env, per wrapper, its MRO's names."""
    HEARTBEAT = 11
    """Renews the session's lease; body ignored. Reply ``{"session_lease_s": float}``. Does not
    count as using the session (idle timeout), and is not cached for retries."""
    STEP_RAW = 12
    """STEP with raw array frames in the session's layout (:mod:`envserver.wire.raw`): the
    request's and the OK reply's frames after the envelope are not a codec body."""
    GET_STATE = 13
    """Snapshot envs: ``{"env_ids"}``; per env, its snapshot's bytes (:mod:`envserver.state`)."""
    SET_STATE = 14
    """Restore envs: ``{"states": [bytes, one per env], "env_ids"}``; per env, ``[obs, info,
    ended]`` of the snapshot's moment."""


class Status(enum.IntEnum):
    """Whether a request succeeded."""

    OK = 0
    ERROR = 1


#: The members by value, for the hot path (a lookup here costs far less than ``Command(x)``).
_COMMANDS = {int(member): member for member in Command}
_STATUSES = {int(member): member for member in Status}
_STEP_RAW = int(Command.STEP_RAW)
_OK = int(Status.OK)


@dataclass(frozen=True)
class Request:
    """A decoded request."""

    request_id: int
    command: Command
    session: bytes | None
    body: Any


@dataclass(frozen=True)
class Reply:
    """A decoded reply; ``said`` is what the envs said while the host ran the command."""

    request_id: int | None
    status: Status
    body: Any
    said: dict[str, Any] | None = None


def encode_request(
    request_id: int, command: Command, session: bytes | None, body: Any, *, allow_pickle: bool
) -> list[Any]:
    """Builds the frames of a request.

    Args:
        request_id: The id the reply will echo.
        command: The command.
        session: The session id, or None for HELLO and PING.
        body: The command's body.
        allow_pickle: Whether values without a plain encoding may be sent pickled.

    Returns:
        The frames.
    """
    envelope = codec.pack_plain([PROTOCOL_VERSION, request_id, int(command), session])
    return [envelope, *codec.encode(body, allow_pickle=allow_pickle)]


def encode_reply(
    request_id: int | None,
    status: Status,
    body: Any,
    *,
    allow_pickle: bool = False,
    said: bytes | None = None,
) -> list[Any]:
    """Builds the frames of a reply.

    Args:
        request_id: The id of the request answered (None if it could not be read).
        status: OK or ERROR.
        body: The result, or an :func:`error_body`.
        allow_pickle: Whether values without a plain encoding may be sent pickled.
        said: The said frame (:func:`envserver.wire.said.encode_said`), or None.

    Returns:
        The frames.
    """
    flag = 0 if said is None else 1
    envelope = codec.pack_plain([PROTOCOL_VERSION, request_id, int(status), flag])
    frames = [envelope, *codec.encode(body, allow_pickle=allow_pickle)]
    if said is not None:
        frames.append(said)
    return frames


def encode_raw_request(request_id: int, session: bytes, frames: list[Any]) -> list[Any]:
    """Builds the frames of a STEP_RAW request from its raw frames (``StepLayout``)."""
    return [codec.pack_plain([PROTOCOL_VERSION, request_id, _STEP_RAW, session]), *frames]


def encode_raw_reply(request_id: int, frames: list[Any]) -> list[Any]:
    """Builds the frames of an OK STEP_RAW reply from its raw frames (``StepLayout``)."""
    return [raw_reply_envelope(request_id), *frames]


def raw_reply_envelope(request_id: int) -> bytes:
    """The envelope of an OK reply with nothing said, as :func:`encode_raw_reply` encodes it.

    A client may compare a reply's first frame with it rather than decode it: equal bytes are
    that envelope. Any other frame (another encoding of it too) is decoded as usual.
    """
    return codec.pack_plain([PROTOCOL_VERSION, request_id, _OK, 0])


class RawStepEnvelopes:
    """The envelopes of STEP_RAW requests and of their OK replies, packed by a packer held here.

    The same bytes as :func:`encode_raw_request` and :func:`raw_reply_envelope` pack, at two C
    calls per request: for a client's lean step (one sender, one thread at a time).
    """

    def __init__(self) -> None:
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def of(self, request_id: int, session: bytes) -> tuple[bytes, bytes]:
        """A STEP_RAW request's envelope, and that of its OK reply with nothing said."""
        pack = self._pack
        return (
            pack([PROTOCOL_VERSION, request_id, _STEP_RAW, session]),
            pack([PROTOCOL_VERSION, request_id, _OK, 0]),
        )


def add_said(reply: list[Any], said: bytes) -> list[Any]:
    """A reply's frames with a said frame added (``said`` becomes 1 in its envelope)."""
    version, request_id, status, _ = msgpack.unpackb(reply[0])
    return [codec.pack_plain([version, request_id, status, 1]), *reply[1:], said]


def _envelope(frames: list[Any], length: int, *, reply: bool) -> list[Any]:
    if len(frames) < 2:
        raise ProtocolError(f"a message needs at least 2 frames, got {len(frames)}")
    if len(frames) > MAX_FRAMES:
        raise ProtocolError(f"a message may have at most {MAX_FRAMES} frames, got {len(frames)}")
    raw = frames[0]
    size = memoryview(raw).nbytes
    if size > MAX_ENVELOPE_BYTES:
        raise ProtocolError("envelope frame too large")
    try:
        envelope = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:
        start = memoryview(raw).tobytes()[:16].hex(" ")  # (at most MAX_ENVELOPE_BYTES)
        raise ProtocolError(
            f"unreadable envelope of {size} bytes in a message of {len(frames)} frames "
            f"(it starts {start or 'with nothing'}): {exc}"
        ) from exc
    if not isinstance(envelope, list) or not envelope:
        raise ProtocolError(f"the envelope must be an array of {length} items")
    if envelope[0] != PROTOCOL_VERSION:  # first, whatever shape another version's envelope has
        raise ProtocolVersionError(
            f"protocol version mismatch: this side speaks version {PROTOCOL_VERSION}, "
            f"the peer sent version {envelope[0]!r}; install the same envserver release on "
            "both sides"
        )
    if len(envelope) != length:
        raise ProtocolError(f"the envelope must be an array of {length} items")
    if type(envelope[1]) is not int and not (reply and envelope[1] is None):  # as _is_int
        raise ProtocolError("the request id must be an integer")
    return envelope


def _is_int(value: Any) -> bool:
    return type(value) is int  # what msgpack decodes: int or bool, never another subclass


def request_id_of(frames: list[Any]) -> int | None:
    """Reads the request id of a message whose envelope may be broken, if it can.

    Args:
        frames: The frames as received.

    Returns:
        The request id, or None where it cannot be read.
    """
    try:
        envelope = msgpack.unpackb(frames[0], raw=False)
        return envelope[1] if _is_int(envelope[1]) else None
    except Exception:
        return None


def peek_request(frames: list[Any]) -> tuple[int | None, bytes | None]:
    """Reads the command and the session of a request without decoding it, if it can.

    For a host that must know whose requests are queued before it serves them; the request
    is validated when it is served.

    Args:
        frames: The frames as received (without the ROUTER's identity frame).

    Returns:
        The command's code and the session id, each None where it cannot be read.
    """
    try:
        if memoryview(frames[0]).nbytes > MAX_ENVELOPE_BYTES:
            return None, None
        _, _, command, session = msgpack.unpackb(frames[0], raw=False)
    except Exception:
        return None, None
    return (
        command if _is_int(command) else None,
        session if isinstance(session, bytes) else None,
    )


def decode_request(frames: list[Any], *, allow_pickle: bool) -> Request:
    """Decodes and validates the frames of a request.

    Args:
        frames: The frames as received (without the ROUTER's identity frame).
        allow_pickle: Whether pickled values may be unpickled.

    Returns:
        The request.

    Raises:
        ProtocolError: If the message is malformed; ProtocolVersionError if the version differs.
        PickleNotAllowedError: If it carries pickle and pickle is not allowed.
    """
    _, request_id, command, session = _envelope(frames, 4, reply=False)
    try:
        command = _COMMANDS[command]  # Command(command), without the Enum call's cost
    except (KeyError, TypeError):
        raise ProtocolError(f"unknown command {command!r}") from None
    if session is not None and not isinstance(session, bytes):
        raise ProtocolError("the session id must be bytes or nil")
    if command is Command.STEP_RAW:  # raw frames, read with the session's layout
        return Request(request_id, command, session, frames[1:])
    body = codec.decode(frames[1:], allow_pickle=allow_pickle)
    return Request(request_id, command, session, body)


def decode_reply(
    frames: list[Any],
    *,
    allow_pickle: bool,
    writable: bool = True,
    raw: Callable[[list[Any]], Any] | None = None,
) -> Reply:
    """Decodes and validates the frames of a reply.

    Args:
        frames: The frames as received.
        allow_pickle: Whether pickled values may be unpickled.
        writable: False to get arrays carried in frames as read-only zero-copy views.
        raw: For a STEP_RAW reply, what reads an OK reply's body frames (``StepLayout``).

    Returns:
        The reply.

    Raises:
        ProtocolError: If the message is malformed; ProtocolVersionError if the version differs.
    """
    _, request_id, status, flag = _envelope(frames, 4, reply=True)
    try:
        status = _STATUSES[status]
    except (KeyError, TypeError):
        raise ProtocolError(f"unknown status {status!r}") from None
    if type(flag) is not int or flag not in (0, 1) or len(frames) < 2 + flag:
        raise ProtocolError(f"said must be 0, or 1 with a said frame last, got {flag!r}")
    said = decode_said(frames[-1]) if flag else None
    body_frames = frames[1 : len(frames) - flag]
    if raw is not None and status is Status.OK:
        return Reply(request_id, status, raw(body_frames), said)
    body = codec.decode(body_frames, allow_pickle=allow_pickle, writable=writable)
    return Reply(request_id, status, body, said)


def error_body(
    exc: BaseException, env_index: int | None = None, *, texts: bool = True
) -> dict[str, Any]:
    """Describes an exception for an error reply.

    Args:
        exc: The exception.
        env_index: The index, within the session, of the env that raised it, if any.
        texts: False leaves its message and traceback empty (for an exception whose text
            will not encode: the reply keeps its type).

    Returns:
        ``{"module", "type", "message", "traceback", "env_index"}``.
    """
    exc_type = type(exc)
    return {
        "module": exc_type.__module__,
        "type": exc_type.__qualname__,
        "message": str(exc) if texts else "",
        "traceback": (
            "".join(traceback.format_exception(exc_type, exc, exc.__traceback__)) if texts else ""
        ),
        "env_index": env_index,
    }
