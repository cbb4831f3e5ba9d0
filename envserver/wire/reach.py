"""Whether a host can be reached, and why not: what a client socket's monitor reported.

libzmq reconnects on its own and says why only through monitor events. This object keeps what
they told (up, down since when, refused how) so that a silent host is reported with its likely
cause: nothing listens at the address, connections are accepted and then closed (a proxy or port
forward with no host behind it, or a host that is stopping), the host uses CURVE and the client
does not (or the reverse), or the host closed a CURVE handshake because the server key is not
its own. The last two look alike to libzmq; a plain TCP look at the address tells them apart (a
ZeroMQ host greets every new connection at once).

libzmq does not say why a connection attempt failed either: its monitor reports a retry
(``EVENT_CONNECT_RETRIED``) alike for a refused connection, an unreachable network and a timeout.
A retry without a connection before it calls for a plain connect to the endpoint
(:func:`connect_error`), whose error tells: refused means nothing listens there
(:attr:`Reachability.refused`), which a recovery and ``envserver ping`` need not wait on.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

__all__ = [
    "MONITORED_EVENTS",
    "Reachability",
    "check_resolvable",
    "connect_error",
    "wait_for_reply",
    "zeromq_mechanism",
]

#: The monitor events a connection subscribes to.
MONITORED_EVENTS = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)

#: The ZMTP 3 greeting: a ZeroMQ peer sends its signature first on every connection.
_SIGNATURE = b"\xff" + bytes(8) + b"\x7f"
_GREETING_BYTES = 64

#: How long the plain look at an address (a connect, a greeting read) may take.
PROBE_TIMEOUT_S = 1.0
#: How many looks a connection takes at most, until one tells the peer's mechanism.
MAX_LOOKS = 3


def _tcp_address(endpoint: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``tcp://host:port`` endpoint; None for other transports."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _plain_connection(endpoint: str, timeout_s: float) -> socket.socket | None:
    """A plain connection to a ``tcp://`` or ``ipc://`` endpoint, closed by a reset.

    A reset rather than a clean close: a CURVE host does not log the look as a refused client
    (envserver.curve.guard logs connections closed cleanly during the handshake).

    Returns:
        The connected socket; None for another transport.

    Raises:
        OSError: If the connection fails (``ConnectionRefusedError``: nothing listens there).
    """
    address = _tcp_address(endpoint)
    if address is not None:
        probe = socket.create_connection(address, timeout=timeout_s)
    elif endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(timeout_s)
        try:  # ZeroMQ names an abstract socket with a leading @
            probe.connect("\0" + path[1:] if path.startswith("@") else path)
        except OSError:
            probe.close()
            raise
    else:
        return None
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return probe


def connect_error(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> OSError | None:
    """Why a plain connect to a ``tcp://`` or ``ipc://`` endpoint fails now, if it does.

    Returns:
        The error (``ConnectionRefusedError``, or for ``ipc://`` ``FileNotFoundError``:
        nothing listens there); None if the connect succeeds, or for another transport.
    """
    try:
        probe = _plain_connection(endpoint, timeout_s)
    except OSError as exc:
        return exc
    if probe is not None:
        probe.close()
    return None


def check_resolvable(endpoint: str) -> None:
    """Raises at once if a ``tcp://NAME:port`` endpoint's name does not resolve.

    libzmq would retry such a name silently until the connect timeout.

    Raises:
        OSError: With the resolver's reason, if the name does not resolve.
    """
    address = _tcp_address(endpoint)
    if address is None or address[0] == "*":
        return
    try:
        ipaddress.ip_address(address[0])
        return  # an address, nothing to resolve
    except ValueError:
        pass
    try:
        socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(f"the name {address[0]!r} does not resolve ({exc.strerror})") from None


def zeromq_mechanism(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The security mechanism a ZeroMQ peer at a TCP endpoint greets with, by a plain TCP look.

    ZMTP 3: each side sends a 10-byte signature and its version, then the rest of a 64-byte
    greeting, whose bytes 12-31 name the mechanism (``NULL``, ``PLAIN`` or ``CURVE``).

    Returns:
        The mechanism; ``""`` if nothing greets as ZeroMQ does; None if it cannot be told
        (not a TCP endpoint).
    """
    if _tcp_address(endpoint) is None:
        return None
    greeting = b""
    try:
        with _plain_connection(endpoint, timeout_s) as probe:
            probe.sendall(_SIGNATURE + bytes([3, 0]))
            while len(greeting) < _GREETING_BYTES:
                chunk = probe.recv(_GREETING_BYTES - len(greeting))
                if not chunk:
                    break
                greeting += chunk
    except OSError:
        pass
    if len(greeting) < _GREETING_BYTES or greeting[0] != 0xFF or greeting[9] != 0x7F:
        return ""
    return greeting[12:32].rstrip(b"\0").decode("ascii", "replace")


