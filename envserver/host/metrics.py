"""Prometheus metrics of one env host, served over HTTP at ``/metrics``.

A host started with ``--metrics-port`` counts into :class:`HostMetrics`; without it, into
:class:`NoMetrics`, whose methods do nothing, so the hot path pays nothing for metrics it does not
serve. Counts are exact: a vector step over 4 envs counts 4 env steps (env steps are those of
successful STEP requests: a step in which an env raised counts none). Gauges (sessions, envs)
are read from the host when scraped, never updated on the hot path.

Needs ``prometheus-client`` (``pip install 'envserver[metrics]'``; the container image has it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from envserver.host.sessions import Eviction
from envserver.wire.messages import Command

__all__ = ["METRIC_NAMES", "HostMetrics", "NoMetrics"]

logger = logging.getLogger(__name__)

#: Seconds: request durations from tens of microseconds (a cached reply) to minutes (a make).
DURATION_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, float("inf"),
)  # fmt: skip
#: What a host exposes besides the library's process, platform and GC metrics.
METRIC_NAMES = (
    "envserver_env_steps_total",
    "envserver_requests_total",
    "envserver_request_duration_seconds",
    "envserver_env_errors_total",
    "envserver_sessions",
    "envserver_envs",
    "envserver_sessions_evicted_total",
    "envserver_sessions_refused_total",
    "envserver_envs_on_threads",
    "envserver_env_threads_switches_total",
    "envserver_drains_total",
    "envserver_envs_moved_total",
)
#: The command label of a request that could not be read.
UNREADABLE = "unreadable"
#: Why a host closes a session: the ``reason`` label of the evicted-sessions counter.
EVICTION_REASONS = tuple(reason.value for reason in Eviction)


class NoMetrics:
    """Counts nothing (a host without ``--metrics-port``)."""

    #: The port metrics are served on (None: not served).
    port: int | None = None

    def request(self, command: Command | None, ok: bool, seconds: float) -> None:
        """A request answered (OK or ERROR), and how long the host took."""

    def env_steps(self, count: int) -> None:
        """Env steps served."""

    def env_error(self) -> None:
        """An exception an env raised, returned to its client."""

    def session_evicted(self, reason: str) -> None:
        """A session closed by the host: ``"lease"`` (its client is gone) or ``"idle"``."""

    def session_refused(self) -> None:
        """A session or its envs refused for a limit."""

    def env_threads_switched(self) -> None:
        """A session's envs switched between stepping in turn and on threads (automatic)."""

    def drain_begun(self) -> None:
        """A drain began (a stop signal, with a grace period)."""

    def envs_moved(self, count: int) -> None:
        """Envs whose client closed their session while the host drained (moved elsewhere)."""

    def close(self) -> None:
        """Stops serving metrics."""


