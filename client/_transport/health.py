"""Whether one host is still usable: its failure once it is not, and the verdicts that find it.

A connection's :class:`HostHealth` owns its :attr:`~HostHealth.failure` (a typed state and a
reason: :class:`~.requests.Failure`). It is set once, by what the host did (a reply that is not
valid, an error reply that says our envs are gone) or by the liveness verdicts a wait asks for
on every round (:class:`~.liveness.Liveness`: a dropped link, an exited process, the request
deadline); an earlier failure stays, as the cause. The exception that reports it
(:meth:`HostHealth.error`) is of its own type the first time, ``HostUnavailableError`` after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from envserver.errors import EnvServerError, HostUnavailableError
from envserver.wire.reach import Reachability

from .block import HostBlock
from .liveness import Liveness
from .requests import Failure, Pending
from .settings import ConnectionSettings

__all__ = ["HostHealth"]

#: What the error of a host lost says in a vector env that does not recover.
_RECOVERY_HINT = (
    '; on_host_failure="restart" would make its envs anew and go on (or "restore", with their '
    'state): vector_kwargs={"on_host_failure": "restart"} for make_vec, or the RemoteVectorEnv '
    "argument"
)


class HostHealth:
    """The failure of one connection's host, once it failed, and how it is found and reported.

    Args:
        block: The host and its envs, as failures name them.
        settings: The vector env's connection settings (bounds; whether it recovers).
        process: For a local host, a callable that raises ``HostUnavailableError`` once its
            process exited (see :class:`~.liveness.Liveness`); None for a remote host.
        refused_fails: Whether a refused connection (nothing listens at the endpoint) fails
            it at once (see :class:`~.liveness.Liveness`).
    """

    def __init__(
        self,
        block: HostBlock,
        settings: ConnectionSettings,
        process: Callable[[float], None] | None = None,
        refused_fails: bool = False,
    ) -> None:
        self._who = block.who
        self._recovers = settings.recovers
        #: Why this host is unusable, once it is (see :meth:`fail`).
        self.failure: Failure | None = None
        self._told = False  # whether a wait reported it yet
        #: Whether to give up on the host while requests are under way.
        self.liveness = Liveness(
            block.endpoint, block.who, block.envs, settings, process, refused_fails
        )

    @property
    def failed(self) -> bool:
        """Whether this host is unusable (see :attr:`failure`)."""
        return self.failure is not None

    def fail(self, reason: str, error_type: type[EnvServerError] = HostUnavailableError) -> None:
        """Marks this host unusable for ``reason`` (the host and its envs are named before it).

        The first wait that reports it raises ``error_type``; later ones
        ``HostUnavailableError`` (or recover it, with ``on_host_failure="restart"``). An earlier
        failure stays: it is the cause.
        """
        if self.failure is None:
            self.failure = Failure(error_type, f"{self._who} {reason}")

    def error(self, held: bool) -> EnvServerError:
        """The exception that reports :attr:`failure` (see :meth:`fail`).

        Args:
            held: Whether the connection holds a session: a host lost while it held envs, in
                a vector env that does not recover, says how it could have gone on.
        """
        first, self._told = not self._told, True
        failure = self.failure
        lost = failure.error_type is HostUnavailableError and held
        if lost and not self._recovers:
            failure = dataclasses.replace(failure, message=failure.message + _RECOVERY_HINT)
        return failure.error(first)

    def watch(self, reach: Reachability, outstanding: Mapping[int, Pending]) -> None:
        """Fails this host if its connection, its process or the request deadline says so.

        Args:
            reach: The reachability of the connection's link (diagnosed here).
            outstanding: The connection's requests under way (the oldest one's send starts
                the request deadline).
        """
        reach.diagnose()
        oldest = min(p.sent_at for p in outstanding.values()) if outstanding else None
        if self.failure is None:
            self.failure = self.liveness.verdict(reach, oldest)
