"""Host discovery: ``dns://NAME:PORT`` specs resolved to one endpoint per address of NAME.

In Compose and Kubernetes, env hosts are replicas behind one service name whose addresses the
trainer does not know in advance (Docker's embedded DNS, or a headless Service, answer a name
with every replica's address). A host list may mix such specs with plain endpoints::

    ["tcp://sim-a:5555", "dns://envhost:5555"]

Plain endpoints (``tcp://``, ``ipc://``, ``inproc://``) are used as given: ZeroMQ resolves a
``tcp://`` name itself, to one address. A ``dns://`` spec becomes one ``tcp://`` endpoint per
address (A and AAAA records), and only addresses that answer a PING are used, one per host
process (a host reached at two addresses counts once). :class:`Discovery` waits, within one
deadline, until enough hosts answer; when a host is lost, it resolves the name again to find
where its envs can be made anew (a replaced container may have a new address).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import zmq

from envserver.errors import EnvServerError, HostUnavailableError, ProtocolError
from envserver.launch.slurm import foreign_host
from envserver.launch.specs import Resolver, spec_endpoints
from envserver.wire.endpoints import HostSpec, client_socket, resolve_dns
from envserver.wire.messages import Command, Status, decode_reply, encode_request
from envserver.wire.replies import HostInfo

__all__ = ["Discovery", "Prober", "Resolver"]

logger = logging.getLogger(__name__)

#: How long one round of the wait lasts: names are resolved again, silent hosts PINGed again.
ROUND_S = 0.5
#: How long the wait gives resolved addresses that have not answered yet, once enough did.
STRAGGLER_GRACE_S = 1.0
#: How often the wait logs who answered and who did not.
PROGRESS_LOG_INTERVAL_S = 5.0


class Discovery:
    """Turns a host list into endpoints, resolving its ``dns://`` and ``slurm://`` specs.

    Args:
        specs: The host list: endpoints, ``dns://NAME:PORT`` and ``slurm://NODES:PORT`` specs.
        resolver: Resolves a ``dns://`` name and port to addresses (default:
            :func:`resolve_dns`).
    """

    def __init__(self, specs: Sequence[str], resolver: Resolver | None = None) -> None:
        self.specs = [HostSpec.parse(text) for text in specs]
        self.resolver = resolver or resolve_dns
        self.answered: set[str] = set()  # endpoints that answered while waiting
        self._origin: dict[str, HostSpec] = {}  # endpoint -> the spec it came from

    @property
    def dynamic(self) -> bool:
        """Whether any spec is resolved (else the endpoints are the specs as given)."""
        return any(spec.dynamic for spec in self.specs)

    def resolve(self, spec: HostSpec) -> list[str]:
        """The endpoints of one spec now (see :func:`~envserver.launch.specs.spec_endpoints`).

        Raises:
            OSError: If a ``dns://`` name does not resolve.
            ValueError: If a ``slurm://`` spec names no nodes here.
        """
        if not spec.dynamic:
            return [spec.text]
        endpoints = spec_endpoints(spec, self.resolver)
        for endpoint in endpoints:
            self._origin[endpoint] = spec
        return endpoints

    def endpoints(
        self,
        *,
        min_hosts: int | None,
        max_hosts: int,
        timeout_s: float,
        probe: Callable[[], Prober],
    ) -> list[str]:
        """Waits until enough hosts answer, and returns their endpoints in host-list order.

        Without specs the list is returned as given (the session handshake checks it).
        Otherwise every endpoint is PINGed: each plain endpoint must answer, and the specs must
        give at least ``min_hosts`` distinct hosts in all (default: one per ``dns://`` spec,
        every host of a ``slurm://`` spec); addresses that resolved but have not answered yet
        get a short grace.

        Args:
            min_hosts: How many distinct hosts, plain endpoints included, must answer.
            max_hosts: The most hosts to use (one env each at least): the first that answered.
            timeout_s: How long to wait.
            probe: Makes the prober that PINGs the endpoints.

        Raises:
            HostUnavailableError: If too few answered in time, naming what resolved and what
                answered.
            ValueError: If ``min_hosts`` is not a positive integer, or beyond what the list
                can give.
        """
        if min_hosts is not None and (not isinstance(min_hosts, int) or min_hosts < 1):
            raise ValueError(f"min_hosts must be a positive integer, got {min_hosts!r}")
        if min_hosts is not None and min_hosts > max_hosts:
            raise ValueError(f"min_hosts={min_hosts} but there are only {max_hosts} env(s)")
        if not self.dynamic:
            named = len(set(spec.text for spec in self.specs))
            if min_hosts is not None and named < min_hosts:
                raise ValueError(f"min_hosts={min_hosts} but the host list names {named} host(s)")
            return [spec.text for spec in self.specs]
        deadline = time.monotonic() + timeout_s
        with probe() as prober:
            prober.refuse = self._refuse
            chosen = _Wait(self, prober, min_hosts, deadline, timeout_s).run()
            self.answered = set(prober.instances)
        if len(chosen) > max_hosts:
            logger.info("%d env hosts answered; using %d, one per env", len(chosen), max_hosts)
        return chosen[:max_hosts]

    def _refuse(self, endpoint: str, info: HostInfo) -> str | None:
        """Why a host that answered is not used: another Slurm job's, on this job's nodes."""
        spec = self._origin.get(endpoint)
        if spec is None or spec.scheme != "slurm":
            return None
        return foreign_host(endpoint, info.slurm_job)

    def replacements(self, endpoint: str, in_use: set[str], spares: Sequence[str]) -> list[str]:
        """Where a lost host's envs may be made anew, best first.

        For an address of a ``dns://`` spec, the name is resolved again. The same address comes
        first while the name still gives it (a restarted container keeps its address), else
        after the addresses no other connection uses (a replaced pod comes back at a new one;
        those that answered before first); then the ``spares`` (a ``dns://`` or ``slurm://``
        spare resolved now, to its addresses); then addresses in use (a host serves many
        sessions). A plain endpoint gives itself, then the spares.
        """
        spec = self._origin.get(endpoint)
        resolved: list[str] = []
        if spec is not None:
            try:
                resolved = self.resolve(spec)
            except OSError as exc:
                logger.warning("%s does not resolve now (%s)", spec.text, exc)
        others = [e for e in resolved if e != endpoint]
        free = sorted((e for e in others if e not in in_use), key=lambda e: e not in self.answered)
        busy = [e for e in others if e in in_use]
        first = [endpoint, *free] if endpoint in resolved or spec is None else [*free, endpoint]
        return list(dict.fromkeys([*first, *self._spares(spares), *busy]))

    def _spares(self, spares: Sequence[str]) -> list[str]:
        """The endpoints of the spares now: plain ones as they are, specs resolved."""
        endpoints: list[str] = []
        for text in spares:
            spare = HostSpec.parse(text)
            try:
                endpoints += self.resolve(spare)
            except (OSError, ValueError) as exc:
                logger.warning("the spare %s does not resolve now (%s)", text, exc)
        return endpoints


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
        """Rounds of resolving and PINGing until enough hosts answer or the deadline passes.

        Returns:
            The endpoints to use, in host-list order, one per host.

        Raises:
            HostUnavailableError: At the deadline, with too few hosts.
        """
        next_log = time.monotonic() + PROGRESS_LOG_INTERVAL_S
        enough_since: float | None = None
        while True:
            round_end = min(self.deadline, time.monotonic() + ROUND_S)
            self._resolve_all()
            self.prober.poll(round_end - time.monotonic())
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
            time.sleep(max(0.0, round_end - time.monotonic()))  # rounds, never a busy loop

    def _resolve_all(self) -> None:
        """Resolves every spec again (replicas come and go) and PINGs what has not answered."""
        for spec in self.discovery.specs:
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
                self.prober.ping(endpoint)

    def _answered(self, spec: HostSpec) -> list[str]:
        return [e for e in self.resolved.get(spec, []) if e in self.prober.instances]

    def _chosen(self) -> list[str]:
        """The endpoints to use, in host-list order: plain ones, and one per answering host."""
        chosen: dict[str, None] = {}
        instances: set[str] = set()
        for spec in self.discovery.specs:
            if not spec.dynamic:
                chosen[spec.text] = None
                instances.add(self.prober.instances.get(spec.text, spec.text))
                continue
            for endpoint in self._answered(spec):
                instance = self.prober.instances[endpoint]
                if instance not in instances:  # one host reached at two addresses counts once
                    instances.add(instance)
                    chosen[endpoint] = None
        return list(chosen)

    def _enough(self) -> bool:
        plain = [s.text for s in self.discovery.specs if not s.dynamic]
        if not all(e in self.prober.instances for e in plain):
            return False
        if self.min_hosts is not None:
            return len(self._chosen()) >= self.min_hosts
        return all(self._complete(spec) for spec in self.discovery.specs if spec.dynamic)

    def _complete(self, spec: HostSpec) -> bool:
        """Whether enough of a spec's hosts answered when ``min_hosts`` is not given.

        One of a ``dns://`` name's (replicas come and go); every one of a ``slurm://`` spec's
        (the job started them all).
        """
        answered = self._answered(spec)
        if spec.scheme == "slurm":
            return bool(answered) and len(answered) == len(self.resolved.get(spec, []))
        return bool(answered)

    def _all_answered(self) -> bool:
        return all(e in self.prober.instances for es in self.resolved.values() for e in es)

    def _finish(self) -> list[str]:
        silent = [e for es in self.resolved.values() for e in es if e not in self.prober.instances]
        if silent:
            logger.warning("left out env hosts that resolved but did not answer: %s", silent)
        return self._chosen()

    def _report(self) -> str:
        parts = []
        for spec in self.discovery.specs:
            if spec in self.problems:
                parts.append(f"{spec.text} {self.problems[spec]}")
                continue
            endpoints = self.resolved.get(spec, [])
            answered = self._answered(spec)
            silent = [self.prober.why_silent(e) for e in endpoints if e not in answered]
            if not spec.dynamic:
                parts.append(f"{spec.text} answered" if answered else f"{silent[0]} did not answer")
                continue
            parts.append(
                f"{spec.text} resolved to {len(endpoints)} address(es); answered: "
                f"{', '.join(answered) or 'none'}; not answering: {', '.join(silent) or 'none'}"
            )
        if self.min_hosts is not None:
            parts.append(f"wanted min_hosts={self.min_hosts}")
        if not self._all_answered():
            parts.append(
                "a host that does not answer is not serving (yet), or its CURVE key is not the "
                "one this client was given"
            )
        return "; ".join(parts)


class Prober:
    """PINGs many endpoints at once: one DEALER socket each, kept until closed.

    An endpoint that has not answered is PINGed again on every call of :meth:`ping` (a PING
    queued on a connection that then dropped is lost with it).

    Args:
        context: The ZeroMQ context.
        curve: CURVE keys ``(server_public, client_public, client_secret)``, or None.

    Attributes:
        instances: The endpoints that answered, each with its host's instance token (the
            endpoint itself for a host that sends none).
        refuse: Says why a host that answered is not to be used (None: it is); such a host
            counts as silent, and is PINGed again.
    """

    def __init__(self, context: zmq.Context, curve: tuple[bytes, bytes, bytes] | None) -> None:
        self.context = context
        self.curve = curve
        self.instances: dict[str, str] = {}
        self.refuse: Callable[[str, HostInfo], str | None] = lambda endpoint, info: None
        self._sockets: dict[str, zmq.Socket] = {}
        self._problems: dict[str, str] = {}  # endpoint -> what its last answer was
        self._poller = zmq.Poller()

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def ping(self, endpoint: str) -> None:
        """PINGs ``endpoint`` (again), unless it already answered."""
        if endpoint in self.instances:
            return
        sock = self._sockets.get(endpoint)
        try:
            if sock is None:
                sock = self._sockets[endpoint] = client_socket(self.context, endpoint, self.curve)
                sock.connect(endpoint)
                self._poller.register(sock, zmq.POLLIN)
            sock.send_multipart(
                encode_request(0, Command.PING, None, {}, allow_pickle=False), zmq.NOBLOCK
            )
        except zmq.ZMQError as exc:
            self._problems[endpoint] = f"cannot be reached ({exc})"

    def poll(self, timeout_s: float) -> None:
        """Takes in PING replies for up to ``timeout_s`` (less once every endpoint answered)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while len(self.instances) < len(self._sockets):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for sock, _ in self._poller.poll(remaining * 1000):
                endpoint = next(e for e, s in self._sockets.items() if s is sock)
                try:
                    reply = decode_reply(sock.recv_multipart(), allow_pickle=False)
                except EnvServerError as exc:
                    self._problems[endpoint] = f"answered with an invalid reply ({exc})"
                    continue
                if reply.status == Status.OK:
                    try:
                        info = HostInfo.from_wire(reply.body)
                    except ProtocolError as exc:
                        self._problems[endpoint] = f"answered with an invalid reply ({exc})"
                        continue
                    refused = self.refuse(endpoint, info)
                    if refused:
                        self._problems[endpoint] = refused
                        continue
                    self.instances[endpoint] = info.instance or endpoint
                    self._poller.unregister(sock)
                else:
                    self._problems[endpoint] = f"answered with an error ({reply.body})"

    def why_silent(self, endpoint: str) -> str:
        """An endpoint that did not answer, with what is known of why."""
        problem = self._problems.get(endpoint)
        return f"{endpoint} ({problem})" if problem else endpoint

    def close(self) -> None:
        """Closes every probe socket."""
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()
