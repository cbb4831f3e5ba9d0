"""A fork server for embedded local hosts: a new host costs a fork, not an interpreter start.

A trainer starts one fork server on first use (:meth:`ForkServer.shared`): a child process
(:mod:`envserver.cli.forkhost`), in a session of its own, that imports what a host needs
(numpy, Gymnasium, ZeroMQ, envserver) once and then forks a host for every request. It never
forks the trainer, which has threads, and never imports the trainer's ``__main__``. Each host
starts as ``envserver serve`` would, with the environment, working directory and import path
the request gives (the trainer's), its stdin and stdout on ``/dev/null``, its stderr appended to
its log, in a session of its own, its random generators (Python's and numpy's global one)
seeded anew.

The trainer writes requests to the server's stdin and reads replies from a pipe of their own
(the server's stdout is ``/dev/null``: nothing a module prints there can garble a reply), one
JSON object per line, one reply per request::

    {"op": "spawn", "args": [...], "log": path, "env": {...}, "cwd": path | null,
     "path": [...]}                       -> {"pid": int}
    {"op": "poll", "pid": int}            -> {"status": int | null}  (as Popen.returncode)
    {"op": "signal", "pid": int, "signal": int}   -> {"status": ...}  (not sent once exited)
    anything that fails                   -> {"error": str}

Each request also carries ``"seq"``, its number, which its reply gives back: the reply to a
request whose wait was cut short (Ctrl-C) is passed over by the next request, not taken for its.
A server that does not answer in time, or answers garbage, is not asked again: the next host
gets a new one. The server reaps its children as they exit (so a pid it signals is never a
reused one) and exits when the trainer closes the pipe or dies (checked twice a second, for a
trainer whose forked children hold the pipe open). Hosts watch their parent (``--parent-pid``,
the fork server): once it is gone they exit and remove their files, as hosts started by the
trainer do when the trainer is gone. Meanwhile the trainer watches such an orphan by its pid.

Why not :mod:`multiprocessing`'s forkserver: docs/architecture.md, "Local hosts' fork server".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["LOST", "ForkServer", "ForkServerError", "ForkedProcess", "Lines", "write_line"]

logger = logging.getLogger(__name__)

#: How long the trainer waits for the server to start, or to answer a request.
START_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 30.0
#: The status of a host whose fork server is gone, once it has exited (its status is lost).
LOST = -int(signal.SIGKILL)


class ForkServerError(RuntimeError):
    """The fork server could not be started, stopped answering, or refused a request."""


class Lines:
    """JSON objects, one per line, read from a file descriptor with a timeout."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: Whether the writer closed its end (all lines before it were read).
        self.closed = False
        self._buffer = b""

    def read(self, timeout_s: float) -> Any:
        """The next object; None at end of file or after ``timeout_s``.

        Raises:
            ValueError: If the line is not JSON.
        """
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            wait = max(0.0, deadline - time.monotonic())
            if self.closed or not select.select([self.fd], [], [], wait)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            self.closed = not chunk
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


def write_line(fd: int, message: Any) -> None:
    """Writes ``message`` as one JSON line to ``fd``."""
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


