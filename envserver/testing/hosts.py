"""Host processes and network namespaces for tests: :func:`start_host`, :func:`namespaces`."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from envserver.launch.spawn import SERVING_ON, serve_command, spawn_host

__all__ = [
    "HOST_STARTUP_TIMEOUT_S",
    "HostProcess",
    "Namespace",
    "ip",
    "namespaces",
    "netns_unavailable",
    "start_host",
]

#: How long :func:`start_host` waits for a host to report its endpoint.
HOST_STARTUP_TIMEOUT_S = 60.0


class HostProcess:
    """An ``envserver serve`` process started by :func:`start_host`, and its endpoint.

    Attributes:
        process: The process.
        endpoint: The endpoint it bound (with the port resolved for ``tcp://...:*``).
        log: The file its stderr goes to.
    """

    def __init__(self, process: subprocess.Popen, endpoint: str, log: Path) -> None:
        self.process = process
        self.endpoint = endpoint
        self.log = log

    def log_text(self) -> str:
        """Everything the host logged so far."""
        return self.log.read_text(errors="replace")

    def served(self, count: int) -> list[str]:
        """Waits until the log names ``count`` endpoints (``serve --processes``); returns them.

        Raises:
            RuntimeError: If the process exits or they are not all named in time.
        """
        deadline = time.monotonic() + HOST_STARTUP_TIMEOUT_S
        while len(found := SERVING_ON.findall(self.log_text())) < count:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{count} hosts did not start: {self.log_text()[-3000:]}")
            time.sleep(0.05)
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Sends ``sig`` and waits for the exit status.

        Raises:
            RuntimeError: With the host's log, if it did not exit in time (it is killed).
        """
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(
                f"host {self.endpoint} did not stop within {timeout_s} s of signal {sig}; "
                f"its log:\n{self.log_text()[-3000:]}"
            ) from None


def start_host(
    directory: Path, *args: str, bind: str | None = None, prefix: Sequence[str] = ()
) -> HostProcess:
    """Starts ``python -m envserver serve`` and waits until it reports its endpoint.

    Args:
        directory: Where the host's log (and its ipc socket, by default) go.
        *args: More ``serve`` arguments (``--allow-pickle``, ``--env PATTERN``, ...).
        bind: The endpoint to bind (default: a fresh ipc socket in ``directory``).
        prefix: A command that runs the host, e.g. ``["ip", "netns", "exec", "ns1"]``.

    Returns:
        The running host.

    Raises:
        RuntimeError: If the host exits or does not report its endpoint in time.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd, log_name = tempfile.mkstemp(dir=directory, suffix=".log")
    os.close(fd)
    log = Path(log_name)
    if bind is None:
        bind = f"ipc://{log.with_suffix('.sock')}"
    process = spawn_host(serve_command(bind, extra=args, prefix=prefix), log)
    deadline = time.monotonic() + HOST_STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        match = SERVING_ON.search(log.read_text(errors="replace"))
        if match:
            return HostProcess(process, match.group(1), log)
        if process.poll() is not None:  # its last line says why (a CLI error is one line)
            lines = log.read_text(errors="replace").strip().splitlines() or ["(nothing logged)"]
            raise RuntimeError(f"a host exited with status {process.returncode}: {lines[-1]}")
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"host did not start in {HOST_STARTUP_TIMEOUT_S} s: {log.read_text()}")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs ``ip ARGS`` (iproute2), for tests that make network namespaces."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60, check=check)


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here (a reason to skip), or None if they can."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"es-probe-{os.getpid()}"
    if ip("netns", "add", probe, check=False).returncode != 0:
        return "ip netns add is not permitted here"
    ip("netns", "del", probe, check=False)
    return None


@dataclasses.dataclass(frozen=True)
class Namespace:
    """A network namespace joined to this one by a veth pair: a machine whose cable we hold.

    Attributes:
        name: The namespace (``ip netns exec NAME``).
        outer: This side's end of the veth pair.
        address: The namespace's address.
    """

    name: str
    outer: str
    address: str

    def prefix(self) -> list[str]:
        """The command prefix that runs a program in the namespace."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """Unplugs the link (packets to the namespace are dropped)."""
        ip("link", "set", self.outer, "down")

    def restore(self) -> None:
        """Plugs the link back in."""
        ip("link", "set", self.outer, "up")


@contextlib.contextmanager
def namespaces(count: int, prefix: str, subnet: int) -> Iterator[list[Namespace]]:
    """``count`` namespaces, each on a /30 subnet of ``10.SUBNET.X.0/24``, deleted afterwards.

    Names start with ``prefix`` and ``X`` comes from this process's id, so that another user of
    the helper (another prefix and subnet) or another run on the machine takes others. Needs
    root (see :func:`netns_unavailable`).
    """
    made: list[str] = []
    tag = os.getpid() % 10000
    net = f"10.{subnet}.{tag % 256}"
    found = []
    try:
        for k in range(1, count + 1):
            ns, outer, inner = f"{prefix}{tag}n{k}", f"{prefix}{tag}o{k}", f"{prefix}{tag}i{k}"
            ip("netns", "add", ns)
            made.append(ns)
            ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            made.append(outer)
            ip("link", "set", inner, "netns", ns)
            ip("addr", "add", f"{net}.{4 * k + 1}/30", "dev", outer)
            ip("link", "set", outer, "up")
            inside = ("netns", "exec", ns, "ip")
            ip(*inside, "addr", "add", f"{net}.{4 * k + 2}/30", "dev", inner)
            ip(*inside, "link", "set", inner, "up")
            ip(*inside, "link", "set", "lo", "up")
            found.append(Namespace(ns, outer, f"{net}.{4 * k + 2}"))
        yield found
    finally:
        for name in reversed(made):  # a namespace's end of the pair goes with it
            kind = "netns" if name.startswith(f"{prefix}{tag}n") else "link"
            ip(kind, "del", name, check=False)
