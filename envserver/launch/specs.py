"""What a host spec names now: the endpoints of a ``dns://`` name or of a Slurm job's nodes.

Used where a host list is turned into endpoints: the trainer's discovery (which waits for them
to answer, and looks again when it must replace a lost host) and ``envserver ping``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from envserver.wire.endpoints import HostSpec, resolve_dns, tcp_endpoint

from .slurm import expand_nodes, job_nodes

__all__ = ["Resolver", "spec_endpoints"]

#: Resolves a name and port to IP addresses (strings); raises ``OSError`` if it cannot.
Resolver = Callable[[str, int], Sequence[str]]

# A job's node list does not change while it runs; scontrol is asked once per list.
_expand = functools.lru_cache(maxsize=64)(expand_nodes)


def spec_endpoints(spec: HostSpec, resolver: Resolver = resolve_dns) -> list[str]:
    """The endpoints ``spec`` names now, address (node) by address, each port of its range.

    A plain endpoint names itself; a ``dns://`` spec one endpoint per address its name resolves
    to; a ``slurm://`` spec one per node (by name: ZeroMQ resolves it when it connects).

    Raises:
        OSError: If a ``dns://`` name does not resolve (it may later: replicas come and go).
        ValueError: If a ``slurm://`` spec names no nodes here.
    """
    if spec.scheme is None or spec.name is None:
        return [spec.text]
    if spec.scheme == "slurm":
        nodes = job_nodes(spec.name, expand=_expand)
        return [f"tcp://{node}:{port}" for node in nodes for port in spec.ports]
    return [tcp_endpoint(a, port) for a in resolver(spec.name, spec.port) for port in spec.ports]
