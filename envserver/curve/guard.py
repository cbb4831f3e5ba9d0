"""CURVE handshakes on the host: who is let in, and a log of who is not.

A host with CURVE encrypts its socket and lets pyzmq's ZAP authenticator thread decide whom to
admit. :class:`CurveGuard` sets both up and logs every client it turns away, at WARNING:

- a client whose public key is not in the authorized-keys directory (checked by
  :class:`CurveAuthenticator`; the line names the key and the peer's address);
- a handshake that fails before any key is checked (seen by a socket monitor): a plaintext
  client, or a client given another server key than this host's;
- a connection that ends during the handshake, before the client's mechanism was read. A
  plaintext client often looks like this: the ZeroMQ handshake is symmetric, and when this host's
  whole greeting reaches the client in one read, the client finds the mismatch and closes before
  it sends its own mechanism, so the host's libzmq never reports a mismatch (about 1 attempt in
  5 on an idle machine, more under load). A plain TCP look at the port that closes cleanly
  looks the same; a connection reset (as :func:`envserver.wire.reach.zeromq_mechanism`'s look ends)
  is not logged.

A refused client retries several times a second, so :class:`RateLimitedLog` writes at most one
line per key (or per kind of failure) every ``AUTH_LOG_INTERVAL_S`` seconds, and the next line
says how many were left out.

On a client's side, :mod:`envserver.wire.reach` tells why a host stays silent.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

__all__ = [
    "AUTH_LOG_INTERVAL_S",
    "CurveAuthenticator",
    "CurveGuard",
    "RateLimitedLog",
    "handshake_failure",
]

logger = logging.getLogger(__name__)

#: At most one line per refused key (or kind of failed handshake) this often.
AUTH_LOG_INTERVAL_S = 60.0
#: The most keys a :class:`RateLimitedLog` tracks; beyond, they share one budget.
MAX_TRACKED_KEYS = 1024
#: The budget shared by keys beyond ``MAX_TRACKED_KEYS`` (many keys at once: a scan).
OVERFLOW_KEY = "(other keys)"

#: What a failed handshake on the host's side means, by the protocol error libzmq reports.
_PROTOCOL_FAILURES = {
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "a client without CURVE (plaintext) tried to "
    "connect: give it --curve-server-key and --curve-client-key",
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "a client failed the CURVE handshake: most likely the "
    "server key it was given is not this host's",
}
#: A connection that ended before the client's mechanism was read (see the module docstring).
_CLOSED_IN_HANDSHAKE = (
    "a client closed the connection during the handshake, before naming its security "
    "mechanism: most likely a client without CURVE (plaintext) that saw the mismatch first "
    "(give it --curve-server-key and --curve-client-key), or a plain TCP look at this port"
)
#: The monitor events a CURVE host logs.
_WATCHED_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_MONITOR_STOPPED
)


def handshake_failure(event: int, value: int) -> tuple[str, str] | None:
    """What a monitor event of a CURVE host's socket says about a refused client.

    Args:
        event: The monitor event (``zmq.EVENT_*``).
        value: Its value: the protocol error, or the errno of a connection that ended
            (``EPIPE`` when the peer closed it, ``ECONNRESET`` when it reset it).

    Returns:
        ``(kind, line)``: the rate limit's key and the line to log; None for an event that
        refuses nobody, or that is logged elsewhere (a refused key: by the authenticator).
    """
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value in _PROTOCOL_FAILURES:
        return f"handshake {value}", _PROTOCOL_FAILURES[value]
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and value == errno.EPIPE:
        return "handshake closed", _CLOSED_IN_HANDSHAKE  # closed cleanly: libzmq's EOF
    return None


class RateLimitedLog:
    """Logs at most one line per key every ``interval_s``, counting the lines left out.

    Safe to use from several threads (the ZAP thread and the monitor thread share one).

    Args:
        log: Where the lines go.
        interval_s: The least time between two lines for one key.
        clock: The time source (monotonic seconds).
    """

    def __init__(
        self,
        log: logging.Logger,
        interval_s: float = AUTH_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._log = log
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def warning(self, key: str, message: str, **fields: str) -> bool:
        """Logs ``message`` at WARNING (see :meth:`log`)."""
        return self.log(logging.WARNING, key, message, **fields)

    def log(self, level: int, key: str, message: str, **fields: str) -> bool:
        """Logs ``message`` unless a line for ``key`` went out less than ``interval_s`` ago.

        Args:
            level: The record's level.
            key: What the limit applies to (a client key, a kind of failure).
            message: The line (no ``%`` formatting).
            **fields: Structured fields for the record (``client=...``).

        Returns:
            Whether the line was logged.
        """
        now = self._clock()
        with self._lock:
            if key not in self._last and len(self._last) >= MAX_TRACKED_KEYS:
                self._forget_before(now - self.interval_s)
                if len(self._last) >= MAX_TRACKED_KEYS:
                    key = OVERFLOW_KEY
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._left_out[key] = self._left_out.get(key, 0) + 1
                return False
            self._last[key] = now
            left_out = self._left_out.pop(key, 0)
        if left_out:
            message += f" ({left_out} more like it since the last such line)"
        self._log.log(level, "%s", message, extra=fields)
        return True

    def _forget_before(self, cutoff: float) -> None:
        for key in [k for k, t in self._last.items() if t < cutoff and k != OVERFLOW_KEY]:
            del self._last[key]
            self._left_out.pop(key, None)


class CurveAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread, admitting the client keys of a directory and logging the others.

    The keys are read once, at start (as ``--authorized-keys`` always was): restart the host to
    admit a new key.

    Args:
        context: The host's ZeroMQ context.
        authorized_keys: A directory of client public key files (``NAME.key``).
        refusals: Where refused keys are logged.
    """

    def __init__(
        self, context: zmq.Context, authorized_keys: str | os.PathLike, refusals: RateLimitedLog
    ) -> None:
        super().__init__(context, log=logger)
        self._keys = frozenset(zmq.auth.load_certificates(authorized_keys))
        self._refusals = refusals
        self._peer = ""

    def start(self) -> None:
        """Starts the ZAP thread, with this object deciding on CURVE keys."""
        super().start()
        self.configure_curve_callback(domain="*", credentials_provider=self)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        """Answers one ZAP request (remembering the peer's address for :meth:`callback`)."""
        self._peer = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)

    def callback(self, domain: str, client_key: bytes) -> bool:
        """Whether ``client_key`` (Z85) is authorized; pyzmq's credentials-provider hook."""
        if client_key in self._keys:
            return True
        key = client_key.decode("ascii", "replace")
        peer = self._peer or "an unknown address"
        self._refusals.warning(
            key,
            f"refused a client from {peer}: its CURVE public key {key} is not in the "
            "authorized keys",
            client=peer,
        )
        return False


