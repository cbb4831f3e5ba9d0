"""Host discovery: ``dns://NAME:PORT`` specs resolved to one endpoint per address of NAME.

In Compose and Kubernetes, env hosts are replicas behind one service name whose addresses the
trainer does not know in advance (Docker's embedded DNS, or a headless Service, answer a name
with every replica's address). A host list may mix such specs with plain endpoints::

    ["tcp://sim-a:5555", "dns://envhost:5555"]

Plain endpoints (``tcp://``, ``ipc://``, ``inproc://``) are used as given: ZeroMQ resolves a
``tcp://`` name itself, to one address. A ``dns://`` spec becomes one ``tcp://`` endpoint per
address (A and AAAA records), and only addresses that answer a PING are used. :class:`Discovery`
waits, within a deadline, until enough addresses answer; when a host is lost, it resolves the
name again to find where its envs can be made anew (a replaced container may have a new
address).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Sequence

import zmq

from envserver.errors import EnvServerError, HostUnavailableError
from envserver.protocol import Command, Status, decode_reply, encode_request

__all__ = ["Discovery", "HostSpec", "Resolver", "resolve_dns", "tcp_endpoint", "wants_ipv6"]

logger = logging.getLogger(__name__)

#: Resolves a name and port to IP addresses (strings); raises ``OSError`` if it cannot.
Resolver = Callable[[str, int], Sequence[str]]

#: How often the names are resolved again while waiting for hosts.
RESOLVE_INTERVAL_S = 0.5
#: How long a round may wait for resolved addresses that have not answered yet, once enough did.
STRAGGLER_GRACE_S = 1.0
#: How often the wait logs who answered and who did not.
PROGRESS_LOG_INTERVAL_S = 5.0


def resolve_dns(name: str, port: int) -> list[str]:
    """Every address of ``name`` (A and AAAA records), IPv4 first, each once, sorted.

    Raises:
        OSError: (``socket.gaierror``) If the name does not resolve.
    """
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    addresses = {ipaddress.ip_address(info[4][0]) for info in infos}
    return [str(a) for a in sorted(addresses, key=lambda a: (a.version, a))]


def tcp_endpoint(address: str, port: int) -> str:
    """The ZeroMQ endpoint of an IP address and port (IPv6 addresses in brackets)."""
    if ipaddress.ip_address(address).version == 6:
        return f"tcp://[{address}]:{port}"
    return f"tcp://{address}:{port}"


def wants_ipv6(endpoint: str) -> bool:
    """Whether a socket needs ``zmq.IPV6`` to bind or connect ``endpoint``."""
    return endpoint.startswith("tcp://[")


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


class Discovery:
    """Turns a host list into endpoints, resolving its ``dns://`` specs.

    Args:
        specs: The host list: endpoints and ``dns://NAME:PORT`` specs.
        resolver: Resolves a name and port to addresses (default: :func:`resolve_dns`).
    """

    def __init__(self, specs: Sequence[str], resolver: Resolver | None = None) -> None:
        self.specs = [HostSpec.parse(text) for text in specs]
        self.resolver = resolver or resolve_dns
        self._origin: dict[str, HostSpec] = {}  # endpoint -> the dns spec it came from

    @property
    def dynamic(self) -> bool:
        """Whether any spec is resolved (else the endpoints are the specs as given)."""
        return any(spec.dynamic for spec in self.specs)

    def resolve(self, spec: HostSpec) -> list[str]:
        """The endpoints of one spec now: one per address of a ``dns://`` name.

        Raises:
            OSError: If the name does not resolve.
        """
        if not spec.dynamic:
            return [spec.text]
        assert spec.name is not None and spec.port is not None
        endpoints = [tcp_endpoint(a, spec.port) for a in self.resolver(spec.name, spec.port)]
        for endpoint in endpoints:
            self._origin[endpoint] = spec
        return endpoints

    def endpoints(
        self,
        *,
        min_hosts: int | None,
        timeout_s: float,
        probe: Callable[[], Prober],
    ) -> list[str]:
        """Waits until enough hosts answer, and returns their endpoints in host-list order.

        Plain endpoints are taken as given (the session handshake checks them). A ``dns://``
        spec counts the addresses that answer a PING; the wait ends once the hosts number at
        least ``min_hosts`` (default: each ``dns://`` spec has one that answers), giving
        addresses that resolved but have not answered yet a short grace.

        Args:
            min_hosts: How many distinct hosts, plain endpoints included, must answer.
            timeout_s: How long to wait.
            probe: Makes the prober that PINGs resolved addresses.

        Raises:
            HostUnavailableError: If too few answered in time, naming what resolved and what
                answered.
            ValueError: If ``min_hosts`` is not a positive integer.
        """
        if min_hosts is not None and (not isinstance(min_hosts, int) or min_hosts < 1):
            raise ValueError(f"min_hosts must be a positive integer, got {min_hosts!r}")
        if not self.dynamic:
            endpoints = list(dict.fromkeys(spec.text for spec in self.specs))
            if min_hosts is not None and len(endpoints) < min_hosts:
                raise ValueError(
                    f"min_hosts={min_hosts} but the host list names {len(endpoints)} host(s)"
                )
            return [spec.text for spec in self.specs]
        deadline = time.monotonic() + timeout_s
        with probe() as prober:
            return _Wait(self, prober, min_hosts, deadline, timeout_s).run()

    def replacements(self, endpoint: str, in_use: set[str]) -> list[str]:
        """Where a lost host's envs may be made anew, best first.

        For an address of a ``dns://`` spec, the name is resolved again: the same address if
        it is still there, then addresses no other connection uses, then the others (a host
        serves many sessions). A plain endpoint, or a name that does not resolve now, gives
        the endpoint itself.
        """
        spec = self._origin.get(endpoint)
        if spec is None:
            return [endpoint]
        try:
            resolved = self.resolve(spec)
        except OSError as exc:
            logger.warning("%s does not resolve now (%s); retrying %s", spec.text, exc, endpoint)
            return [endpoint]
        if not resolved:
            return [endpoint]
        first = [e for e in resolved if e == endpoint]
        free = [e for e in resolved if e != endpoint and e not in in_use]
        busy = [e for e in resolved if e != endpoint and e in in_use]
        return first + free + busy


class _Wait:
    """One wait of :meth:`Discovery.endpoints`: resolving, probing, and deciding when to stop."""

    def __init__(
        self,
        discovery: Discovery,
        prober: Prober,
        min_hosts: int | None,
        deadline: float,
        timeout_s: float,
    ) -> None:
        self.discovery = discovery
        self.prober = prober
        self.min_hosts = min_hosts
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.resolved: dict[HostSpec, list[str]] = {}
        self.problems: dict[HostSpec, str] = {}  # why a spec has no address now

    def run(self) -> list[str]:
        next_log = time.monotonic() + PROGRESS_LOG_INTERVAL_S
        enough_since: float | None = None
        while True:
            self._resolve_all()
            self.prober.poll(RESOLVE_INTERVAL_S)
            now = time.monotonic()
            if self._enough():
                enough_since = enough_since or now
                if self._all_answered() or now - enough_since >= STRAGGLER_GRACE_S:
                    return self._finish()
            else:
                enough_since = None
            if now >= self.deadline:
                raise HostUnavailableError(
                    f"too few env hosts answered within {self.timeout_s:g} s: {self._report()}"
                )
            if now >= next_log:
                logger.info("waiting for env hosts: %s", self._report())
                next_log = now + PROGRESS_LOG_INTERVAL_S

    def _resolve_all(self) -> None:
        """Resolves every ``dns://`` spec again (replicas come and go) and probes new addresses."""
        for spec in self.discovery.specs:
            if not spec.dynamic:
                continue
            try:
                endpoints = self.discovery.resolve(spec)
            except OSError as exc:
                self.problems[spec] = f"does not resolve ({exc})"
                continue
            self.resolved[spec] = endpoints
            if endpoints:
                self.problems.pop(spec, None)
            else:
                self.problems[spec] = "resolves to no address"
            for endpoint in endpoints:
                self.prober.start(endpoint)

    def _answered(self, spec: HostSpec) -> list[str]:
        return [e for e in self.resolved.get(spec, []) if e in self.prober.answered]

    def _chosen(self) -> list[str]:
        """The endpoints to use, in host-list order, each once."""
        chosen: dict[str, None] = {}
        for spec in self.discovery.specs:
            chosen.update(dict.fromkeys(self._answered(spec) if spec.dynamic else [spec.text]))
        return list(chosen)

    def _enough(self) -> bool:
        if self.min_hosts is not None:
            return len(self._chosen()) >= self.min_hosts
        return all(self._answered(spec) for spec in self.discovery.specs if spec.dynamic)

    def _all_answered(self) -> bool:
        return all(e in self.prober.answered for es in self.resolved.values() for e in es)

    def _finish(self) -> list[str]:
        silent = [e for es in self.resolved.values() for e in es if e not in self.prober.answered]
        if silent:
            logger.warning("left out env hosts that resolved but did not answer: %s", silent)
        return self._chosen()

    def _report(self) -> str:
        parts = []
        for spec in self.discovery.specs:
            if not spec.dynamic:
                continue
            if spec in self.problems:
                parts.append(f"{spec.text} {self.problems[spec]}")
                continue
            endpoints = self.resolved.get(spec, [])
            answered = self._answered(spec)
            silent = [e for e in endpoints if e not in answered]
            parts.append(
                f"{spec.text} resolved to {len(endpoints)} address(es); answered: "
                f"{', '.join(answered) or 'none'}; not answering: {', '.join(silent) or 'none'}"
            )
        if self.min_hosts is not None:
            parts.append(f"wanted min_hosts={self.min_hosts}")
        if not self._all_answered():
            parts.append(
                "a host that resolves but does not answer is not serving yet, or its "
                "CURVE key is not the one this client was given"
            )
        return "; ".join(parts)


class Prober:
    """PINGs many endpoints at once: one DEALER socket each, kept until closed.

    A PING sent before the host is up waits in the socket's queue and goes out once ZeroMQ
    connects, so one PING per endpoint is enough.

    Args:
        context: The ZeroMQ context.
        curve: CURVE keys ``(server_public, client_public, client_secret)``, or None.
    """

    def __init__(self, context: zmq.Context, curve: tuple[bytes, bytes, bytes] | None) -> None:
        self.context = context
        self.curve = curve
        self.answered: set[str] = set()
        self._sockets: dict[str, zmq.Socket] = {}
        self._poller = zmq.Poller()

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self, endpoint: str) -> None:
        """PINGs ``endpoint``, unless it was already."""
        if endpoint in self._sockets:
            return
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if wants_ipv6(endpoint):
            sock.setsockopt(zmq.IPV6, 1)
        if self.curve is not None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self.curve
        self._sockets[endpoint] = sock
        try:
            sock.connect(endpoint)
            sock.send_multipart(encode_request(0, Command.PING, None, {}, allow_pickle=False))
        except zmq.ZMQError as exc:
            logger.warning("cannot probe %s: %s", endpoint, exc)
            return
        self._poller.register(sock, zmq.POLLIN)

    def poll(self, timeout_s: float) -> None:
        """Takes in PING replies for up to ``timeout_s`` (less once every probe answered)."""
        deadline = time.monotonic() + timeout_s
        while len(self.answered) < len(self._sockets):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for sock, _ in self._poller.poll(remaining * 1000):
                endpoint = next(e for e, s in self._sockets.items() if s is sock)
                self._poller.unregister(sock)
                try:
                    reply = decode_reply(sock.recv_multipart(), allow_pickle=False)
                except EnvServerError as exc:
                    logger.warning("%s answered a PING with an invalid reply: %s", endpoint, exc)
                    continue
                if reply.status == Status.OK:
                    self.answered.add(endpoint)

    def close(self) -> None:
        """Closes every probe socket."""
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()
