"""Endpoint helpers both sides use: TCP endpoints of IP addresses, IPv6 sockets, host specs.

A host list may mix endpoints with ``dns://NAME:PORT`` specs: one endpoint per address of NAME
(replicas behind one service name). :class:`HostSpec` reads an entry, :func:`resolve_dns` finds
the addresses.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from socket import SOCK_STREAM, getaddrinfo

import zmq

__all__ = [
    "HostSpec",
    "client_socket",
    "prepare_socket",
    "resolve_dns",
    "tcp_endpoint",
    "wants_ipv6",
]


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


def resolve_dns(name: str, port: int) -> list[str]:
    """Every address of ``name`` (A and AAAA records), IPv4 first, each once, sorted.

    Raises:
        OSError: (``socket.gaierror``) If the name does not resolve.
    """
    infos = getaddrinfo(name, port, type=SOCK_STREAM)
    addresses = {ipaddress.ip_address(info[4][0]) for info in infos}
    return [str(a) for a in sorted(addresses, key=lambda a: (a.version, a))]


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """One entry of a host list: a plain endpoint, or a ``dns://NAME:PORT`` spec.

    Attributes:
        text: The entry as given.
        name: The name to resolve (``dns://`` specs only).
        port: The port every address serves on (``dns://`` specs only).
    """

    text: str
    name: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostSpec:
        """Reads a host list entry.

        Raises:
            ValueError: If a ``dns://`` spec has no name or no valid port.
        """
        if not isinstance(text, str):
            raise TypeError(f"a host must be an endpoint string, got {text!r}")
        if not text.startswith("dns://"):
            return cls(text)
        name, _, port = text.removeprefix("dns://").rpartition(":")
        if not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"invalid host spec {text!r}: expected dns://NAME:PORT")
        return cls(text, name.strip("[]"), int(port))

    @property
    def dynamic(self) -> bool:
        """Whether this spec is resolved to addresses (``dns://``)."""
        return self.name is not None
