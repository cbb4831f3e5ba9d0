"""The one exception tree of envserver, shared by hosts and clients.

::

    EnvServerError
    ├── ProtocolError (ValueError)            a message that breaks the wire protocol
    │   ├── ProtocolVersionError              peers speak different protocol versions
    │   └── MessageTooLargeError              a message or array over the configured bound
    ├── BatchTypeError (TypeError, ValueError)  a scalar where a batch (one value per env) is due
    ├── PickleNotAllowedError (PermissionError)  pickled data sent to a peer that refuses it
    ├── EnvNotAllowedError (PermissionError)  an env id outside the host's allowlist
    ├── UnknownSessionError (LookupError)     a request for a session the host does not hold
    ├── UnsupportedSpaceError (TypeError)     a space that cannot travel as plain data
    ├── UnsupportedStateError (TypeError)     an env whose state no snapshot mechanism covers
    ├── StateMismatchError (ValueError)       a snapshot restored into another env or stack
    ├── LimitError                            a host limit (sessions, envs) would be passed
    ├── RemoteEnvError                        a remote env raised a non-builtin exception
    ├── HostUnavailableError (ConnectionError)  a host died, froze, vanished or restarted
    │   └── EnvLostError                      an agent-loop env lost with its host
    ├── RequestTimeoutError (TimeoutError)    a live host did not answer within the deadline
    └── WaitTimeoutError (multiprocessing.TimeoutError, TimeoutError)  a `*_wait` timed out

Errors raised on a host travel to the client as error replies (type name, message, remote
traceback) and are rebuilt there by :func:`rebuild_exception`. Every layer raises these, so the
module sits beside the layers rather than in one; its name is part of the protocol (an error
reply names ``envserver.errors`` as the module of these types).
``tests/client/test_errors.py`` draws the tree above from the classes and compares.
"""

from __future__ import annotations

import importlib
import multiprocessing

__all__ = [
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
    "RemoteTraceback",
    "RequestTimeoutError",
    "StateMismatchError",
    "UnknownSessionError",
    "UnsupportedSpaceError",
    "UnsupportedStateError",
    "WaitTimeoutError",
    "rebuild_exception",
]


#: The modules whose exception types :func:`rebuild_exception` keeps.
_REBUILT_MODULES = ("builtins", "gymnasium.error", __name__)


class EnvServerError(Exception):
    """Root of every error envserver raises itself."""


class ProtocolError(EnvServerError, ValueError):
    """A message that does not follow the wire protocol."""


class BatchTypeError(EnvServerError, TypeError, ValueError):
    """A single value where a batch is due (``envs.step(0)``): a TypeError, as Gymnasium raises.

    Also a ValueError, like the other wrong batches, for callers that catch those.
    """


class ProtocolVersionError(ProtocolError):
    """The two peers speak different protocol versions."""


class MessageTooLargeError(ProtocolError):
    """A message, frame or array exceeds the configured size bound."""


class PickleNotAllowedError(EnvServerError, PermissionError):
    """Pickled data was sent to a peer that was not started to accept it."""


class EnvNotAllowedError(EnvServerError, PermissionError):
    """The requested env id does not match the host's allowlist."""


class UnknownSessionError(EnvServerError, LookupError):
    """A request named a session that this host does not hold."""


class UnsupportedSpaceError(EnvServerError, TypeError):
    """A Gymnasium space type that cannot be sent as plain data."""


class UnsupportedStateError(EnvServerError, TypeError):
    """An env stack with a layer whose state no snapshot mechanism covers."""


class StateMismatchError(EnvServerError, ValueError):
    """A snapshot restored into an env of another kind, stack, version or machine."""


class LimitError(EnvServerError):
    """A host limit (sessions, envs per session, envs per host) would be passed."""


class RemoteEnvError(EnvServerError):
    """A remote env raised an exception whose type cannot be rebuilt on the client.

    Attributes:
        remote_type: The qualified name of the exception type raised on the host.
    """

    def __init__(self, message: str, remote_type: str = "") -> None:
        super().__init__(message)
        self.remote_type = remote_type


class HostUnavailableError(EnvServerError, ConnectionError):
    """A host died, exited or cannot be reached."""


class EnvLostError(HostUnavailableError):
    """An env of an agent-loop pool (``envserver.client.aio``) was lost with its host.

    Raised once, by the env's call under way or its next one; the call after it makes the env
    anew on another host (reset it before a step).

    Attributes:
        env: How messages name the env.
        host: How messages name the host it was on.
        episode_lost: Whether an episode was under way (its trajectory is cut: leave it out of
            the loss); False if the env had not been reset, or its episode had ended.
    """

    def __init__(
        self, message: str, *, env: str = "", host: str = "", episode_lost: bool = False
    ) -> None:
        super().__init__(message)
        self.env = env
        self.host = host
        self.episode_lost = episode_lost


class RequestTimeoutError(EnvServerError, TimeoutError):
    """A host that is alive (its heartbeats answer) did not answer a request in time."""


class WaitTimeoutError(EnvServerError, multiprocessing.TimeoutError, TimeoutError):
    """A ``*_wait`` call timed out (also a :class:`multiprocessing.TimeoutError`)."""


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised on another process."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def _lookup_type(module: str, name: str) -> type[BaseException] | None:
    """Finds an exception type the client may rebuild: builtins, Gymnasium's, or ours.

    Gymnasium's module is imported only here, so that importing envserver does not load it.
    """
    if module not in _REBUILT_MODULES:
        return None
    candidate = getattr(importlib.import_module(module), name, None)
    if (
        isinstance(candidate, type)
        and issubclass(candidate, Exception)
        and candidate is not RemoteTraceback
    ):
        return candidate
    return None


def rebuild_exception(module: str, name: str, message: str, remote_tb: str) -> BaseException:
    """Rebuilds an exception reported by a host, chaining its remote traceback as the cause.

    The exception keeps its type when that type is a builtin, a ``gymnasium.error`` class or an
    envserver error; any other type becomes a :class:`RemoteEnvError` naming the original type.

    Args:
        module: The module of the remote exception type.
        name: The qualified name of the remote exception type.
        message: The message, already prefixed with where the error happened.
        remote_tb: The formatted remote traceback.

    Returns:
        The exception, ready to raise.
    """
    exc: BaseException | None = None
    exc_type = _lookup_type(module, name)
    if exc_type is not None:
        try:
            exc = exc_type(message)
        except Exception:
            exc = None
    if exc is None:
        exc = RemoteEnvError(f"{message} (remote type {module}.{name})", f"{module}.{name}")
    if remote_tb:
        exc.__cause__ = RemoteTraceback(remote_tb)
    return exc
