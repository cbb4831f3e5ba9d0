"""ZeroMQ endpoint helpers both sides use: TCP endpoints of IP addresses, and IPv6 sockets."""

from __future__ import annotations

import ipaddress

import zmq

__all__ = ["client_socket", "prepare_socket", "tcp_endpoint", "wants_ipv6"]


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


def client_socket(
    context: zmq.Context, endpoint: str, curve: tuple[bytes, bytes, bytes] | None = None
) -> zmq.Socket:
    """A DEALER socket for ``endpoint``, not yet connected.

    It does not linger, reconnects every 0.1 to 1 s, speaks IPv6 where the endpoint needs it,
    and uses CURVE keys ``(server_public, client_public, client_secret)`` if given.
    """
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RECONNECT_IVL, 100)
    socket.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    prepare_socket(socket, endpoint)
    if curve is not None:
        socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = curve
    return socket
