"""The host layer: ``envserver serve`` without its command line.

It owns the host's loop on one ROUTER socket (:mod:`~envserver.host.loop`: :class:`EnvHost`,
configured by :class:`HostConfig`), the sessions and their leases
(:mod:`~envserver.host.sessions`), the envs of a session and how they step
(:mod:`~envserver.host.worker`), and the Prometheus metrics (:mod:`~envserver.host.metrics`).

It imports :mod:`envserver.errors`, the wire layer and the CURVE layer; never the CLI or the
client. A client reaches a host only over the wire (or starts one through
:mod:`envserver.launch.spawn`, as a process).
"""

from __future__ import annotations

from envserver.host.loop import EnvHost, HostConfig

__all__ = ["EnvHost", "HostConfig"]