class CurveGuard:
    """CURVE for a host's socket: encryption, the authenticator, and the log of refusals.

    Args:
        context: The host's ZeroMQ context.
        socket: The host's socket, not yet bound.
        secret_key_file: The host's key file (``.key_secret`` from ``envserver keygen``).
        authorized_keys: The directory of the client public keys to admit.
        log_interval_s: See :class:`RateLimitedLog`.

    Raises:
        ValueError: If ``authorized_keys`` is not a directory, or the key file holds no secret
            key.
        OSError: If the key file cannot be read.
    """

    def __init__(
        self,
        context: zmq.Context,
        socket: zmq.Socket,
        secret_key_file: str,
        authorized_keys: str | None,
        log_interval_s: float = AUTH_LOG_INTERVAL_S,
    ) -> None:
        if not authorized_keys or not os.path.isdir(authorized_keys):
            raise ValueError(
                "CURVE needs a directory of authorized client public keys (--authorized-keys); "
                "without it any client that knows the server key would get in"
            )
        public, secret = zmq.auth.load_certificate(secret_key_file)  # raises OSError, ValueError
        if secret is None:
            raise ValueError(f"{secret_key_file} holds no secret key (use the .key_secret file)")
        self.refusals = RateLimitedLog(logger, log_interval_s)
        # CURVE alone authenticates nobody: without a ZAP handler, libzmq admits any client
        # that knows the server's public key. The authenticator thread is that handler.
        self.authenticator = CurveAuthenticator(context, authorized_keys, self.refusals)
        self.authenticator.start()
        socket.curve_secretkey = secret
        socket.curve_publickey = public
        socket.curve_server = True
        self._monitor = socket.get_monitor_socket(_WATCHED_EVENTS)
        self._watch = threading.Thread(
            target=self._watch_handshakes, name="envserver-handshakes", daemon=True
        )
        self._watch.start()

    def _watch_handshakes(self) -> None:
        """Logs failed handshakes until the socket closes (which stops its monitor)."""
        try:
            while True:
                event = recv_monitor_message(self._monitor)
                if event["event"] == zmq.EVENT_MONITOR_STOPPED:
                    return
                failure = handshake_failure(event["event"], event["value"])
                if failure is not None:
                    self.refusals.warning(*failure)
        except zmq.ZMQError:  # the context is being terminated
            return
        finally:
            self._monitor.close(linger=0)

    def close(self) -> None:
        """Stops the authenticator; call it after closing the socket (that ends the monitor)."""
        self._watch.join(timeout=5.0)
        self.authenticator.stop()
