"""Env hosts on a Ray cluster: one actor per host, spread over the nodes by a placement group.

A trainer on a Ray cluster names its hosts ``ray://`` (the cluster of ``RAY_ADDRESS``, or the
one this process is connected to) or ``ray://HEAD:PORT``, with options in the query::

    ray://?hosts=8&cpus=2&strategy=STRICT_SPREAD

Each host is an actor (``cpus`` CPUs, one bundle of a placement group with the ``strategy``) that
runs ``envserver serve`` on its node's address, a child process that exits with the actor. The
hosts are this trainer's alone: they speak CURVE with keys made for this vector env (the hosts'
key pair and the trainer's public key travel to the actors through Ray), so nobody else on the
network can use them, and they accept pickled factories where the trainer allows them. The
actor restarts when it dies (its node lost: the placement group moves its bundle to a node that
has room), and a recovering trainer asks it for its endpoint again. Closing the vector env kills
the actors and removes the placement group; if the trainer dies, Ray removes them with its job.

Needs the ``ray`` extra (``pip install 'envserver[ray]'``); ``ray`` is imported only here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import zmq

from envserver.errors import HostUnavailableError

from .spawn import SERVING_ON, serve_command

__all__ = ["RAY_SCHEME", "RayHosts", "RaySpec", "is_ray_spec"]

logger = logging.getLogger(__name__)

#: How a host list names hosts on a Ray cluster.
RAY_SCHEME = "ray://"
#: The placement strategies a spec may ask for (Ray's own names).
STRATEGIES = ("SPREAD", "STRICT_SPREAD", "PACK")
#: How long one ask for a replacement waits for a restarted actor (recovery asks again).
REPLACEMENT_WAIT_S = 10.0


@dataclasses.dataclass(frozen=True)
class RaySpec:
    """A ``ray://`` host spec.

    Attributes:
        text: The spec as given.
        address: The cluster's address (None: ``RAY_ADDRESS``, or the connected cluster).
        hosts: How many hosts (None: one per env, at most one per CPU the cluster has).
        cpus: The CPUs each host reserves.
        strategy: The placement group's strategy.
    """

    text: str
    address: str | None = None
    hosts: int | None = None
    cpus: float = 1.0
    strategy: str = "SPREAD"

    @classmethod
    def parse(cls, text: str) -> RaySpec:
        """Reads ``ray://[HEAD:PORT][?hosts=N&cpus=C&strategy=S]``.

        Raises:
            ValueError: If it is not such a spec, naming what is wrong.
        """
        parts = urlsplit(text)
        expected = f"{text!r} is not a Ray host spec: expected ray://[HEAD:PORT][?hosts=N]"
        if parts.scheme != "ray" or parts.path not in ("", "/") or parts.fragment:
            raise ValueError(expected)
        head, colon, port = parts.netloc.rpartition(":")
        if parts.netloc and not (colon and head and "@" not in head and port.isdigit()):
            raise ValueError(f"{expected} (the address is HEAD:PORT, got {parts.netloc!r})")
        try:
            query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError:
            raise ValueError(f"{text!r}: options are NAME=VALUE, joined by &") from None
        unknown = sorted(set(query) - {"hosts", "cpus", "strategy"})
        if unknown:
            raise ValueError(
                f"{text!r}: unknown option(s) {', '.join(unknown)} (hosts, cpus, strategy)"
            )
        options: dict[str, Any] = {}
        for name, values in query.items():
            if len(values) > 1:
                raise ValueError(f"{text!r}: {name} given {len(values)} times")
            options[name] = values[0]
        if "hosts" in options:
            hosts = options["hosts"]
            if not (hosts.isdigit() and int(hosts) >= 1):
                raise ValueError(f"{text!r}: hosts must be a positive integer, got {hosts!r}")
            options["hosts"] = int(hosts)
        if "cpus" in options:
            try:
                cpus = float(options["cpus"])
            except ValueError:
                cpus = math.nan
            if not (math.isfinite(cpus) and cpus > 0):
                raise ValueError(
                    f"{text!r}: cpus must be a positive number, got {options['cpus']!r}"
                )
            options["cpus"] = cpus
        if "strategy" in options and options["strategy"] not in STRATEGIES:
            raise ValueError(
                f"{text!r}: strategy must be one of {', '.join(STRATEGIES)}, got "
                f"{options['strategy']!r}"
            )
        return cls(text, parts.netloc or None, **options)


def is_ray_spec(text: object) -> bool:
    """Whether a host list entry is a ``ray://`` spec."""
    return isinstance(text, str) and text.startswith(RAY_SCHEME)


