"""How an env host serves: :class:`HostConfig`, whose defaults ``envserver serve`` shows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from envserver.wire.endpoints import check_endpoint
from envserver.wire.messages import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["LIMITS", "HostConfig", "check_limit"]

#: The numbers a host's settings may take: the least, and the most (None: no bound).
LIMITS: dict[str, tuple[float, float | None]] = {
    "max_message_bytes": (1024, None),
    "max_sessions": (1, None),
    "max_envs_per_session": (1, None),
    "max_envs": (1, None),
    "max_env_threads": (1, None),
    "session_lease_s": (0.0, 1e9),
    "session_idle_timeout_s": (0.0, 1e9),
    "drain_grace_s": (0.0, 1e9),
    "channel_spin_s": (0.0, 0.01),
    "metrics_port": (0, 65535),
}


def check_limit(name: str, value: float) -> float:
    """``value``, if setting ``name`` (a key of :data:`LIMITS`) may take it.

    Raises:
        ValueError: Saying what it may be (an integer for the integer settings, a finite
            number of seconds for the others).
    """
    least, most = LIMITS[name]
    whole = isinstance(least, int)
    fits = (
        (type(value) is int if whole else isinstance(value, (int, float)) and math.isfinite(value))
        and value >= least
        and (most is None or value <= most)
    )
    if not fits:
        kind = "an integer" if whole else "a number of seconds"
        span = f"from {least:g} to {most:g}" if most is not None else f"of at least {least:g}"
        raise ValueError(f"must be {kind} {span}, got {value!r}")
    return value


@dataclass
class HostConfig:
    """How a host serves.

    Attributes:
        bind: The ZeroMQ endpoint to bind, e.g. ``tcp://127.0.0.1:5555`` or ``ipc:///path``.
        allow_pickle: Accept cloudpickled env factories and values. Only for trusted networks.
        env_patterns: ``fnmatch`` patterns of env ids that may be made (``module:Id`` included).
        max_message_bytes: The largest request accepted, all frames together.
        parent_pid: Exit when this process is no longer our parent (embedded hosts).
        name: A name for logs and for clients' error messages (defaults to the endpoint).
        max_sessions: The most sessions (clients) served at once.
        max_envs_per_session: The most envs one session may make.
        max_envs: The most envs on this host, all sessions together.
        session_lease_s: A session whose client was not heard from for this long (no request,
            not even a HEARTBEAT) is closed with its envs: its client is gone. Clients renew
            the lease with HEARTBEAT (the reference client every third of it). 0: no lease.
        session_idle_timeout_s: A session whose client sent no request but HEARTBEAT for this
            long is closed (its envs are not used).
        curve_secret_key: A CURVE key file (from ``envserver keygen``): encrypt, and accept
            only clients whose public key is in ``authorized_keys``.
        authorized_keys: A directory of the public key files of the clients allowed in.
        metrics_port: Serve Prometheus metrics over HTTP on this port (0: any free port);
            None: no metrics, at no cost.
        metrics_bind: The address the metrics server binds.
        max_env_threads: The most envs one session may have stepped at once on threads (its
            MAKE's ``env_threads`` is capped to it, and without one, the host steps up to that
            many at once while the envs wait); 1 steps every session's envs in turn.
        drain_grace_s: On the first stop signal, drain for up to this long: open no new
            session, tell the clients (they move their envs elsewhere), stop once none is
            left (:mod:`envserver.host.drain`). 0: stop at once.
        channel_spin_s: How long the host watches its channels before its wait for a
            request blocks, while such watches find requests (:mod:`envserver.wire.channel`):
            for a host that has a core of its own (local hosts get it when each has one).
            0: the wait blocks at once.
    """

    bind: str = "tcp://127.0.0.1:5555"
    allow_pickle: bool = False
    env_patterns: Sequence[str] = ("*",)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    parent_pid: int | None = None
    name: str = ""
    max_sessions: int = 64
    max_envs_per_session: int = 256
    max_envs: int = 1024
    session_lease_s: float = 30.0
    session_idle_timeout_s: float = 3600.0
    curve_secret_key: str | None = None
    authorized_keys: str | None = None
    metrics_port: int | None = None
    metrics_bind: str = "127.0.0.1"
    max_env_threads: int = 64
    drain_grace_s: float = 0.0
    channel_spin_s: float = 0.0

    def __post_init__(self) -> None:
        """Refuses settings a host cannot serve with, each named with what it may be.

        Raises:
            ValueError: For the first setting out of its range (:data:`LIMITS`), or a
                ``bind`` that is not an endpoint.
        """
        check_endpoint(self.bind, bind=True)
        for name in LIMITS:
            value = getattr(self, name)
            if value is not None:
                try:
                    check_limit(name, value)
                except ValueError as exc:
                    raise ValueError(f"{name} {exc}") from None
