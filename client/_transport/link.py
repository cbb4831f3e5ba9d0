"""The link to one env host: a DEALER socket, its monitor, and what they say of the connection.

Liveness comes from ZeroMQ's own heartbeats (ZMTP PING/PONG): libzmq's I/O thread answers them
even while the host's Python thread is busy in a long ``step``, and they stop when the host dies,
is frozen (SIGSTOP) or becomes unreachable, at which point libzmq drops the connection. The
socket's monitor reports that drop (and refused security handshakes) to the link's
:class:`~envserver.wire.reach.Reachability`, which the connection's health reads to fail the
requests waiting on it (see ``HostHealth.watch``).

Messages go out and come in whole, however a send or a receive is interrupted
(:class:`~envserver.wire.frames.MessageWriter`, :class:`~envserver.wire.frames.MessageReader`);
a socket left in the middle of a message is replaced (:meth:`HostLink.renew`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from envserver.wire.endpoints import client_socket
from envserver.wire.frames import MessageReader, MessageWriter
from envserver.wire.reach import MONITORED_EVENTS, Reachability

__all__ = ["AWAIT_REPLY_MS", "HostLink"]

logger = logging.getLogger(__name__)

#: The longest a blocking receive waits (the receive timeout of ``RequestTracker.next_message``).
AWAIT_REPLY_MS = 50


class HostLink:
    """A DEALER socket to one host, with its monitor, reader, writer and reachability.

    Args:
        context: The ZeroMQ context.
        endpoint: The host's endpoint.
        host_timeout_s: How long a connected host may stay silent (no heartbeat answered):
            the socket's ZMTP heartbeats are tuned to it.
        curve: CURVE keys ``(server_public, client_public, client_secret)``, or None.

    Raises:
        ValueError: If ZeroMQ refuses the endpoint.
    """

    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        host_timeout_s: float,
        curve: tuple[bytes, bytes, bytes] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.curve = curve
        self._context = context
        self._host_timeout_s = host_timeout_s
        #: Called when :meth:`renew` replaced the socket (a poller of the old one is stale).
        self.on_renew: Callable[[], None] | None = None
        self._open()

    def _open(self) -> None:
        """Opens the socket, its monitor, its reader and its writer, and connects."""
        self.reach = Reachability(self.endpoint, uses_curve=self.curve is not None)
        self.socket = client_socket(self._context, self.endpoint, self.curve)
        heartbeat_ms = max(100, int(self._host_timeout_s * 1000 / 5))
        timeout_ms = max(heartbeat_ms, int(self._host_timeout_s * 1000))
        self.socket.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
        self.socket.setsockopt(zmq.HEARTBEAT_TTL, min(6_553_500, timeout_ms // 100 * 100))
        self.socket.setsockopt(zmq.RCVTIMEO, AWAIT_REPLY_MS)  # a blocking receive's bound
        self.reader = MessageReader(self.socket)
        self.writer = MessageWriter(self.socket)
        self.monitor = self.socket.get_monitor_socket(MONITORED_EVENTS)
        self._events = MessageReader(self.monitor)
        try:
            self.socket.connect(self.endpoint)
        except zmq.ZMQError as exc:
            self.close(linger_ms=0)
            raise ValueError(
                f"invalid host endpoint {self.endpoint!r} ({exc}); expected e.g. "
                "tcp://sim-a:5555 or ipc:///path/to/socket"
            ) from exc

    def read_events(self) -> bool:
        """Takes in what the monitor reported: connections made, lost and refused.

        An event cut by an interruption leaves the link :attr:`cut`: what the connection did
        is not known.

        Returns:
            Whether the host became reachable after it was not (for a log line).
        """
        events, reach = self._events, self.reach
        came_up = False
        # Whole events, however a receive is interrupted (see ``MessageReader``).
        while (frames := events.next(zmq.NOBLOCK)) is not None:
            event = parse_monitor_message([frame.bytes for frame in frames])
            was_up = reach.up
            reach.on_event(event["event"], event["value"])
            events.release()
            came_up = came_up or (reach.up and not was_up)
        return came_up

    @property
    def cut(self) -> bool:
        """Whether an interruption left the link unsure: a send cut half-way, an event lost.

        The link must be renewed (:meth:`renew`) before it is used again.
        """
        return self.writer.cut or bool(self._events.lost)

    def renew(self) -> None:
        """Replaces the socket (and monitor) by a new one to the same host.

        The half-sent message dies with the old socket (libzmq drops an unfinished message at
        close), and so do replies still on their way to it: the caller sends again what it
        still waits for. A host reached before stays one (its silence is bounded by
        ``host_timeout_s``, not the connect timeout).
        """
        ever_up = self.reach.ever_up
        self._close_sockets(linger_ms=0)
        self._open()
        self.reach.ever_up = ever_up
        if self.on_renew is not None:
            self.on_renew()

    def close(self, linger_ms: int) -> None:
        """Sends what an interrupted send left, if it can, and closes the socket and monitor.

        Args:
            linger_ms: How long messages still queued may take to leave (0: dropped).
        """
        with contextlib.suppress(zmq.ZMQError):
            self.writer.flush()
        self._close_sockets(linger_ms)

    def _close_sockets(self, linger_ms: int) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=linger_ms)