class RayHosts:
    """Hosts as Ray actors, started at once; a :class:`~envserver.launch.launcher.Launcher`.

    Args:
        spec: Where and how many (see :class:`RaySpec`).
        num_envs: The trainer's envs: never more hosts than envs.
        timeout_s: How long the cluster may take to place the hosts and start them.
        serve_args: More ``envserver serve`` arguments for every host (``--import``, ...).

    Raises:
        ImportError: If ``ray`` is not installed, saying which extra installs it.
        HostUnavailableError: If the cluster cannot be reached, has no room for the hosts, or a
            host does not answer in time: naming which, and why.
    """

    def __init__(
        self,
        spec: RaySpec,
        num_envs: int,
        timeout_s: float,
        serve_args: tuple[str, ...] = (),
        allow_pickle: bool = False,
    ) -> None:
        ray = _import_ray()
        self.spec = spec
        self.endpoints: list[str] = []
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        #: The CURVE keys a client of these hosts uses: ``(server_public, client_public,
        #: client_secret)``.
        self.curve = (server_public, client_public, client_secret)
        self._host_keys = (server_public, server_secret, client_public)
        self._ray = ray
        self._serve_args = (*serve_args, "--allow-pickle") if allow_pickle else serve_args
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        _connect(ray, spec, timeout_s)
        self._group: Any = None
        self._actors: list[Any] = []
        try:
            count = spec.hosts or _default_count(ray, spec, num_envs)
            self._group = self._place(count)
            self._actors = [self._actor(i) for i in range(count)]
            self.endpoints = self._endpoints(count)
        except BaseException:
            self.close()
            raise
        logger.info("started %d env hosts on the Ray cluster: %s", count, self.endpoints)

    def _place(self, count: int) -> Any:
        """A placement group of ``count`` bundles, placed within the timeout."""
        from ray.util.placement_group import placement_group, remove_placement_group

        spec, ray = self.spec, self._ray
        group = placement_group([{"CPU": spec.cpus}] * count, strategy=spec.strategy)
        ready, _ = ray.wait([group.ready()], timeout=self._remaining())
        if not ready:
            remove_placement_group(group)
            free = ray.available_resources().get("CPU", 0)
            total = ray.cluster_resources().get("CPU", 0)
            nodes = sum(1 for node in ray.nodes() if node["Alive"])
            raise HostUnavailableError(
                f"the Ray cluster has no room for {count} env host(s) of {spec.cpus:g} CPU each "
                f"({spec.strategy}) within {self._timeout_s:g} s: {free:g} of {total:g} CPUs "
                f"free on {nodes} node(s)"
            )
        return group

    def _remaining(self) -> float:
        """What is left of the start-up's time (``timeout_s`` in all)."""
        return max(0.0, self._deadline - time.monotonic())

    def _actor(self, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=index)
        return (
            _actor_class(self._ray)
            .options(num_cpus=self.spec.cpus, scheduling_strategy=strategy, max_restarts=-1)
            .remote(["--name", f"ray-{index}", *self._serve_args], self._host_keys, self._timeout_s)
        )

    def _endpoints(self, count: int) -> list[str]:
        """Every host's endpoint once it answers, in host order."""
        ray = self._ray
        calls = [actor.endpoint.remote() for actor in self._actors]
        _, waiting = ray.wait(calls, num_returns=count, timeout=self._remaining())
        if waiting:
            late = [i for i, call in enumerate(calls) if call in waiting]
            raise HostUnavailableError(
                f"{len(late)} of {count} env host(s) on the Ray cluster did not start within "
                f"{self._timeout_s:g} s (hosts {late})"
            )
        try:
            return list(ray.get(calls))
        except ray.exceptions.RayError as exc:
            raise HostUnavailableError(
                f"an env host on the Ray cluster did not start: {exc}"
            ) from None

    def replacements(self, index: int, endpoint: str, fresh: bool) -> list[str]:
        """Where host ``index`` serves now, its actor's answer.

        The actor (restarted on another node if its node was lost) starts its host again if it
        exited, or, on a recovery's first try (``fresh``), if it still runs at the lost
        endpoint (it may be frozen); and says the endpoint. Waits up to
        :data:`REPLACEMENT_WAIT_S` for the actor; while it is not back, nothing (recovery asks
        again, within ``restart_timeout_s``).
        """
        ray = self._ray
        call = self._actors[index].endpoint.remote(endpoint if fresh else None)
        try:
            found = ray.get(call, timeout=REPLACEMENT_WAIT_S)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            logger.warning("env host %d on the Ray cluster is not back yet: %s", index, exc)
            return []
        if found != endpoint:
            logger.warning("env host %d on the Ray cluster moved to %s", index, found)
        self.endpoints[index] = found
        return [found]

    def close(self) -> None:
        """Kills the actors (their hosts exit with them) and removes the placement group.

        This process stays connected to the cluster (other vector envs, or your own Ray work,
        may use it; Ray disconnects it at exit).
        """
        ray = self._ray
        actors, self._actors = self._actors, []
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already gone
                logger.debug("killing an env host actor: %r", exc)
        group, self._group = self._group, None
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(group)
            except Exception as exc:
                logger.debug("removing the env hosts' placement group: %r", exc)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "ray:// hosts need Ray: pip install 'envserver[ray]' (or pip install ray)"
        ) from None
    return ray


