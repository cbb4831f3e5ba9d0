"""Helpers the tests import: hosts for a block, a refused port, polling, exact comparisons,
the package's modules, sockets that raise where a signal would, processes seen in /proc, a
host's metrics, CURVE keys."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from prometheus_client.parser import text_string_to_metric_families

import envserver
from envserver.cli.settings import variable_for
from envserver.testing import HostProcess, start_host

POLL_S = 0.05
#: The repository, and the folder installed as envserver.client.
ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "client"


def package_modules() -> dict[str, Path]:
    """Every module of envserver (the client from its own folder) by dotted name, from the files.

    Nothing is imported, so a listing that leaves the client out does not load it.
    """
    modules = {}
    package = Path(envserver.__file__).parent
    for base, name in ((package, "envserver"), (CLIENT, "envserver.client")):
        for path in sorted(base.rglob("*.py")):
            if name == "envserver" and path.resolve().is_relative_to(CLIENT):  # a link to it
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([name, *parts])] = path
    return modules


@contextlib.contextmanager
def running_hosts(
    directory: Path, count: int, *args: str, **kwargs: Any
) -> Iterator[list[HostProcess]]:
    """``count`` hosts started by ``start_host(directory, *args, **kwargs)``, stopped after."""
    hosts: list[HostProcess] = []
    try:
        for _ in range(count):
            hosts.append(start_host(directory, *args, **kwargs))
        yield hosts
    finally:
        for host in hosts:
            host.stop()


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback TCP port that refuses connections, for as long as the block runs.

    A socket holds the port bound without listening: the kernel refuses connections to it, and
    no other process (another test worker) can bind it meanwhile, as it could a port found free
    and let go.
    """
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Polls ``condition`` until it holds; fails with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(POLL_S)


