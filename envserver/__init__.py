"""envserver: Gymnasium environments served by env-host processes over ZeroMQ.

The host side lives here (``envserver serve``), with everything both sides share: the protocol,
the codec, space conversion and the exception tree. The trainer side is the ``client`` package.
"""

from __future__ import annotations

__version__ = "0.1.0"

from envserver.errors import (
    EnvNotAllowedError,
    EnvServerError,
    HostUnavailableError,
    LimitError,
    MessageTooLargeError,
    PickleNotAllowedError,
    ProtocolError,
    ProtocolVersionError,
    RemoteEnvError,
    RequestTimeoutError,
    UnknownSessionError,
    UnsupportedSpaceError,
    WaitTimeoutError,
)
from envserver.protocol import PROTOCOL_VERSION

__all__ = [
    "PROTOCOL_VERSION",
    "EnvNotAllowedError",
    "EnvServerError",
    "HostUnavailableError",
    "LimitError",
    "MessageTooLargeError",
    "PickleNotAllowedError",
    "ProtocolError",
    "ProtocolVersionError",
    "RemoteEnvError",
    "RequestTimeoutError",
    "UnknownSessionError",
    "UnsupportedSpaceError",
    "WaitTimeoutError",
    "__version__",
]