CLIENT_SERVER_FAILED = ("Starting Ray client server failed", "start_specific_server")
"""What Ray Client's proxy answers when the server it forks for a trainer dies at its start: its
own error, or the traceback of its start (the process gone before the proxy read its command
line)."""

CLIENT_SERVER_ATTEMPTS = 3
"""How many times a ``ray://`` trainer connects while that server fails (each gets a new one)."""


def _connect(ray: Any, spec: RaySpec, timeout_s: float) -> None:
    """Connects this process to the spec's cluster unless it is connected to one already.

    An address that takes no connection is refused at once (``ray.init`` would retry it for
    minutes). Through Ray Client, a connection whose server died as Ray's proxy forked it is made
    again, up to ``CLIENT_SERVER_ATTEMPTS`` times.
    """
    if ray.is_initialized():
        connected = ray.get_runtime_context().gcs_address
        if spec.address and spec.address != connected:
            logger.warning(
                "this process is connected to the Ray cluster at %s already: %s is not used",
                connected,
                spec.text,
            )
        return
    address = spec.address or os.environ.get("RAY_ADDRESS") or "auto"
    if spec.address:
        where = "the spec's address"
    elif os.environ.get("RAY_ADDRESS"):
        where = "from RAY_ADDRESS"
    else:
        where = "no address in the spec, RAY_ADDRESS unset"
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if colon and port.isdigit():
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        except OSError as exc:
            raise HostUnavailableError(
                f"no Ray cluster reached at {address} ({where}): {exc.strerror or exc}"
            ) from None
    for attempt in range(1, CLIENT_SERVER_ATTEMPTS + 1):
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
            return
        except (ConnectionError, RuntimeError, ValueError) as exc:
            text = " ".join(str(exc).split())
            died = any(marker in text for marker in CLIENT_SERVER_FAILED)
            if not died or attempt == CLIENT_SERVER_ATTEMPTS:
                raise HostUnavailableError(
                    f"no Ray cluster reached at {address} ({where}): {text[:300]}"
                ) from None
            ray.shutdown()
            logger.warning(
                "the Ray Client server at %s failed to start this trainer's server (attempt "
                "%d of %d; Ray's intermittent fork failure, ray-project/ray#63202): connecting "
                "again",
                address,
                attempt,
                CLIENT_SERVER_ATTEMPTS,
            )


