"""How every connection of one vector env behaves, in one frozen object.

The vector env builds it from its options (``VectorOptions.connection_settings``), where each
default is written once; the transport only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConnectionSettings"]


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """The bounds, trust and offers of a vector env's connections to its hosts.

    Attributes:
        allow_pickle: Whether replies may carry pickled values (trust in the hosts).
        host_timeout_s: How long a connected host may stay silent (no heartbeat answered) or
            unreachable before it counts as failed.
        connect_timeout_s: How long a host may take to accept the first connection.
        request_timeout_s: How long a live host may take to answer a request (None: no bound).
        curve: The CURVE keys (server public, client public, client secret), or None.
        shared_memory: Offer each host a slab for its observations at MAKE (hosts on this
            machine only).
        recovers: Whether the vector env recovers failed hosts (``on_host_failure``
            ``"restart"`` or ``"restore"``); if not, the error of a host lost says how to.
        reply_spin_s: How long a wait for a reply in a channel watches it before it blocks
            (``LocalHosts.reply_spin_s``; 0: it blocks at once).
    """

    allow_pickle: bool
    host_timeout_s: float
    connect_timeout_s: float
    request_timeout_s: float | None
    curve: tuple[bytes, bytes, bytes] | None
    shared_memory: bool
    recovers: bool = False
    reply_spin_s: float = 0.0
