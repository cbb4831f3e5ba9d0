"""envserver: Gymnasium environments served by env-host processes over ZeroMQ.

The package in layers, each a subpackage whose docstring says what it owns and may import:

- :mod:`envserver.errors`: the one exception tree of every layer (its name is on the wire: error
  replies name ``envserver.errors`` types). It imports nothing of envserver.
- :mod:`envserver.wire`: what travels between a client and a host (messages, codec, frames,
  spaces, batches, endpoints). Imports only the errors.
- :mod:`envserver.curve`: CURVE keys and the host's ZAP handler. Imports the errors and the wire.
- :mod:`envserver.host`: the env host (loop, sessions, worker, metrics). Imports the layers before,
  never the CLI or the client.
- :mod:`envserver.cli`: the ``envserver`` command, and how a host is started as a process.
- :mod:`envserver.client`: the trainer side, a Gymnasium vector env whose envs run on hosts. It
  imports the wire and CURVE layers and the CLI's modules but ``cli.app``; never the host.
- :mod:`envserver.conformance` and :mod:`envserver.testing`: the protocol's conformance suite, and
  the small envs tests use.
"""

from __future__ import annotations

__version__ = "0.1.0"

from envserver.errors import (
    BatchTypeError,
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
from envserver.wire.messages import PROTOCOL_VERSION

__all__ = [
    "PROTOCOL_VERSION",
    "BatchTypeError",
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
