"""The hosts of one vector env: found, started or given; connected; and closed at the end."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import zmq

from envserver.launch.launcher import Launcher
from envserver.launch.ray import RayHosts, RaySpec, is_ray_spec
from envserver.wire.messages import Command
from envserver.wire.replies import HelloReply, MakeReply

from ._options import VectorOptions, split_envs
from ._recipe import EnvRecipe
from ._transport.connection import HostConnection
from ._transport.discovery import Discovery, Prober, Resolver
from ._transport.hearing import Hearing
from ._transport.lease import Heartbeat
from ._transport.local import LocalHosts
from ._transport.pool import HostPool
from ._transport.session import HostSession

__all__ = ["CLOSE_TIMEOUT_S", "Hosts"]

logger = logging.getLogger(__name__)

#: The bound on the CLOSE round trip when the env is closed.
CLOSE_TIMEOUT_S = 5.0

Curve = tuple[bytes, bytes, bytes]


class Hosts:
    """Where the envs of one vector env live, from the first connection to the last close.

    It resolves ``dns://`` and ``slurm://`` specs (waiting for ``min_hosts`` to answer), starts
    embedded local hosts when no hosts are given, opens the :class:`HostPool` (the envs spread
    over the hosts in contiguous blocks), opens a session on each host and makes the envs there,
    has the sessions' leases renewed, and at the end closes the sessions, the sockets, the local
    hosts and the ZeroMQ context it made.

    Args:
        options: The vector env's options.
        context: A ZeroMQ context to use (None: one of its own, terminated at close).
    """

    def __init__(self, options: VectorOptions, context: zmq.Context | None = None) -> None:
        self.options = options
        self.context = context or zmq.Context()
        self._own_context = context is None
        self.heartbeat = Heartbeat()  # renews the hosts' session leases
        #: What the envs said, told to the trainer after each call's replies.
        self.hearing = Hearing()
        #: How the host list's specs resolve (None without a host list).
        self.discovery: Discovery | None = None
        #: The embedded local hosts (None when hosts were given).
        self.local: LocalHosts | None = None
        #: What started the hosts (the local hosts, or Ray actors), or None: it replaces a lost
        #: one, and is closed with them.
        self.launcher: Launcher | None = None
        #: The CURVE keys of hosts started with keys of their own (Ray's), else None.
        self.own_curve: Curve | None = None
        #: The connections (None until :meth:`open`).
        self.pool: HostPool | None = None

    def find(
        self,
        hosts: Sequence[str] | str | None,
        num_envs: int,
        curve: Curve | None,
        resolver: Resolver | None = None,
        allow_pickle: bool = False,
    ) -> list[str] | None:
        """The hosts' endpoints: specs resolved, waiting for ``min_hosts`` to answer.

        Args:
            hosts: Endpoints and ``dns://``, ``slurm://`` specs, or None for local hosts.
            num_envs: The number of envs (the most hosts that are used).
            curve: CURVE keys ``(server_public, client_public, client_secret)``, or None.
            resolver: Resolves ``dns://`` names (default: the system's resolver).
            allow_pickle: Whether hosts started here accept pickled factories.

        Returns:
            The endpoints in host order; None when local hosts are to be started.

        Raises:
            HostUnavailableError: If too few hosts answered in time.
            ValueError: If ``min_hosts`` or ``envs_per_host`` do not fit the hosts given.
        """
        if hosts is None:
            if self.options.min_hosts is not None:
                raise ValueError("min_hosts needs hosts (local hosts are started as asked)")
            return None
        listed = [hosts] if isinstance(hosts, str) else list(hosts)
        if any(is_ray_spec(text) for text in listed):
            return self._launch_on_ray(listed, num_envs, curve, allow_pickle)
        self.discovery = Discovery(listed, resolver)
        if self.discovery.dynamic and self.options.envs_per_host is not None:
            raise ValueError(
                "envs_per_host needs a host list without dns:// or slurm:// specs (their "
                "host count is only known once they are resolved)"
            )
        return self.discovery.endpoints(
            min_hosts=self.options.min_hosts,
            max_hosts=num_envs,
            timeout_s=self.options.connect_timeout_s,
            probe=lambda: Prober(self.context, curve),
        )

    def _launch_on_ray(
        self, listed: list[str], num_envs: int, curve: Curve | None, allow_pickle: bool
    ) -> list[str]:
        """Starts hosts on a Ray cluster (see :mod:`envserver.launch.ray`); their endpoints.

        They speak CURVE with keys of their own (:attr:`own_curve`), whatever keys were given.
        """
        if len(listed) != 1:
            raise ValueError(f"a ray:// spec is the whole host list, got {listed}")
        spec = RaySpec.parse(listed[0])
        options = self.options
        if options.envs_per_host is not None and spec.hosts is None:
            raise ValueError("envs_per_host with ray:// needs the host count: ray://?hosts=N")
        if options.min_hosts is not None and options.min_hosts > (spec.hosts or num_envs):
            raise ValueError(f"min_hosts={options.min_hosts} but {listed[0]} starts fewer hosts")
        if curve is not None:
            logger.info("hosts on Ray use keys made for them, not the CURVE keys given")
        launcher = RayHosts(spec, num_envs, options.connect_timeout_s, allow_pickle=allow_pickle)
        self.launcher, self.own_curve = launcher, launcher.curve
        return list(launcher.endpoints)

    def connect(
        self, endpoints: list[str] | None, num_envs: int, *, allow_pickle: bool, curve: Curve | None
    ) -> HostPool:
        """Connects to each host (starting local ones if ``endpoints`` is None).

        The envs are spread over the hosts in contiguous blocks (see ``split_envs``).

        Returns:
            The pool of connections, in host order (also :attr:`pool`).

        Raises:
            HostUnavailableError: If a ``tcp://`` name does not resolve.
            ValueError: If the hosts and the envs do not fit.
        """
        options = self.options
        if endpoints is None:
            self.local = LocalHosts(options.local_host_count(num_envs))
            self.launcher = self.local
            endpoints = self.local.endpoints
        if not endpoints:
            raise ValueError("hosts must name at least one endpoint")
        counts = split_envs(num_envs, len(endpoints), options.envs_per_host)
        curve = self.own_curve or curve
        local = self.local
        settings = options.connection_settings(
            allow_pickle=allow_pickle,
            curve=curve,
            local=local is not None,
            reply_spin_s=0.0 if local is None else local.reply_spin_s,
        )
        self.pool = HostPool(
            self.context,
            settings,
            heartbeat=self.heartbeat,
            hearing=self.hearing,
            process=self._process,
            name=self._name,
        )
        start = 0
        for index, (endpoint, count) in enumerate(zip(endpoints, counts)):
            self.pool.connect(index, endpoint, start, count)
            start += count
        return self.pool

    def make_envs(self, recipe: EnvRecipe) -> list[tuple[HostConnection, MakeReply]]:
        """Opens a session on every host and makes its envs (not recovered: it fails).

        No overall timeout: each connection bounds its own wait (``connect_timeout_s`` for a
        host never reached, ``host_timeout_s`` once connected, ``request_timeout_s`` if set).

        Returns:
            Each host's connection and MAKE reply, in host order.
        """
        pool = self.pool
        for connection, body in pool.round_trip(Command.HELLO, lambda c: recipe.hello(), None):
            hello = connection.read(HelloReply, body)
            connection.hold(HostSession(hello.session, hello.info))
        made = pool.round_trip(
            Command.MAKE, lambda c: c.make_body(recipe.make(c.block.start, c.block.stop)), None
        )
        return [(connection, connection.read(MakeReply, body)) for connection, body in made]

    def _name(self, index: int, endpoint: str) -> str:
        """How messages name host ``index``: ``local host N`` (its socket only at DEBUG)."""
        if self.local is None:
            return f"host {endpoint}"
        logger.debug("local host %d is %s", index, endpoint)
        return f"local host {index}"

    def _process(self, index: int) -> Callable[[float], None] | None:
        """For a local host, what raises once its process exited (see ``LocalHosts``)."""
        local = self.local
        return None if local is None else lambda grace_s: local.liveness(index, grace_s)

    def close(self, polite: bool) -> None:
        """Closes the sessions, the sockets, the local hosts and the context made here.

        Args:
            polite: Wait (up to :data:`CLOSE_TIMEOUT_S`) for the hosts to confirm each session
                is closed, so that none holds it once this returns (a trainer that exits, also
                after Ctrl-C, leaves its hosts free for the next one); else (a call given up on
                is still under way, and its host would answer CLOSE only after it) the CLOSE
                requests are only sent, and get a short time to leave.
        """
        connections = [] if self.pool is None else self.pool.connections
        live = [
            c for c in connections if c.requests.session is not None and c.health.failure is None
        ]
        if polite and live:
            try:
                self.pool.round_trip(Command.CLOSE, lambda c: None, CLOSE_TIMEOUT_S, live)
            except Exception as exc:
                logger.warning("closing the sessions ended with %r", exc)
        elif live:  # without waiting: the hosts close the sessions once they read this
            for connection in live:
                connection.close_session_quietly()
        self.heartbeat.close()
        if self.pool is not None:
            self.pool.close()
        if self.launcher is not None:
            self.launcher.close()
            self.launcher = self.local = None
        if self._own_context:
            self.context.term()
            self._own_context = False
