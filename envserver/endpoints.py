"""ZeroMQ endpoint helpers both sides use: TCP endpoints of IP addresses, and IPv6 sockets."""

from __future__ import annotations

import ipaddress

import zmq

__all__ = ["prepare_socket", "tcp_endpoint", "wants_ipv6"]


def tcp_endpoint(address: str, port: int) -> str:
    """The ZeroMQ endpoint of an IP address and port (IPv6 addresses in brackets)."""
    if ipaddress.ip_address(address).version == 6:
        return f"tcp://[{address}]:{port}"
    return f"tcp://{address}:{port}"


def wants_ipv6(endpoint: str) -> bool:
    """Whether a socket needs ``zmq.IPV6`` to bind or connect ``endpoint`` (``tcp://[...]``)."""
    return endpoint.startswith("tcp://[")


def prepare_socket(socket: zmq.Socket, endpoint: str) -> None:
    """Sets what ``socket`` needs before it binds or connects ``endpoint`` (IPv6)."""
    if wants_ipv6(endpoint):
        socket.setsockopt(zmq.IPV6, 1)
