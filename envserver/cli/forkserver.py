"""A fork server for embedded local hosts: a new host costs a fork, not an interpreter start.

A trainer starts one fork server on first use (:meth:`ForkServer.shared`): a child process,
in a session of its own, that imports what a host needs (numpy, Gymnasium, ZeroMQ, envserver)
once and then forks a host for every request. It never forks the trainer, which has threads,
and never imports the trainer's ``__main__``. Each host starts as ``envserver serve`` would,
with the trainer's environment, working directory and import path as they are at that moment
(sent with the request), its stdin and stdout on ``/dev/null``, its stderr appended to its log,
in a session of its own.

The trainer talks to the server over the server's stdin and stdout, one JSON object per line,
one reply per request::

    {"op": "spawn", "args": [...], "log": path, "env": {...}, "cwd": path, "path": [...]}
        -> {"pid": int}
    {"op": "poll", "pid": int}            -> {"status": int | null}  (as Popen.returncode)
    {"op": "signal", "pid": int, "signal": int}   -> {"status": ...}  (not sent once exited)
    anything that fails                   -> {"error": str}

The server reaps its children as they exit (so a pid it signals is never a reused one) and
exits when the trainer closes the pipe or dies (checked twice a second, for a trainer whose
forked children hold the pipe open). Hosts watch their parent (``--parent-pid``, the fork
server): once it is gone they exit and remove their files, as hosts started by the trainer do
when the trainer is gone.
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
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

__all__ = ["ForkServer", "ForkServerError", "ForkedProcess"]

logger = logging.getLogger(__name__)

#: What the server imports before it forks anything: all a host needs to serve.
PRELOAD = ("envserver.cli.app", "gymnasium.envs.classic_control", "cloudpickle")
#: How long the trainer waits for the server to start, or to answer a request.
START_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 30.0
#: How often the server checks that the trainer is still its parent.
PARENT_CHECK_S = 0.5
#: The status of a host whose fork server is gone (it exits on its own; its status is lost).
LOST = -int(signal.SIGKILL)


class ForkServerError(RuntimeError):
    """The fork server could not be started, or stopped answering."""


class _Lines:
    """JSON objects, one per line, read from a file descriptor with a timeout."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: Whether the writer closed its end (all lines before it were read).
        self.closed = False
        self._buffer = b""

    def read(self, timeout_s: float | None) -> Any:
        """The next object; None at end of file or after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self.closed or not select.select([self.fd], [], [], wait)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            self.closed = not chunk
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


def _write(fd: int, message: Any) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


# ----------------------------------------------------------------------- the trainer's side


class ForkServer:
    """The trainer's handle on its fork server.

    Args:
        env: The server's environment (the hosts get the one sent with each request).
    """

    _shared: ForkServer | None = None
    _shared_lock = threading.Lock()

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "envserver.cli.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=None if env is None else dict(env),
            start_new_session=True,  # no Ctrl-C from the trainer's terminal
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._replies = _Lines(self.process.stdout.fileno())
        ready = self._replies.read(START_TIMEOUT_S)
        if not isinstance(ready, dict) or "ready" not in ready:
            self.close()
            raise ForkServerError(f"the fork server did not start: {ready!r}")
        #: The server's process id: the parent of every host it starts.
        self.pid = self.process.pid
        self._owner = os.getpid()  # a forked trainer process needs a server of its own

    @classmethod
    def shared(cls, env: Mapping[str, str] | None = None) -> ForkServer:
        """This process's fork server, started on first use (again if it died, or after a fork).

        Args:
            env: The environment to start it with, if it is started now.
        """
        with cls._shared_lock:
            server = cls._shared
            if server is None or server._owner != os.getpid() or not server.alive():
                server = cls._shared = cls(env)
            return server

    def alive(self) -> bool:
        """Whether the server process still runs (and was started by this process)."""
        return self.process.poll() is None

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Sends one request and returns its reply.

        Raises:
            ForkServerError: If the server is gone, does not answer, or reports an error.
        """
        with self._lock:
            try:
                assert self.process.stdin is not None
                _write(self.process.stdin.fileno(), message)
            except OSError as exc:
                raise ForkServerError(f"the fork server is gone: {exc}") from exc
            reply = self._replies.read(REPLY_TIMEOUT_S)
        if not isinstance(reply, dict):
            raise ForkServerError("the fork server is gone (no reply)")
        if "error" in reply:
            raise ForkServerError(str(reply["error"]))
        return reply

    def spawn(
        self,
        args: Sequence[str],
        log: str,
        env: Mapping[str, str],
        path: Sequence[str],
    ) -> ForkedProcess:
        """Forks a process that runs ``envserver *args``.

        Args:
            args: The ``envserver`` arguments, e.g. from :func:`envserver.cli.spawn.serve_args`.
            log: The file its stderr is appended to.
            env: Its environment.
            path: Its import path (``sys.path``).

        Returns:
            The process, with :class:`subprocess.Popen`'s methods for watching and stopping it.
        """
        request = {
            "op": "spawn",
            "args": list(args),
            "log": log,
            "env": dict(env),
            "cwd": os.getcwd(),
            "path": list(path),
        }
        return ForkedProcess(self, int(self.request(request)["pid"]), list(args))

    def close(self) -> None:
        """Stops the server (its hosts, if any are left, exit on their own)."""
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        try:
            self.process.wait(REPLY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedProcess:
    """A process the fork server started, watched and signalled through the server.

    Offers what embedded hosts use of :class:`subprocess.Popen`: ``pid``, ``returncode``,
    :meth:`poll`, :meth:`wait`, :meth:`send_signal`, :meth:`terminate` and :meth:`kill`.
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
                status = LOST  # without its server, the host exits on its own
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
        """Sends ``signum`` to the process, if it has not been reaped yet."""
        if self.returncode is None:
            try:
                self.server.request({"op": "signal", "pid": self.pid, "signal": int(signum)})
            except ForkServerError:
                logger.debug("no fork server to signal host %d", self.pid)

    def terminate(self) -> None:
        """Sends SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Sends SIGKILL."""
        self.send_signal(signal.SIGKILL)


# ----------------------------------------------------------------------- the server's side


def _exit_status(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class _Server:
    """The fork server's state: its children and their exit statuses, once reaped."""

    def __init__(self) -> None:
        self.children: dict[int, int | None] = {}

    def reap(self) -> None:
        """Collects the exit status of every child that exited."""
        for pid, status in self.children.items():
            if status is None:
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.children[pid] = _exit_status(code)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "spawn":
            _check_spawn(request)
            pid = os.fork()
            if pid == 0:
                _run_child(request)
            self.children[pid] = None
            return {"pid": pid}
        if op not in ("poll", "signal"):
            return {"error": f"unknown request {op!r}"}
        pid = request.get("pid")
        if pid not in self.children:
            return {"error": f"no child with pid {pid!r}"}
        self.reap()
        if op == "signal" and self.children[pid] is None:
            os.kill(pid, int(request["signal"]))
        return {"status": self.children[pid]}


def _check_spawn(request: dict[str, Any]) -> None:
    """Raises ValueError unless ``request`` holds all a child needs, of the right types."""
    strings = (
        isinstance(request.get("args"), list)
        and isinstance(request.get("path"), list)
        and all(isinstance(item, str) for item in [*request["args"], *request["path"]])
    )
    env = request.get("env")
    if not (
        strings
        and isinstance(request.get("log"), str)
        and isinstance(request.get("cwd"), str)
        and isinstance(env, dict)
        and all(isinstance(item, str) for item in [*env, *env.values()])
    ):
        raise ValueError("spawn needs args and path (lists of str), log and cwd (str), env (map)")


def _run_child(request: dict[str, Any]) -> NoReturn:
    """In a forked child: becomes ``envserver *args`` as the request describes, then exits."""
    status = 1
    try:
        os.setsid()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(log, 2)
        os.closerange(3, 65536)  # the server's pipes, among others
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        sys.argv = [sys.executable, *request["args"]]
        from envserver.cli.app import main

        status = main(request["args"])
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # nothing left to tell it to
                stream.flush()
        os._exit(status)


def serve() -> None:
    """The fork server's loop: preloads, says it is ready, then serves requests until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    for module in PRELOAD:
        __import__(module)
    requests, replies = _Lines(0), 1
    server = _Server()
    _write(replies, {"ready": os.getpid()})
    while os.getppid() == parent:
        try:
            request = requests.read(PARENT_CHECK_S)
        except (OSError, ValueError) as exc:
            _write(replies, {"error": f"unreadable request: {exc}"})
            continue
        if request is None:
            if requests.closed:
                return
            server.reap()
            continue
        try:
            reply = server.handle(request) if isinstance(request, dict) else {"error": "not a map"}
        except Exception as exc:  # a request that cannot be served: say why, keep serving
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _write(replies, reply)


if __name__ == "__main__":
    serve()
