"""envserver: Gymnasium environments served by env-host processes over ZeroMQ.

The package in layers, each a subpackage whose docstring says what it owns and may import:

- :mod:`envserver.errors`: the one exception tree of every layer (its name is on the wire: error
  replies name ``envserver.errors`` types). It imports nothing of envserver.
- :mod:`envserver.wire`: what travels between a client and a host (messages, codec, frames,
  spaces, batches, endpoints). Imports only the errors.
- :mod:`envserver.curve`: CURVE keys and the host's ZAP handler. Imports the errors and the wire.
- :mod:`envserver.launch`: starting hosts as processes (spawned, or forked by the fork server),
  and the trainer's settings from the environment (``ENVSERVER_HOSTS`` ...). Imports the errors
  and the wire; never loads the host.
- :mod:`envserver.host`: the env host (loop, sessions, worker, metrics). Imports the layers before,
  never the CLI or the client.
- :mod:`envserver.cli`: the ``envserver`` command.
- :mod:`envserver.client`: the trainer side, a Gymnasium vector env whose envs run on hosts. It
  imports the wire, CURVE and launching layers; never the host, nor the command line but in
  its own ``envserver rollout`` command (an entry point of it).
- :mod:`envserver.conformance` and :mod:`envserver.testing`: the protocol's conformance suite, and
  the small envs tests use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from envserver.errors import (
    BatchTypeError,
    EnvLostError,
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
    StateMismatchError,
    UnknownSessionError,
    UnsupportedSpaceError,
    UnsupportedStateError,
    WaitTimeoutError,
)

__all__ = [
    "PROTOCOL_VERSION",
    "BatchTypeError",
    "EnvLostError",
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
    "StateMismatchError",
    "UnknownSessionError",
    "UnsupportedSpaceError",
    "UnsupportedStateError",
    "WaitTimeoutError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """``PROTOCOL_VERSION``, from the wire layer when first asked for.

    The wire layer's codec imports numpy and Gymnasium: ``envserver --version`` needs neither.
    """
    if name == "PROTOCOL_VERSION":
        from envserver.wire.messages import PROTOCOL_VERSION

        return PROTOCOL_VERSION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
