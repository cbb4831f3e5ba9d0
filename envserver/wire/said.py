"""What envs said while a host ran a command: the reply's *said* frame (protocol version 5).

An env warns (Python's ``warnings``) and writes to stdout and stderr; a trainer should hear it
as it does from ``AsyncVectorEnv``'s workers. A reply whose envelope's fourth item is 1 carries,
as its last frame, a plain msgpack map (never pickled, no extension types)::

    {"warnings": [{"category": str, "message": str, "filename": str, "lineno": int,
                   "envs": [int, ...], "count": int}, ...],
     "output":   [{"text": str, "envs": [int, ...], "count": int}, ...],
     "cut":      {"warnings": int, "lines": int, "bytes": int}}

``envs`` are indices within the session's block (empty: output the host cannot attribute to
one env, such as a native library's); ``count`` how many times the entry was said in the
command; ``cut`` what the host left out to stay within :data:`LIMITS`. ``category`` is the
warning class's qualified name, ``module.QualName`` (``builtins.UserWarning``); a receiver maps
it to a class it knows and never imports a module for it.

:func:`check_said` validates a received document: anything else is a ``ProtocolError``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

from envserver.errors import ProtocolError

__all__ = ["LIMITS", "SaidLimits", "check_said", "decode_said", "encode_said"]


@dataclasses.dataclass(frozen=True)
class SaidLimits:
    """Bounds of one reply's said frame: a host keeps within them, a client refuses beyond.

    Attributes:
        warnings: The most warning entries.
        lines: The most output entries.
        line_chars: The longest text of one entry (a host cuts longer lines).
        frame_bytes: The largest said frame a client accepts.
    """

    warnings: int = 64
    lines: int = 200
    line_chars: int = 2000
    frame_bytes: int = 1 << 20


#: The bounds of this protocol version.
LIMITS = SaidLimits()
#: Above the largest line number: ``warnings.warn_explicit`` takes a C int.
MAX_LINENO = 2**31

_WARNING_FIELDS = {
    "category": str,
    "message": str,
    "filename": str,
    "lineno": int,
    "envs": list,
    "count": int,
}
_OUTPUT_FIELDS = {"text": str, "envs": list, "count": int}
_CUT_FIELDS = ("warnings", "lines", "bytes")


def encode_said(said: dict[str, Any]) -> bytes:
    """The said frame of a document the host built (see :func:`check_said` for its shape)."""
    return msgpack.packb(said, use_bin_type=True)


def decode_said(frame: Any) -> dict[str, Any]:
    """Reads and checks a received said frame.

    Raises:
        ProtocolError: If it is too large, not plain msgpack, or not a said document.
    """
    size = memoryview(frame).nbytes
    if size > LIMITS.frame_bytes:
        raise ProtocolError(f"said frame of {size} bytes exceeds {LIMITS.frame_bytes}")
    try:
        said = msgpack.unpackb(frame, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"unreadable said frame: {exc}") from exc
    return check_said(said)


def _no_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"a said frame holds no extension types (got type {code})")


def check_said(said: Any) -> dict[str, Any]:
    """Checks a said document's shape, types and bounds; returns it.

    Raises:
        ProtocolError: Naming what does not fit.
    """
    if not isinstance(said, dict):
        raise ProtocolError("a said frame must be a map")
    warnings = _entries(said, "warnings", _WARNING_FIELDS, LIMITS.warnings)
    output = _entries(said, "output", _OUTPUT_FIELDS, LIMITS.lines)
    cut = said.get("cut", {})
    if not isinstance(cut, dict) or not all(_count(cut.get(k, 0)) for k in _CUT_FIELDS):
        raise ProtocolError("said 'cut' must map warnings, lines and bytes to counts")
    for entry in output:
        if len(entry["text"]) > LIMITS.line_chars:
            raise ProtocolError(f"said output longer than {LIMITS.line_chars} characters")
    for entry in warnings:  # a line number, as warnings.warn_explicit takes it (a C int)
        if not 0 <= entry["lineno"] < MAX_LINENO:
            raise ProtocolError(f"said warning 'lineno' out of range: {entry['lineno']}")
    return {
        "warnings": warnings,
        "output": output,
        "cut": {k: cut.get(k, 0) for k in _CUT_FIELDS},
    }


def _entries(said: dict, key: str, fields: dict[str, type], most: int) -> list[dict[str, Any]]:
    entries = said.get(key, [])
    if not isinstance(entries, list):
        raise ProtocolError(f"said {key!r} must be an array")
    if len(entries) > most:
        raise ProtocolError(f"said {key!r} has {len(entries)} entries, more than {most}")
    for entry in entries:
        if not isinstance(entry, dict):
            raise ProtocolError(f"said {key!r} entries must be maps")
        for name, kind in fields.items():
            value = entry.get(name)
            if type(value) is not kind:  # bool is not an int here
                raise ProtocolError(f"said {key!r} entry needs {name!r} of type {kind.__name__}")
        if not all(_count(i) for i in entry["envs"]) or entry["count"] < 1:
            raise ProtocolError(f"said {key!r} entry has bad env indices or count")
    return entries


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0
