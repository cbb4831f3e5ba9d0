"""The host layer: ``envserver serve`` without its command line.

It owns the host's loop on one ROUTER socket (:mod:`~envserver.host.loop`: :class:`EnvHost`,
configured by :class:`HostConfig`, its socket and queue in :mod:`~envserver.host.inbox`), how a
request is answered (:mod:`~envserver.host.service`: one path for every command, which the
dispatch table steers), what each command does (:mod:`~envserver.host.commands`: the table and
its handlers), the sessions and their leases (:mod:`~envserver.host.sessions`), the envs of a
session and how they step (:mod:`~envserver.host.worker`, :mod:`~envserver.host.concurrency`),
what the envs say (:mod:`~envserver.host.relay`), and the Prometheus metrics
(:mod:`~envserver.host.metrics`). The bodies it reads and writes are the wire layer's
(:mod:`envserver.wire.bodies`, :mod:`envserver.wire.replies`): no body key is written here.

It imports :mod:`envserver.errors`, the wire layer and the CURVE layer; never the CLI or the
client. A client reaches a host only over the wire (or starts one through
:mod:`envserver.launch.spawn`, as a process).
"""

from __future__ import annotations

from envserver.host.loop import EnvHost, HostConfig

__all__ = ["EnvHost", "HostConfig"]
