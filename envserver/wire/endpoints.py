"""Endpoint helpers both sides use: TCP endpoints of IP addresses, IPv6 sockets, host specs.

A host list may mix endpoints with ``dns://NAME:PORT`` specs (one endpoint per address of NAME:
replicas behind one service name) and ``slurm://NODES:PORT`` specs (one per node of a Slurm
job). :class:`HostSpec` reads an entry, :func:`resolve_dns` finds a name's addresses (the launch
layer resolves a whole spec).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from socket import SOCK_STREAM, getaddrinfo

import zmq

__all__ = [
    "SPEC_SCHEMES",
    "HostSpec",
    "check_endpoint",
    "client_socket",
    "prepare_socket",
    "resolve_dns",
    "tcp_endpoint",
    "wants_ipv6",
]


#: What a host list entry may look like, and an address to bind, for messages.
EXPECTED = "expected tcp://HOST:PORT, ipc://PATH, dns://NAME:PORT or slurm://NODES:PORT"
EXPECTED_BIND = "expected tcp://HOST:PORT, tcp://*:PORT or ipc://PATH"
_SCHEMES = ("tcp://", "ipc://", "inproc://")


def check_endpoint(endpoint: str, *, bind: bool = False) -> str:
    """``endpoint``, if ZeroMQ can use it as given: else one line saying what is wrong.

    libzmq takes ``tcp://h:99999`` as port 34463 (it wraps), and a client connects to
    ``tcp://h:560l`` and waits for it: the port must be a number from 1 to 65535 (0 or ``*``,
    any free port, only where ``bind``). A ``tcp://`` host is a name, an IPv4 address or an
    IPv6 one in brackets; where ``bind``, also ``*`` (every interface) or an interface name.

    Args:
        endpoint: A ``tcp://``, ``ipc://`` or ``inproc://`` endpoint.
        bind: Whether it is an address to bind (a host's) rather than to connect to.

    Raises:
        ValueError: If it is not such an endpoint.
    """
    if not isinstance(endpoint, str):
        raise TypeError(f"an endpoint must be a string, got {endpoint!r}")
    expected = EXPECTED_BIND if bind else EXPECTED
    scheme = next((s for s in _SCHEMES if endpoint.startswith(s)), None)
    if scheme is None:
        raise ValueError(f"{endpoint!r} is not an endpoint: {expected}")
    rest = endpoint[len(scheme) :]
    if not rest:
        raise ValueError(f"{endpoint!r} is not an endpoint: it names no address ({expected})")
    if scheme != "tcp://":
        return endpoint
    host, colon, port = rest.rpartition(":")
    if not colon or not host or (host.startswith("[") != host.endswith("]")):
        raise ValueError(f"{endpoint!r} is not an endpoint: {expected}")
    free = bind and (port == "*" or port == "0")
    if not free and not _is_port(port):
        raise ValueError(
            f"{endpoint!r}: the port must be a number from 1 to 65535"
            + (" (or * for any free port)" if bind else "")
            + f", got {port!r}"
        )
    if host == "*" and not bind:
        raise ValueError(f"{endpoint!r}: * binds every interface; connect to a host's address")
    return endpoint


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


#: The schemes of host specs that name several hosts, resolved when the trainer looks.
SPEC_SCHEMES = ("dns", "slurm")
#: The most ports a spec's range may span (each is a host to PING on every address).
MAX_PORT_RANGE = 1024


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """One entry of a host list: a plain endpoint, or a spec resolved to endpoints.

    ``dns://NAME:PORT`` names every address of NAME; ``slurm://NODES:PORT`` every node of a
    Slurm job (``NODES`` is ``job``, ``het-group-N`` or a node list such as ``node[01-04]``).
    The port may be a range, ``PORT-LAST``, for hosts started with ``serve --processes``: every
    address (node) and every port of the range.

    Attributes:
        text: The entry as given.
        name: The name to resolve, or the nodes.
        port: The (first) port every address serves on.
        scheme: ``"dns"`` or ``"slurm"`` (None for a plain endpoint).
        last_port: The last port of the range (``port`` when it is one port).
    """

    text: str
    name: str | None = None
    port: int | None = None
    scheme: str | None = None
    last_port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostSpec:
        """Reads a host list entry.

        Raises:
            ValueError: If it is neither an endpoint (see :func:`check_endpoint`) nor a
                ``dns://NAME:PORT`` or ``slurm://NODES:PORT`` spec with a name and a port (or
                ``PORT-LAST``) from 1 to 65535.
        """
        if not isinstance(text, str):
            raise TypeError(f"a host must be an endpoint string, got {text!r}")
        scheme, separator, rest = text.partition("://")
        if not separator or scheme not in SPEC_SCHEMES:
            return cls(check_endpoint(text))
        name, colon, ports = rest.rpartition(":")
        if not colon or not name:
            raise ValueError(f"{text!r} is not a host spec: expected {scheme}://NAME:PORT")
        first, dash, last = ports.partition("-")
        if not (_is_port(first) and (not dash or _is_port(last))):
            raise ValueError(
                f"{text!r}: the port must be a number from 1 to 65535 (or a range "
                f"PORT-LAST), got {ports!r}"
            )
        port = int(first)
        last_port = int(last) if dash else port
        if last_port < port:
            raise ValueError(f"{text!r}: the port range {ports} ends before it begins")
        if last_port - port >= MAX_PORT_RANGE:
            raise ValueError(
                f"{text!r}: the port range {ports} spans more than {MAX_PORT_RANGE} ports"
            )
        return cls(text, name.strip("[]") if scheme == "dns" else name, port, scheme, last_port)

    @property
    def dynamic(self) -> bool:
        """Whether this spec is resolved to endpoints (``dns://``, ``slurm://``)."""
        return self.scheme is not None

    @property
    def ports(self) -> range:
        """The ports every address serves on (one, or the range)."""
        if self.port is None or self.last_port is None:
            return range(0)
        return range(self.port, self.last_port + 1)


def _is_port(text: str) -> bool:
    return text.isdigit() and text.isascii() and 1 <= int(text) <= 65535
