"""The hosts of the chaos soak (tests/harness/chaos.py): host processes that can be killed, frozen,
restarted on their port, and (in network namespaces of their own) cut off.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ports import free_ports

from envserver.testing import HostProcess, Namespace, start_host

#: The folder of this file: hosts find chaos_envs there (their PYTHONPATH).
TESTS = Path(__file__).resolve().parent


# --------------------------------------------------------------------- network namespaces


# --------------------------------------------------------------------- hosts


def free_port() -> int:
    """A loopback TCP port below the ephemeral range, free now: a host restarted on its port
    must be able to bind it again (see ``ports``)."""
    return free_ports()


class ChaosHost:
    """One host of the cluster: an endpoint that faults take down and bring back.

    Args:
        name: How the report names it (``h0``...).
        directory: Where its logs go.
        endpoint: The endpoint it binds, the same across restarts.
        serve_args: More ``envserver serve`` arguments.
        namespace: The network namespace it runs in, or None (loopback).
    """

    def __init__(
        self,
        name: str,
        directory: Path,
        endpoint: str,
        serve_args: Sequence[str],
        namespace: Namespace | None = None,
    ) -> None:
        self.name = name
        self.directory = directory
        self.endpoint = endpoint
        self.serve_args = list(serve_args)
        self.namespace = namespace
        self.process: HostProcess | None = None
        self.stopped = False
        self.cut = False

    @property
    def pid(self) -> int | None:
        """The pid of its process, while it runs."""
        return None if self.process is None else self.process.process.pid

    def start(self, tries: int = 5) -> None:
        """Starts ``envserver serve`` on its endpoint (retrying while the port is not free)."""
        path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
        prefix = ["env", f"PYTHONPATH={path}"]
        if self.namespace is not None:
            prefix = ["ip", "netns", "exec", self.namespace.name, *prefix]
        for attempt in range(1, tries + 1):
            try:
                self.process = start_host(
                    self.directory, *self.serve_args, bind=self.endpoint, prefix=prefix
                )
                return
            except RuntimeError:
                if attempt == tries:
                    raise
                time.sleep(0.5 * attempt)  # the port may not be free yet

    def kill(self) -> int:
        """SIGKILLs the process and waits for it; returns its pid."""
        assert self.process is not None, f"{self.name} is not running"
        process = self.process.process
        process.kill()
        process.wait()
        self.process = None
        self.stopped = False
        return process.pid

    def freeze(self, frozen: bool) -> None:
        """SIGSTOPs (True) or SIGCONTs (False) the process."""
        assert self.pid is not None, f"{self.name} is not running"
        os.kill(self.pid, signal.SIGSTOP if frozen else signal.SIGCONT)
        self.stopped = frozen

    def unplug(self, unplugged: bool) -> None:
        """Cuts (True) or restores (False) the link of its namespace."""
        assert self.namespace is not None, f"{self.name} has no link to cut"
        if unplugged:
            self.namespace.cut()
        else:
            self.namespace.restore()
        self.cut = unplugged

    def shut_down(self) -> None:
        """Brings it back to life if frozen or cut, then stops it (SIGTERM)."""
        if self.cut:
            self.unplug(False)
        if self.stopped:
            self.freeze(False)
        if self.process is not None:
            try:
                self.process.stop()
            finally:
                self.process = None


class Cluster:
    """The hosts of a soak: the active ones first, then the spares; some in namespaces.

    Args:
        directory: Where the hosts' logs go.
        count: How many hosts.
        spares: How many of them are spares (the last ones).
        serve_args: More ``envserver serve`` arguments for every host.
        spaces: Namespaces for the first active host and the last spares (one host each).
    """

    def __init__(
        self,
        directory: Path,
        count: int,
        spares: int,
        serve_args: Sequence[str],
        spaces: Sequence[Namespace] = (),
    ) -> None:
        if not 1 <= spares < count:
            raise ValueError(f"{spares} spares of {count} hosts: some must be active")
        placed: list[Namespace | None] = [None] * count
        for k, namespace in enumerate(spaces[:count]):
            placed[0 if k == 0 else count - k] = namespace  # one active, the others spares
        self.hosts = []
        for i, namespace in enumerate(placed):
            address = "127.0.0.1" if namespace is None else namespace.address
            port = free_port() if namespace is None else 5555
            self.hosts.append(
                ChaosHost(f"h{i}", directory, f"tcp://{address}:{port}", serve_args, namespace)
            )
        self.active = self.hosts[: count - spares]
        self.spares = self.hosts[count - spares :]
        #: The pids of every host process killed.
        self.killed_pids: set[int] = set()

    def start(self) -> None:
        """Starts every host (at once)."""
        with concurrent.futures.ThreadPoolExecutor(len(self.hosts)) as pool:
            for future in [pool.submit(host.start) for host in self.hosts]:
                future.result()

    def close(self) -> None:
        """Stops every host (after bringing back the frozen and unplugged ones)."""
        errors = []
        for host in self.hosts:
            try:
                host.shut_down()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def pid_of(self, endpoint: str) -> int | None:
        """The pid of the host process serving ``endpoint`` now."""
        return next((h.pid for h in self.hosts if h.endpoint == endpoint), None)

    def sessions(self) -> dict[str, int | None]:
        """Each host's session count, from ``envserver ping --json`` (None: no answer)."""
        endpoints = [host.endpoint for host in self.hosts]
        done = subprocess.run(
            [sys.executable, "-m", "envserver", "ping", "--json", "--timeout", "5", *endpoints],
            capture_output=True,
            text=True,
            timeout=60,
        )
        counts: dict[str, int | None] = dict.fromkeys(endpoints)
        with contextlib.suppress(json.JSONDecodeError):
            for answer in json.loads(done.stdout or "[]"):
                if answer.get("ok"):
                    counts[answer["endpoint"]] = answer.get("sessions")
        return counts

    def wait_idle(self, timeout_s: float) -> dict[str, int | None]:
        """Polls the session counts until every host has none; returns the last counts."""
        deadline = time.monotonic() + timeout_s
        while True:
            counts = self.sessions()
            if all(count == 0 for count in counts.values()) or time.monotonic() > deadline:
                return counts
            time.sleep(0.5)
