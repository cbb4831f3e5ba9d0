"""What a host's error reply says: the exception to raise on the trainer, or that our envs are gone.

An env's exception travels as its module, type name, message and traceback, and is rebuilt on
the trainer (:func:`~envserver.errors.rebuild_exception`) with the host and env named before its
message; an unknown session or a host that shuts down means the envs it held are lost (the
connection then fails, and recovery may bring them back).
"""

from __future__ import annotations

from envserver.errors import ProtocolError, rebuild_exception
from envserver.wire.messages import Reply, Status

__all__ = [
    "LOSS_TYPES",
    "UNKNOWN_SESSION",
    "error_type",
    "exception_from",
    "exception_of",
    "loss_of",
]

#: The error type by which a host says it holds no such session (any more).
UNKNOWN_SESSION = "UnknownSessionError"
#: Error types by which a host says that the envs of this session are gone.
LOSS_TYPES = frozenset({UNKNOWN_SESSION, "HostUnavailableError"})


def error_type(reply: Reply) -> str | None:
    """The name of the exception type an error reply describes (None: not an error reply)."""
    if reply.status != Status.ERROR or not isinstance(reply.body, dict):
        return None
    name = reply.body.get("type")
    return name if isinstance(name, str) else None


def loss_of(reply: Reply) -> str | None:
    """Why ``reply`` says its host lost our envs (it restarted, closed them, shuts down).

    Returns:
        The reason, for an error message after the host's name; None if the reply says no
        such thing.
    """
    kind = error_type(reply)
    if kind not in LOSS_TYPES:
        return None
    body = reply.body
    if kind == UNKNOWN_SESSION:
        reason = (
            "no longer holds this client's session: it restarted, or closed the session "
            "(this client was not heard from within its session lease, or was idle past its "
            "idle timeout)"
        )
    else:
        # The host says "this host ..."; the line names it already.
        reason = str(body.get("message", "is shutting down")).removeprefix("this host ")
    return f"{reason}; the envs it held are lost"


def exception_of(reply: Reply, host: str, start: int, count: int) -> BaseException:
    """The exception an error reply describes, its message naming the host and the env.

    Args:
        reply: An error reply (not a loss: see :func:`loss_of`).
        host: How messages name the host.
        start: The global index of the host's first env.
        count: How many envs the host holds (an ``env_index`` outside is not named).

    Returns:
        The exception to raise: the env's own type where it can be rebuilt, a
        ``ProtocolError`` for a malformed error reply.
    """
    body = reply.body if isinstance(reply.body, dict) else {}
    where = host
    env_index = body.get("env_index")
    if isinstance(env_index, int) and 0 <= env_index < count:
        where += f", env {start + env_index}"
    return exception_from(body, where)


def exception_from(body: dict, where: str) -> BaseException:
    """The exception an error body (an ERROR reply's, or an ``env_errors`` entry's) describes.

    Args:
        body: The error body.
        where: What its message names first (the host, the env).
    """
    if not body:
        return ProtocolError(f"{where}: malformed error reply")
    return rebuild_exception(
        str(body.get("module", "")),
        str(body.get("type", "")),
        f"{where}: {body.get('message', '')}",
        str(body.get("traceback", "")),
    )