def wait_for_text(read: Callable[[], str], text: str, timeout_s: float = 60.0) -> str:
    """What ``read()`` returns once it holds ``text`` (a log; polled, fails after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while text not in (log := read()):
        assert time.monotonic() < deadline, log
        time.sleep(POLL_S)
    return log


def assert_same(actual: Any, expected: Any, path: str = "value") -> None:
    """Exact equality: same types (bool is not int, tuple is not list), dtypes, shapes, values."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} is not {type(expected)}"
    if isinstance(expected, np.ndarray):
        assert actual.dtype.str == expected.dtype.str, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: {actual.shape} != {expected.shape}"
        if expected.dtype == object:
            for index in np.ndindex(expected.shape):
                assert_same(actual[index], expected[index], f"{path}[{index}]")
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=path)
    elif isinstance(expected, np.generic):
        assert actual.dtype.str == expected.dtype.str, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.tobytes() == expected.tobytes(), f"{path}: {actual!r} != {expected!r}"
    elif isinstance(expected, dict):
        assert len(actual) == len(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for (akey, avalue), (ekey, evalue) in zip(actual.items(), expected.items()):
            assert_same(akey, ekey, f"{path} key {ekey!r}")
            assert_same(avalue, evalue, f"{path}[{ekey!r}]")
    elif isinstance(expected, (list, tuple)):  # GraphInstance is a tuple too
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def settings_of(arguments: Sequence[str], environment: Mapping[str, str]) -> dict[str, str]:
    """A command's settings as envserver takes them, by variable name (``ENVSERVER_BIND``).

    Its ``ENVSERVER_*`` variables first, then its ``--flag value`` pairs, which win (a flag's
    variable is :func:`envserver.cli.settings.variable_for`'s).
    """
    settings = {k: v for k, v in environment.items() if k.startswith("ENVSERVER_")}
    for flag, value in zip(arguments, [*arguments[1:], ""]):
        if flag.startswith("--") and not value.startswith("--"):
            settings[variable_for(flag)] = value
    return settings


#: An endpoint in a message.
ENDPOINT = re.compile(r"\b(?:tcp|ipc)://[^\s,;)'\"]+")
#: A local host's socket: messages name it "local host N" (the path only at DEBUG).
LOCAL_SOCKET = re.compile(r"envserver-[^/\s]+/host-\d+\.sock")


def message_faults(message: str) -> list[str]:
    """What is wrong with an error message: an endpoint said twice, a local host's socket."""
    named = [found.rstrip(".:") for found in ENDPOINT.findall(message)]
    faults = [f"names {e} {named.count(e)} times" for e in set(named) if named.count(e) > 1]
    if LOCAL_SOCKET.search(message):
        faults.append("names a local host's socket")
    return faults


class Interrupting(zmq.Socket):
    """A socket whose context may make its recv or send raise ``KeyboardInterrupt``.

    Its context's plan names the frame (counted over the context's DEALERs, from the arming)
    whose recv or send raises, and whether after the frame was taken off the socket (or queued),
    as when pyzmq finds a signal pending right after libzmq's call, or before, as right before.
    """

    counted = False  # a DEALER of an InterruptingContext

    def _step(self, kind: str, act):
        context = self.context
        if not self.counted or context.plan is None or context.plan[0] != kind:
            return act()
        _, n, after = context.plan
        if context.frames == n and not after:
            context.plan = None
            raise KeyboardInterrupt
        result = act()
        context.frames += 1
        if context.frames - 1 == n:
            context.plan = None
            raise KeyboardInterrupt
        return result

    def recv(self, flags=0, copy=True, track=False):
        return self._step("recv", lambda: super(Interrupting, self).recv(flags, copy, track))

    def send(self, data, flags=0, copy=True, track=False, **kwargs):
        return self._step(
            "send", lambda: super(Interrupting, self).send(data, flags, copy, track, **kwargs)
        )


class InterruptingContext(zmq.Context):
    """A context whose DEALER sockets raise where :meth:`arm` says (see :class:`Interrupting`)."""

    plan: tuple[str, int, bool] | None = None
    frames = 0

    def socket(self, socket_type, **kwargs):
        sock = super().socket(socket_type, socket_class=Interrupting, **kwargs)
        sock.counted = socket_type == zmq.DEALER
        return sock

    def arm(self, kind: str, n: int, after: bool) -> None:
        """The ``n``-th frame (from 0) to be received (``kind="recv"``) or sent raises."""
        self.plan, self.frames = (kind, n, after), 0


# ------------------------------------------------------------- processes


def run_envserver(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 120.0
) -> subprocess.CompletedProcess:
    """``python -m envserver ARGS`` with this interpreter, its output captured as text.

    Args:
        *args: The command's arguments.
        env: Its environment (default: this process's).
        timeout_s: How long it may take.
    """
    return subprocess.run(
        [sys.executable, "-m", "envserver", *args],
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_until_gone(pids: list[int]) -> list[int]:
    """Waits up to 30 s for the processes to end; returns those left."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def cmdline(pid: int) -> str:
    """Process ``pid``'s command line, its arguments joined by spaces ("" once gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


# ------------------------------------------------------------- metrics and keys


def metrics_url(host: HostProcess) -> str:
    """Where a host started with ``--metrics-port`` serves its metrics, from its log."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        match = re.search(r"metrics on (http://\S+)", host.log_text())
        if match:
            return match.group(1)
        time.sleep(0.05)
    raise AssertionError(f"the host never said where its metrics are: {host.log_text()}")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, by name and sorted labels."""
    with urllib.request.urlopen(url, timeout=60) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def keygen(directory: Path, name: str) -> tuple[Path, Path]:
    """``envserver keygen DIRECTORY --name NAME``: the public and the secret key file."""
    result = subprocess.run(
        [sys.executable, "-m", "envserver", "keygen", str(directory), "--name", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return directory / f"{name}.key", directory / f"{name}.key_secret"


def channel_messages(envs: Any) -> list[int]:
    """How many replies each host of ``envs`` posted in its channel (-1: it has no channel)."""
    channels = [c.requests.channels for c in envs._hosts.pool.connections]
    return [channel[0].received if channel else -1 for channel in channels]


def channels_messages(envs: Any) -> list[list[int]]:
    """How many replies each host of ``envs`` posted in each of its channels, the first first."""
    return [[c.received for c in h.requests.channels] for h in envs._hosts.pool.connections]
