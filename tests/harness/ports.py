"""Ports below the ephemeral range, free now: for hosts that must bind a port again.

An ephemeral port could be taken meanwhile by a connection's local end (a client reconnecting to
a dead host's port may even connect to itself); a port below the range is taken only by an
explicit bind. Standard library only: the docs' example runner imports it too.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_ports(span: int = 1, address: str = "127.0.0.1", tries: int = 500) -> int:
    """A port below the ephemeral range such that it and the ``span - 1`` after it are free.

    Args:
        span: How many ports in a row must be free.
        address: Where they must be free ("" for every local address: any other bind of the
            port would fail there).
        tries: How many random bases to check.

    Returns:
        The first port.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    chooser = random.Random()
    for _ in range(tries):
        base = chooser.randrange(max(1024, low - 12000), low - span + 1)
        if all(_free(port, address) for port in range(base, base + span)):
            return base
    raise RuntimeError(f"no {span} free port(s) in a row below the ephemeral range ({low})")


def _free(port: int, address: str) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True