def _default_count(ray: Any, spec: RaySpec, num_envs: int) -> int:
    """One host per env, at most as many as the cluster's free CPUs hold.

    Spread strictly: at most one per node that can hold one.
    """
    free = ray.available_resources().get("CPU", 0)
    count = min(num_envs, int(free // spec.cpus))
    if spec.strategy == "STRICT_SPREAD":
        nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= spec.cpus]
        count = min(count, len(nodes))
    return max(1, count)


def _write_keys(
    folder: str, server_public: bytes, server_secret: bytes, client_public: bytes
) -> str:
    """Writes the host's key pair and the trainer's public key as ZeroMQ certificate files.

    Returns:
        The host's secret key file (the trainer's public key file is the only one in
        ``folder`` that ``--authorized-keys`` reads).
    """
    files = []
    for name, public, secret in (
        ("host.key_secret", server_public, server_secret),
        ("trainer.key", client_public, None),
    ):
        lines = ["curve", f'    public-key = "{public.decode()}"']
        if secret is not None:
            lines.append(f'    secret-key = "{secret.decode()}"')
        path = os.path.join(folder, name)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write("\n".join(lines) + "\n")
        files.append(path)
    return files[0]


_ACTOR_CLASS: Any = None


def _actor_class(ray: Any) -> Any:
    """The host actor's class, made once (``ray.remote`` needs ``ray``, imported lazily)."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(_HostActor)
    return _ACTOR_CLASS


class _HostActor:
    """Runs ``envserver serve`` on its node's address; :meth:`endpoint` says where.

    The host is a child process of the actor's worker (``--parent-pid``: it exits when the
    worker does), its log lines (warnings and errors, as local hosts') go to the worker's stderr
    (Ray's log, and the driver's). Its
    CURVE keys are on disk only while it starts (a host reads them once): in a directory of its
    own that only this user can read, removed once it serves.
    """

    def __init__(
        self, serve_args: list[str], keys: tuple[bytes, bytes, bytes], timeout_s: float
    ) -> None:
        self._serve_args = serve_args
        self._keys = keys
        self._timeout_s = timeout_s
        self._process: subprocess.Popen | None = None
        self._endpoint: str | None = None
        self.endpoint()

    def endpoint(self, lost: str | None = None) -> str:
        """The host's endpoint, starting it (again) if it is not running.

        Args:
            lost: An endpoint the trainer lost: if the host still runs there, it is started
                anew (it may be frozen).
        """
        process = self._process
        if process is not None and process.poll() is None:
            if lost is None or lost != self._endpoint:
                assert self._endpoint is not None
                return self._endpoint
            process.kill()
            process.wait()
        import ray

        bind = f"tcp://{ray.util.get_node_ip_address()}:*"
        folder = tempfile.mkdtemp(prefix="envserver-ray-")  # mode 0700
        try:
            host_key = _write_keys(folder, *self._keys)
            keys = ["--curve-secret-key", host_key, "--authorized-keys", folder]
            command = serve_command(
                bind, parent_pid=os.getpid(), log_level="WARNING", extra=[*keys, *self._serve_args]
            )
            return self._start(command, bind)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _start(self, command: list[str], bind: str) -> str:
        """Starts the host; its endpoint once it serves (its keys read)."""
        self._process = process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        found: list[str] = []
        tail: list[str] = []
        said = threading.Event()

        def relay() -> None:  # every line on to the worker's stderr; the endpoint noted
            assert process.stderr is not None
            for raw in process.stderr:
                line = raw.decode(errors="replace")
                match = SERVING_ON.search(line)
                if match and not found:
                    found.append(match.group(1))
                    said.set()
                tail[:] = [*tail[-9:], line.rstrip()]
                sys.stderr.write(line)
            said.set()  # it exited

        threading.Thread(target=relay, daemon=True).start()
        said.wait(self._timeout_s)
        if not found:
            process.kill()
            status = process.wait()
            said_last = "; ".join(tail) or "nothing"
            raise RuntimeError(
                f"envserver serve did not start on {bind} within {self._timeout_s:g} s "
                f"(exit status {status}; it said: {said_last})"
            )
        self._endpoint = found[0]
        return self._endpoint