class Reachability:
    """What the socket monitor of one connection said, and what it means.

    Args:
        endpoint: The host's endpoint.
        uses_curve: Whether the client side of the connection uses CURVE.
    """

    def __init__(self, endpoint: str, uses_curve: bool) -> None:
        self.endpoint = endpoint
        self.uses_curve = uses_curve
        self.up = False
        self.ever_up = False
        self.down_since: float | None = time.monotonic()
        self.lost_at: float | None = None
        #: A definite refusal (the connection can never work as configured), once seen.
        self.refusal: str | None = None
        #: Whether nothing listens at the endpoint: a plain connect was refused after a
        #: connection attempt of libzmq's failed, and none has connected since.
        self.refused = False
        self._failed_connects = 0  # connection attempts that failed (libzmq retries them)
        self._connect_error: str | None = None  # why a plain connect failed, if not refused
        self._attempt_connected = False  # the current attempt made a TCP connection
        self._listen_look_due = False  # a failed attempt awaits a plain connect to the endpoint
        self._accepted_then_closed = 0  # TCP connections closed during the handshake
        self._connected = False  # a transport connection was made at least once
        self._look_due = False  # a closed handshake awaits a look at the address
        self._looks_left = MAX_LOOKS  # looks that may still be taken, until one tells

    def on_event(self, kind: int, value: int) -> None:
        """Takes in one monitor event."""
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.up = self.ever_up = True
            self.down_since = None
        elif kind == zmq.EVENT_DISCONNECTED and self.up:
            self.up = False
            self.down_since = self.lost_at = time.monotonic()
        elif kind == zmq.EVENT_CONNECTED:
            self._connected = self._attempt_connected = True
            self.refused = False
        elif kind == zmq.EVENT_CONNECT_RETRIED:  # after every attempt, connected or not
            if not self._attempt_connected:
                self._failed_connects += 1
                self._listen_look_due = not self.refused  # refused once: not again
            self._attempt_connected = False
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.refusal = (
                "refused this client's CURVE key (it is not in the host's authorized keys)"
            )
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                self._mismatch()
            else:
                self.refusal = f"broke the ZeroMQ handshake (protocol error {value:#x})"
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self._on_closed_handshake(value)

    def _on_closed_handshake(self, value: int) -> None:
        """The peer closed the connection during the handshake: why, :meth:`diagnose` tells."""
        self._accepted_then_closed += 1
        if self._looks_left and value in (errno.EPIPE, errno.ECONNRESET, 0):
            self._look_due = True

    def diagnose(self) -> None:
        """Takes the plain looks that events call for (each at most a second).

        A connection attempt that failed: a plain connect, which tells whether it is refused
        (:attr:`refused`). A closed handshake: a look at the greeting, again at a later one
        while no look has told which mechanism the peer greets with (a host too busy to greet
        within the second), up to :data:`MAX_LOOKS`.

        Kept out of :meth:`on_event`, so that reading events never blocks a send.
        """
        if self._listen_look_due:
            self._listen_look_due = False
            error = connect_error(self.endpoint)
            self.refused = isinstance(error, (ConnectionRefusedError, FileNotFoundError))
            self._connect_error = None if error is None else error.strerror or str(error)
        if not self._look_due:
            return
        self._look_due = False
        self._looks_left -= 1
        mechanism = zeromq_mechanism(self.endpoint)
        if mechanism:  # it told: no more looks (a host too busy to greet in time did not)
            self._looks_left = 0
        if mechanism == "CURVE" and self.uses_curve:
            self.refusal = (
                "closed the CURVE handshake: the server key given to this client is not "
                "the host's public key"
            )
        elif mechanism and (mechanism == "CURVE") != self.uses_curve:
            self._mismatch()

    def _mismatch(self) -> None:
        self.refusal = (
            "does not use CURVE, but this client does"
            if self.uses_curve
            else "uses CURVE and this client does not"
        ) + " (give both sides keys, or neither)"

    def why_silent(self) -> str:
        """The likely reason why this host has not answered, for messages."""
        if self.refusal is not None:
            return self.refusal
        if self.up:
            return (
                "the host accepted the connection but has not answered: it is busy (a long "
                "request, or overloaded), or it is not an envserver host"
            )
        if self._accepted_then_closed:
            return (
                "nothing answers at this address: connections are accepted and then closed "
                "before the ZeroMQ handshake (a proxy or port forward with no host behind it, "
                "or a host that is stopping)"
            )
        if self.refused:
            return "nothing answers at this address (connections refused: no host listens there)"
        if self._failed_connects and not self._connected:
            why = f": {self._connect_error}" if self._connect_error else ""
            return f"nothing answers at this address (connection attempts fail{why})"
        if self.ever_up:
            return "the connection was lost (the host died, froze, or became unreachable)"
        if self._connected:
            return "connected, but no ZeroMQ handshake came from this address"
        return (
            "no answer at this address (connection attempts time out: a wrong address, or a "
            "firewall)"
        )


def wait_for_reply(
    socket: zmq.Socket,
    monitor: zmq.Socket,
    reach: Reachability,
    timeout_s: float,
    refused_ends: bool = True,
) -> bool:
    """Waits for ``socket`` to have a reply, telling ``reach`` what ``monitor`` reports meanwhile.

    Returns:
        Whether a reply is there: False after ``timeout_s``, or as soon as the host refused the
        connection (waiting longer would not help), or nothing listens at its endpoint (unless
        not ``refused_ends``: a host still starting).
    """
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while (left_s := deadline - time.monotonic()) > 0:
        ready = dict(poller.poll(max(1, int(left_s * 1000))))
        if socket in ready:
            return True
        while monitor.poll(0):
            event = recv_monitor_message(monitor)
            reach.on_event(event["event"], event["value"])
        reach.diagnose()
        if reach.refusal is not None or (reach.refused and refused_ends):
            return False
    return False