class ForkServer:
    """The trainer's handle on its fork server.

    Args:
        env: The server's environment (the hosts get the one sent with each request).

    Raises:
        ForkServerError: If the server did not start.
    """

    _shared: ForkServer | None = None
    _shared_lock = threading.Lock()

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._owner = os.getpid()  # a forked trainer process needs a server of its own
        self._broken = False
        self._sequence = 0  # each request's number, which its reply gives back
        replies, reply_end = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "envserver.cli.forkhost", str(reply_end)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                pass_fds=(reply_end,),
                env=None if env is None else dict(env),
                start_new_session=True,  # no Ctrl-C from the trainer's terminal
            )
        except BaseException:
            os.close(replies)
            raise
        finally:
            os.close(reply_end)
        self._replies = Lines(replies)
        #: The server's process id: the parent of every host it starts.
        self.pid = self.process.pid
        try:
            ready = self._replies.read(START_TIMEOUT_S)
        except ValueError:
            ready = None
        if not isinstance(ready, dict) or ready.get("ready") != self.pid:
            self.close()
            raise ForkServerError(f"the fork server did not start (it said {ready!r})")

    @classmethod
    def shared(cls, env: Mapping[str, str] | None = None) -> ForkServer:
        """This process's fork server, started on first use.

        Started again if it died, stopped answering, or belongs to the process this one was
        forked from.

        Args:
            env: The environment to start it with, if it is started now.
        """
        with cls._shared_lock:
            server = cls._shared
            if server is None or not server.usable():
                server = cls._shared = cls(env)
            return server

    @classmethod
    def _forget_shared(cls) -> None:
        """In a child forked from the trainer: its parent's server (and lock) are not its own."""
        cls._shared = None
        cls._shared_lock = threading.Lock()

    def usable(self) -> bool:
        """Whether this process may send requests to the server and it may answer them."""
        return self._owner == os.getpid() and not self._broken and self.process.poll() is None

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Sends one request and returns its reply.

        Raises:
            ForkServerError: If the server is not this process's, is gone, does not answer in
                time or answers garbage (it is then not asked again), or reports an error.
        """
        if self._owner != os.getpid():
            raise ForkServerError(f"this fork server belongs to process {self._owner}")
        with self._lock:
            if self._broken:
                raise ForkServerError("the fork server stopped answering")
            self._sequence += 1
            number = self._sequence
            try:
                assert self.process.stdin is not None
                write_line(self.process.stdin.fileno(), {**message, "seq": number})
                reply = self._replies.read(REPLY_TIMEOUT_S)
                # The reply to a request whose wait an exception cut (Ctrl-C) comes late: passed.
                while isinstance(reply, dict) and reply.get("seq", number) != number:
                    reply = self._replies.read(REPLY_TIMEOUT_S)
            except (OSError, ValueError) as exc:
                reply = f"{type(exc).__name__}: {exc}"
            if not isinstance(reply, dict):
                self._broken = True  # a late or garbled reply must not answer the next request
                raise ForkServerError(f"the fork server is gone or not answering ({reply!r})")
        if "error" in reply:
            raise ForkServerError(str(reply["error"]))
        return reply

    def spawn(
        self,
        args: Sequence[str],
        log: str,
        env: Mapping[str, str],
        path: Sequence[str],
        cwd: str | None,
    ) -> ForkedProcess:
        """Forks a process that runs ``envserver *args``.

        Args:
            args: The ``envserver`` arguments, e.g. from :func:`envserver.launch.spawn.serve_args`.
            log: The file its stderr is appended to.
            env: Its environment.
            path: Its import path (``sys.path``).
            cwd: Its working directory (None: the server's).

        Returns:
            The process, with :class:`subprocess.Popen`'s methods for watching and stopping it.
        """
        request = {
            "op": "spawn",
            "args": list(args),
            "log": log,
            "env": dict(env),
            "cwd": cwd,
            "path": list(path),
        }
        return ForkedProcess(self, int(self.request(request)["pid"]), list(args))

    def close(self) -> None:
        """Stops the server (its hosts, if any are left, exit on their own)."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        if not self._replies.closed:
            os.close(self._replies.fd)
            self._replies.closed = True
        try:
            self.process.wait(REPLY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


os.register_at_fork(after_in_child=ForkServer._forget_shared)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an orphan watched without its parent)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except ProcessLookupError:
        return False
    except (OSError, IndexError):  # no /proc: kill(pid, 0) succeeded
        return True
    return state not in ("Z", "X")


class ForkedProcess:
    """A process the fork server started, watched and signalled through the server.

    Offers what embedded hosts use of :class:`subprocess.Popen`: ``pid``, ``returncode``,
    :meth:`poll`, :meth:`wait`, :meth:`send_signal` and :meth:`kill`.
    Without its server (gone, or not this process's), the process is an orphan that exits on
    its own: it is watched and signalled by its pid until it is gone, its status then
    :data:`LOST`.
    """

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self.server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status (negative: the signal that ended it), or None while it runs."""
        if self.returncode is None:
            try:
                status = self.server.request({"op": "poll", "pid": self.pid})["status"]
            except ForkServerError:
                status = None if _running(self.pid) else LOST
            self.returncode = None if status is None else int(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Waits for the process to exit, polling the server.

        Raises:
            subprocess.TimeoutExpired: If it still runs after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while (status := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            remaining = 0.05 if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(pause, remaining)))
            pause = min(0.05, pause * 2)
        return status

    def send_signal(self, signum: int) -> None:
        """Sends ``signum`` to the process, unless it is known to have exited.

        One request: the server signals a child only if it has not exited, and answers with
        its status either way.
        """
        if self.returncode is not None:
            return
        try:
            request = {"op": "signal", "pid": self.pid, "signal": int(signum)}
            status = self.server.request(request)["status"]
        except ForkServerError:  # no server: an orphan, signalled by pid while it runs
            if not _running(self.pid):
                self.returncode = LOST
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)
            return
        if status is not None:
            self.returncode = int(status)

    def kill(self) -> None:
        """Sends SIGKILL."""
        self.send_signal(signal.SIGKILL)