class HostMetrics(NoMetrics):
    """The metrics of one host, in a registry of its own, served over HTTP.

    Args:
        sessions: Reads the number of open sessions (at scrape time).
        envs: Reads the number of envs all sessions hold (at scrape time).
        envs_on_threads: Reads the number of envs stepped on threads now (at scrape time).
        port: The HTTP port (0: any free port; see :attr:`port`).
        address: The address to bind.

    Raises:
        ImportError: If prometheus-client is not installed.
        OSError: If the port cannot be bound.
    """

    def __init__(
        self,
        sessions: Callable[[], int],
        envs: Callable[[], int],
        envs_on_threads: Callable[[], int],
        port: int,
        address: str,
    ) -> None:
        try:
            import prometheus_client as prometheus
        except ImportError as exc:
            raise ImportError(
                "metrics need prometheus-client: pip install 'envserver[metrics]'"
            ) from exc
        self.registry = registry = prometheus.CollectorRegistry()
        prometheus.ProcessCollector(registry=registry)
        prometheus.PlatformCollector(registry=registry)
        prometheus.GCCollector(registry=registry)
        self._env_steps = prometheus.Counter(
            "envserver_env_steps", "Env steps served (a vector step over k envs counts k).",
            registry=registry,
        )  # fmt: skip
        requests = prometheus.Counter(
            "envserver_requests", "Requests answered, by command and status (ok or error).",
            ["command", "status"], registry=registry,
        )  # fmt: skip
        durations = prometheus.Histogram(
            "envserver_request_duration_seconds",
            "Time inside the host per request, from receiving it to its reply being ready.",
            ["command"], buckets=DURATION_BUCKETS_S, registry=registry,
        )  # fmt: skip
        self._env_errors = prometheus.Counter(
            "envserver_env_errors", "Exceptions raised by envs and returned to clients.",
            registry=registry,
        )  # fmt: skip
        prometheus.Gauge("envserver_sessions", "Open sessions.", registry=registry).set_function(
            sessions
        )
        prometheus.Gauge(
            "envserver_envs", "Envs held by all sessions.", registry=registry
        ).set_function(envs)
        prometheus.Gauge(
            "envserver_envs_on_threads",
            "Envs whose sessions step them concurrently on threads now (the rest: in turn).",
            registry=registry,
        ).set_function(envs_on_threads)
        self._switches = prometheus.Counter(
            "envserver_env_threads_switches",
            "Automatic switches of a session between stepping its envs in turn and on threads.",
            registry=registry,
        )
        evicted = prometheus.Counter(
            "envserver_sessions_evicted",
            "Sessions closed by the host, by reason: lease (client gone) or idle (envs unused).",
            ["reason"], registry=registry,
        )  # fmt: skip
        self._evicted = {reason: evicted.labels(reason) for reason in EVICTION_REASONS}
        self._refused = prometheus.Counter(
            "envserver_sessions_refused", "Sessions or envs refused for a limit.",
            registry=registry,
        )  # fmt: skip
        self._drains = prometheus.Counter(
            "envserver_drains", "Drains begun (a stop signal with a grace period).",
            registry=registry,
        )  # fmt: skip
        self._moved = prometheus.Counter(
            "envserver_envs_moved",
            "Envs whose client closed their session while the host drained (moved elsewhere).",
            registry=registry,
        )
        # Children resolved once: a label lookup per request would cost more than the count.
        names = [_label(c) for c in Command if c is not Command.STEP_RAW] + [UNREADABLE]
        self._requests: dict[tuple[str, bool], Any] = {
            (name, ok): requests.labels(name, "ok" if ok else "error")
            for name in names
            for ok in (True, False)
        }
        self._durations = {name: durations.labels(name) for name in names}
        try:
            self._server, self._thread = prometheus.start_http_server(
                port, addr=address, registry=registry
            )
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {address}:{port}: {exc}") from exc
        self.port = int(self._server.server_port)

    def request(self, command: Command | None, ok: bool, seconds: float) -> None:
        """A request answered (OK or ERROR), and how long the host took."""
        name = UNREADABLE if command is None else _label(command)
        self._requests[name, ok].inc()
        self._durations[name].observe(seconds)

    def env_steps(self, count: int) -> None:
        """Env steps served."""
        self._env_steps.inc(count)

    def env_error(self) -> None:
        """An exception an env raised, returned to its client."""
        self._env_errors.inc()

    def session_evicted(self, reason: str) -> None:
        """A session closed by the host: ``"lease"`` (its client is gone) or ``"idle"``."""
        self._evicted[reason].inc()

    def session_refused(self) -> None:
        """A session or its envs refused for a limit."""
        self._refused.inc()

    def env_threads_switched(self) -> None:
        """A session's envs switched between stepping in turn and on threads (automatic)."""
        self._switches.inc()

    def drain_begun(self) -> None:
        """A drain began (a stop signal, with a grace period)."""
        self._drains.inc()

    def envs_moved(self, count: int) -> None:
        """Envs whose client closed their session while the host drained (moved elsewhere)."""
        self._moved.inc(count)

    def close(self) -> None:
        """Stops the HTTP server."""
        self._server.shutdown()
        self._server.server_close()


def _label(command: Command) -> str:
    """A command's label: its name, ``step`` for STEP_RAW (a step, sent raw)."""
    return "step" if command is Command.STEP_RAW else command.name.lower()
