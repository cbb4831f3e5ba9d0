"""Embedded local env hosts: started by the client when it is given no hosts.

The hosts listen on ``ipc://`` endpoints in a fresh directory only the user can read, accept
pickled factories (nobody else can reach them), and watch their parent process: if the trainer
dies, even by ``kill -9``, they exit on their own within a fraction of a second, each removing
its own socket and log, and the last one out the directory. They run in a session of their own,
so a Ctrl-C in the trainer's terminal reaches the trainer only (it decides whether to stop, and
stops them when it closes its envs).

Where the system can fork, hosts are forked by the trainer's fork server
(:mod:`envserver.launch.forkserver`), which has imported what a host needs once: a host then costs
a fork, not an interpreter start. Their parent is the fork server, which exits with the trainer.
Elsewhere (or with ``ENVSERVER_LOCAL_START=spawn``) each host is a ``python -m envserver serve``
of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

from envserver.errors import HostUnavailableError
from envserver.launch.forkserver import ForkedProcess, ForkServer, ForkServerError
from envserver.launch.spawn import serve_args, serve_command, spawn_host
from envserver.wire.slab import sweep_orphans

__all__ = ["LocalHosts", "default_host_count"]

logger = logging.getLogger(__name__)

#: How long a host gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 10.0
#: How long a new host gets to bind its socket.
START_TIMEOUT_S = 60.0
#: How hosts are started: ``"forkserver"`` where the system can fork, else ``"spawn"``.
START_METHODS = ("forkserver", "spawn")
#: The environment variable that chooses the start method.
START_METHOD_VARIABLE = "ENVSERVER_LOCAL_START"

#: A host's process: a child of the trainer (spawned) or of its fork server.
Process = subprocess.Popen | ForkedProcess


#: How long a local host watches its channels for the trainer's next request before its wait
#: blocks, when it and the trainer each have a core (see ``envserver.wire.channel``): a 1-env
#: round trip's order. Short: the trainer's own work between steps (its policy) may want the
#: core, and a host watching for longer than the trainer takes would take it.
CHANNEL_SPIN_S = 0.0001
#: How long the trainer watches a channel for its host's reply before its wait blocks (the
#: same layouts). Longer: the trainer has nothing else to do while it waits for a step, and a
#: host that steps many cheap envs takes longer than a round trip (16 CartPoles on one host:
#: about 150 µs), so a shorter watch would miss every reply and wake from a sleep each step.
REPLY_SPIN_S = 0.001


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_host_count(num_envs: int) -> int:
    """One host per usable CPU core, never more than there are envs."""
    return max(1, min(usable_cores(), num_envs))


class LocalHosts:
    """A set of env-host processes private to this client.

    Args:
        count: How many hosts to start.
        log_level: The hosts' log level.
        start_method: ``"forkserver"`` or ``"spawn"``; default: the environment variable
            ``ENVSERVER_LOCAL_START`` if set, else the first where the system can fork.
    """

    def __init__(
        self, count: int, log_level: str = "WARNING", start_method: str | None = None
    ) -> None:
        if start_method is None:
            fits = "forkserver" if hasattr(os, "fork") else "spawn"
            start_method = os.environ.get(START_METHOD_VARIABLE) or fits
        if start_method not in START_METHODS:
            raise ValueError(
                f"local hosts' start method must be one of {START_METHODS} (argument or "
                f"{START_METHOD_VARIABLE}), got {start_method!r}"
            )
        self.start_method = start_method
        spins = count + 1 <= usable_cores()  # a spinning wait beside a busy process slows both
        #: How long the hosts watch their channels for a request before a wait blocks.
        self.channel_spin_s = CHANNEL_SPIN_S if spins else 0.0
        #: How long the trainer watches a host's channel for its reply before a wait blocks.
        self.reply_spin_s = REPLY_SPIN_S if spins else 0.0
        self.directory = tempfile.mkdtemp(prefix="envserver-")  # mode 0700
        self._sockets = [os.path.join(self.directory, f"host-{i}.sock") for i in range(count)]
        self.endpoints = [f"ipc://{path}" for path in self._sockets]
        self.processes: list[Process] = []
        self._logs = [os.path.join(self.directory, f"host-{i}.log") for i in range(count)]
        self._env = dict(os.environ)
        # The hosts see the trainer's import path, as multiprocessing's spawned workers do, so
        # pickled factories that refer to the trainer's modules can be loaded (absolute: the
        # trainer's working directory, '' in sys.path, may not stay the hosts').
        self._path = list(dict.fromkeys(os.path.abspath(p or os.curdir) for p in sys.path))
        self._env["PYTHONPATH"] = os.pathsep.join(self._path)
        self._log_level = log_level
        self._owner = os.getpid()
        try:
            self._cwd: str | None = os.getcwd()
        except FileNotFoundError:  # removed: the hosts start in the fork server's
            self._cwd = None
        atexit.register(self.close)
        sweep_orphans()  # slab names of trainers killed between making one and its MAKE
        try:
            for index in range(count):
                self.processes.append(self._spawn(index))
            for index in range(count):
                self._wait_bound(index)
        except BaseException:
            self.close()
            raise
        logger.info("started %d local env hosts in %s", count, self.directory)

    def _spawn(self, index: int) -> Process:
        self._ensure_directory()
        options = {
            "allow_pickle": True,
            "log_level": self._log_level,
            "orphan_cleanup": (self._logs[index], self._sockets[index]),
            "channel_spin_s": self.channel_spin_s,
        }
        if self.start_method == "forkserver":
            try:
                server = ForkServer.shared(self._env)
            except (ForkServerError, OSError) as exc:
                logger.warning("no fork server (%s): starting hosts as new interpreters", exc)
                self.start_method = "spawn"
            else:
                args = serve_args(self.endpoints[index], parent_pid=server.pid, **options)
                return server.spawn(args, self._logs[index], self._env, self._path, self._cwd)
        command = serve_command(self.endpoints[index], parent_pid=os.getpid(), **options)
        # A session of its own: no terminal signals, the trainer stops its hosts.
        return spawn_host(command, self._logs[index], env=self._env, own_session=True)

    def _ensure_directory(self) -> None:
        """Makes the hosts' directory again if the last host out removed it.

        That happens when hosts are respawned after their fork server died. A directory that
        someone else made in the meantime is refused.
        """
        if os.path.isdir(self.directory):
            return
        os.mkdir(self.directory, 0o700)  # FileExistsError if someone was quicker
        info = os.stat(self.directory)
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) != 0o700:
            raise HostUnavailableError(f"{self.directory} is not private; not starting hosts in it")

    def _wait_bound(self, index: int) -> None:
        """Waits until host ``index`` has bound its socket, so that the first connect succeeds.

        Raises:
            HostUnavailableError: If the host exits or does not bind in time.
        """
        deadline = time.monotonic() + START_TIMEOUT_S
        pause = 0.0005
        while not os.path.exists(self._sockets[index]):
            self.liveness(index)
            if time.monotonic() > deadline:
                raise HostUnavailableError(
                    f"local host {index} did not bind in {START_TIMEOUT_S} s"
                )
            time.sleep(pause)
            pause = min(0.02, pause * 2)

    def running(self, index: int) -> bool:
        """Whether host ``index``'s process is still running."""
        return self.processes[index].poll() is None

    def respawn(self, index: int) -> None:
        """Replaces host ``index`` by a new process on the same endpoint (killing a hung one)."""
        old = self.processes[index]
        if old.poll() is None:
            old.kill()
        old.wait()
        with contextlib.suppress(FileNotFoundError):  # left by a killed host: not a bound one
            os.unlink(self._sockets[index])
        self.processes[index] = self._spawn(index)
        self._wait_bound(index)
        logger.warning("respawned local host %d", index)

    def replacements(self, index: int, endpoint: str, fresh: bool) -> list[str]:
        """Host ``index`` anew on its own endpoint (see :class:`envserver.launch.Launcher`).

        On the first try of a recovery (``fresh``) the process is replaced even if it runs (it
        may be frozen); on later tries only if it exited.
        """
        if fresh or not self.running(index):
            self.respawn(index)
        return [endpoint]

    def liveness(self, index: int, grace_s: float = 0.0) -> None:
        """Raises if host ``index`` has exited (waiting up to ``grace_s`` for it to be reaped).

        Raises:
            HostUnavailableError: Naming the host, the exit status and the host's last log
                lines.
        """
        process = self.processes[index]
        try:
            status = process.wait(grace_s) if grace_s else process.poll()
        except subprocess.TimeoutExpired:
            status = None
        if status is None:
            return
        try:
            with open(self._logs[index], "rb") as log:
                tail = log.read()[-2000:].decode(errors="replace").strip()
        except OSError:
            tail = ""
        tail = tail.replace(self.endpoints[index], f"local host {index}")  # its socket: DEBUG
        raise HostUnavailableError(
            f"local host {index} exited with status {status}"
            + (f"; its last log lines:\n{tail}" if tail else "")
        )

    def close(self) -> None:
        """Stops every host (SIGTERM, then SIGKILL after a bound) and removes the directory.

        In a process forked from the one that started them, does nothing: they are not its.
        """
        atexit.unregister(self.close)
        if os.getpid() != self._owner:
            return
        _stop(self.processes)
        self.processes = []
        shutil.rmtree(self.directory, ignore_errors=True)


def _stop(processes: list[Process]) -> None:
    """SIGTERM to each process, then SIGKILL to those still running after STOP_TIMEOUT_S."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("local env host %d did not stop; killing it", process.pid)
            process.kill()
            process.wait()
