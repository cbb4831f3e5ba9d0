"""Embedded local env hosts: started by the client when it is given no hosts.

The hosts listen on ``ipc://`` endpoints in a fresh directory only the user can read, accept
pickled factories (nobody else can reach them), and watch their parent process: if the trainer
dies, even by ``kill -9``, they exit on their own within a fraction of a second, each removing
its own socket and log, and the last one out the directory. They run in a session of their own,
so a Ctrl-C in the trainer's terminal reaches the trainer only (it decides whether to stop, and
stops them when it closes its envs).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from envserver.cli.spawn import serve_command, spawn_host
from envserver.errors import HostUnavailableError

__all__ = ["LocalHosts", "default_host_count"]

logger = logging.getLogger(__name__)

#: How long a host gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 10.0


def default_host_count(num_envs: int) -> int:
    """One host per usable CPU core, never more than there are envs."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, num_envs))


class LocalHosts:
    """A set of env-host processes private to this client.

    Args:
        count: How many hosts to start.
        log_level: The hosts' log level.
    """

    def __init__(self, count: int, log_level: str = "WARNING") -> None:
        self.directory = tempfile.mkdtemp(prefix="envserver-")  # mode 0700
        self.endpoints = [f"ipc://{self.directory}/host-{i}.sock" for i in range(count)]
        self.processes: list[subprocess.Popen] = []
        self._logs = [os.path.join(self.directory, f"host-{i}.log") for i in range(count)]
        self._env = dict(os.environ)
        # The hosts see the trainer's import path, as multiprocessing's spawned workers do, so
        # pickled factories that refer to the trainer's modules can be loaded (absolute: the
        # trainer's working directory, '' in sys.path, may not stay the hosts').
        paths = dict.fromkeys(os.path.abspath(p or os.curdir) for p in sys.path)
        self._env["PYTHONPATH"] = os.pathsep.join(paths)
        self._log_level = log_level
        atexit.register(self.close)
        try:
            for index in range(count):
                self.processes.append(self._spawn(index))
        except BaseException:
            self.close()
            raise
        logger.info("started %d local env hosts in %s", count, self.directory)

    def _spawn(self, index: int) -> subprocess.Popen:
        command = serve_command(
            self.endpoints[index],
            allow_pickle=True,
            parent_pid=os.getpid(),
            log_level=self._log_level,
            orphan_cleanup=(self._logs[index], self.endpoints[index][len("ipc://") :]),
        )
        # A session of its own: no terminal signals, the trainer stops its hosts.
        return spawn_host(command, self._logs[index], env=self._env, own_session=True)

    def running(self, index: int) -> bool:
        """Whether host ``index``'s process is still running."""
        return self.processes[index].poll() is None

    def respawn(self, index: int) -> None:
        """Replaces host ``index`` by a new process on the same endpoint (killing a hung one)."""
        old = self.processes[index]
        if old.poll() is None:
            old.kill()
        old.wait()
        self.processes[index] = self._spawn(index)
        logger.warning("respawned local env host %s", self.endpoints[index])

    def liveness(self, index: int, grace_s: float = 0.0) -> None:
        """Raises if host ``index`` has exited (waiting up to ``grace_s`` for it to be reaped).

        Raises:
            HostUnavailableError: Naming the endpoint, the exit status and the host's last log
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
        raise HostUnavailableError(
            f"local env host {self.endpoints[index]} exited with status {status}"
            + (f"; its last log lines:\n{tail}" if tail else "")
        )

    def close(self) -> None:
        """Stops every host (SIGTERM, then SIGKILL after a bound) and removes the directory."""
        atexit.unregister(self.close)
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("local env host %d did not stop; killing it", process.pid)
                process.kill()
                process.wait()
        self.processes = []
        shutil.rmtree(self.directory, ignore_errors=True)
