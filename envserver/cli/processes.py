"""``envserver serve --processes N``: N hosts forked from one parent, which keeps them running.

A machine that serves many hosts (one per core for envs that compute, say) could run as many
``envserver serve`` commands, each a Python interpreter of its own. Forked from one parent that
has imported what a host needs, the hosts share those pages instead: on a small machine that
makes each host's step cheaper (on 2 cores, 16 hosts under ``--processes 16`` spent 149 µs of
CPU per step against 234 µs as 16 separate commands) and the machine's memory goes further.

- **Endpoints**: host ``i`` (from 0) binds ``--bind``'s endpoint with its port plus ``i``
  (``tcp://0.0.0.0:5555`` -> ports 5555, 5556, ...); a ``*`` port stays ``*`` (each host picks
  one and logs it); an ``ipc://PATH`` becomes ``ipc://PATH.i``. ``--metrics-port`` likewise
  counts up (0 stays 0), and a ``--name`` gets ``-i``. Each host logs its own ``serving on``
  line, as ``envserver serve`` does, and marks its log lines ``[host i]``.
- **Supervision**: a host that exits while the parent is not stopping (killed, crashed, run out
  of memory) is forked again after a pause, one second at first and doubled after each exit
  up to :data:`MAX_PAUSE_S`, back to one second once a host served for :data:`STEADY_S`. A host
  that exits with status 2, the status of a host that could not start (an endpoint in use, a
  module that cannot be imported), stops them all: it would only fail again.
- **Stopping**: the parent forwards each stop signal to every host, each kind once: SIGTERM
  stops them gracefully (with ``--drain-grace``, each drains first), SIGINT (Ctrl-C) at once,
  a SIGINT after a SIGTERM too; both cleanly (their envs closed), and the parent exits 0 once
  they are gone. A host that gets a SIGTERM of its own too (Slurm signals every process of a
  job step) drains once. Each host watches the parent: if it is killed, the hosts exit on
  their own (``--parent-pid``), as local hosts do when their trainer dies.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any

from envserver.cli.logs import configure as configure_logs
from envserver.launch.forked import exit_child, reseed

__all__ = ["MAX_PAUSE_S", "STEADY_S", "Supervisor", "host_binds"]

logger = logging.getLogger("envserver.cli")

#: The longest pause before a host that keeps exiting is forked again.
MAX_PAUSE_S = 30.0
#: A host that served this long is steady: its next exit is paused after one second again.
STEADY_S = 60.0
#: How often the parent looks for hosts that exited (and restarts due).
CHECK_S = 0.1
#: The exit status of a host that could not start.
CANNOT_START = 2
#: The signals that stop the parent, and with it every host.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_TCP = re.compile(r"^(tcp://.+):(\d+|\*)$")


def host_binds(bind: str, count: int) -> list[str]:
    """The endpoints of ``count`` hosts made from ``bind`` (see the module docstring).

    Raises:
        ValueError: If the endpoint is neither tcp with a port (or ``*``) nor ipc, or the
            ports would pass 65535.
    """
    if bind.startswith("ipc://"):
        return [f"{bind}.{i}" for i in range(count)]
    match = _TCP.match(bind)
    if match is None:
        raise ValueError(f"--processes needs a tcp://ADDRESS:PORT or ipc:// --bind, got {bind!r}")
    address, port = match.groups()
    if port == "*":
        return [bind] * count
    if int(port) + count - 1 > 65535:
        raise ValueError(f"--bind's port {port} and --processes {count} go past port 65535")
    return [f"{address}:{int(port) + i}" for i in range(count)]


class Supervisor:
    """Forks the hosts of ``envserver serve --processes N`` and keeps them running.

    Args:
        args: ``serve``'s parsed arguments.
        serve: What runs one host in a forked child (``serve``'s own function), given that
            host's arguments; its return value is the child's exit status.
    """

    def __init__(
        self, args: argparse.Namespace, serve: Callable[[argparse.Namespace], int]
    ) -> None:
        self._args = args
        self._serve = serve
        self._binds = host_binds(args.bind, args.processes)
        self._pids: dict[int, int] = {}  # pid -> host index
        self._started: dict[int, float] = {}  # host index -> when it was last forked
        self._pause = dict.fromkeys(range(args.processes), 1.0)
        self._due: dict[int, float] = {}  # host index -> when to fork it again
        self._stopping = False
        self._received: list[signal.Signals] = []  # the stop signals, in order (the handler's)
        self._logged = 0  # how many of them the loop logged
        self._sent: dict[int, set[signal.Signals]] = {}  # pid -> the stop signals sent to it

    def run(self) -> int:
        """Forks the hosts and supervises them until stopped; the exit status."""
        previous = {signum: signal.signal(signum, self._stop) for signum in STOP_SIGNALS}
        status = 0
        try:
            for index in range(len(self._binds)):
                self._fork(index)
            while self._pids or self._due:
                status = self._check() or status
                time.sleep(CHECK_S)
        finally:
            self._forward()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return status

    def _stop(self, signum: int, _frame: Any) -> None:
        # No logging here: a signal that comes while a log line is written makes the write
        # reentrant (the loop logs it, see _check).
        self._received.append(signal.Signals(signum))
        self._stopping = True  # the loop tells the hosts (a host forked meanwhile too)

    def _forward(self) -> None:
        """Sends each host each stop signal the parent received that it was not sent yet.

        SIGTERM when the parent stops on its own (a host could not start, or the loop failed).
        """
        due = dict.fromkeys(self._received or [signal.SIGTERM])
        for pid in self._pids:
            sent = self._sent.setdefault(pid, set())
            for signum in due.keys() - sent:  # (a SIGTERM and a SIGINT: it stops at once)
                with contextlib.suppress(ProcessLookupError):  # exited, not yet reaped
                    os.kill(pid, signum)
            sent.update(due)

    def _log_received(self) -> None:
        """Logs the stop signals received since the last call (a repeated one, once)."""
        while self._logged < len(self._received):
            earlier, signum = self._received[: self._logged], self._received[self._logged]
            self._logged += 1
            if signum not in earlier:
                logger.info("received %s; %s", signum.name, self._stopping_how(signum))
            elif earlier.count(signum) == 1:
                logger.info("received %s again: each host was sent it once", signum.name)

    def _stopping_how(self, signum: signal.Signals) -> str:
        count = len(self._pids)
        if signum == signal.SIGINT:
            return f"stopping {count} hosts at once"
        if self._args.drain_grace_s > 0:
            return f"{count} hosts drain, then stop (SIGINT stops them at once)"
        return f"stopping {count} hosts"

    def _check(self) -> int:
        """Reaps the hosts that exited, stops or forks the others; 2 once one could not start."""
        status = 0
        while self._pids:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            index = self._pids.pop(pid, None)
            self._sent.pop(pid, None)
            if index is not None and self._exited(index, wait_status):
                self._stopping = True
                status = CANNOT_START
        if self._stopping:
            self._log_received()
            self._due.clear()
            self._forward()
            return status
        now = time.monotonic()
        for index, due in list(self._due.items()):
            if now >= due:
                del self._due[index]
                self._fork(index)
        return 0

    def _exited(self, index: int, wait_status: int) -> bool:
        """Notes that host ``index`` exited; whether it could not start (stop them all)."""
        code = os.waitstatus_to_exitcode(wait_status)
        if self._stopping:
            return False
        where = self._binds[index]
        if code == CANNOT_START:
            logger.error("host %d (%s) could not start; stopping the others", index, where)
            return True
        if time.monotonic() - self._started[index] >= STEADY_S:
            self._pause[index] = 1.0
        pause = self._pause[index]
        self._pause[index] = min(2 * pause, MAX_PAUSE_S)
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        logger.warning("host %d (%s) %s; starting it again in %g s", index, where, how, pause)
        self._due[index] = time.monotonic() + pause
        return False

    def _fork(self, index: int) -> None:
        """Forks host ``index``; in the child, serves it and exits."""
        args = self._host_args(index)
        # The child starts with the parent's handlers, which would only note a stop in the
        # child's copy of this object: a host sent SIGTERM then would serve on, and the parent
        # wait for it forever. The stop signals stay blocked until the child has its own.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                self._host(index, args, mask)  # never returns into the parent's code
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self._pids[pid] = index
        self._started[index] = time.monotonic()

    def _host(self, index: int, args: argparse.Namespace, mask: set[signal.Signals]) -> None:
        """Serves host ``index`` in a forked child, then exits with its status."""
        status = 1
        try:
            for signum in STOP_SIGNALS:  # until the host installs its own
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            configure_logs(str(args.log_level), args.log_format, host_index=index)
            reseed()
            status = self._serve(args)
        except BaseException:  # the child's last word, then it exits
            logger.exception("host %d (%s) failed", index, self._binds[index])
        finally:
            exit_child(status)

    def _host_args(self, index: int) -> argparse.Namespace:
        """Host ``index``'s arguments: its endpoint, metrics port and name; the parent's pid."""
        args = copy.copy(self._args)
        args.processes = 1
        args.bind = self._binds[index]
        if args.metrics_port:
            args.metrics_port += index
        if args.name:
            args.name = f"{args.name}-{index}"
        args.parent_pid = os.getpid()
        return args
