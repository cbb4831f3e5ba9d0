"""The fork server's process: ``python -m envserver.cli.forkhost REPLY_FD``.

Started by :class:`envserver.launch.forkserver.ForkServer` (see there for what it does and the
requests it answers): it imports what a host needs, says it is ready, then forks a host for each
spawn request read from stdin, and answers every request on ``REPLY_FD``.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Any, NoReturn

from envserver.launch.forked import exit_child, reseed
from envserver.launch.forkserver import Lines, write_line

__all__ = ["serve"]

#: What the server imports before it forks anything: all a host needs to serve.
PRELOAD = ("envserver.cli.app", "envserver.host", "gymnasium.envs.classic_control", "cloudpickle")
#: How often the server checks that the trainer is still its parent.
PARENT_CHECK_S = 0.5


class Children:
    """The server's children and their exit statuses, once reaped."""

    def __init__(self) -> None:
        self.statuses: dict[int, int | None] = {}

    def reap(self) -> None:
        """Collects the exit status of every child that exited."""
        for pid, status in self.statuses.items():
            if status is None:
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.statuses[pid] = os.waitstatus_to_exitcode(code)

    def handle(self, request: Any) -> dict[str, Any]:
        """The reply to one request (see the requests in :mod:`envserver.launch.forkserver`)."""
        if not isinstance(request, dict):
            return {"error": "a request is a JSON object"}
        op = request.get("op")
        if op == "spawn":
            _check_spawn(request)
            pid = os.fork()
            if pid == 0:
                _run_child(request)
            self.statuses[pid] = None
            return {"pid": pid}
        if op not in ("poll", "signal"):
            return {"error": f"unknown request {op!r}"}
        pid = request.get("pid")
        if pid not in self.statuses:
            return {"error": f"no child with pid {pid!r}"}
        self.reap()
        if op == "signal" and self.statuses[pid] is None:
            os.kill(pid, int(request["signal"]))
        status = self.statuses[pid]
        if status is not None:  # told once: the trainer keeps it
            del self.statuses[pid]
        return {"status": status}


def _check_spawn(request: dict[str, Any]) -> None:
    """Raises ValueError unless ``request`` holds all a child needs, of the right types."""
    env = request.get("env")
    args, path = request.get("args"), request.get("path")
    strings = isinstance(args, list) and isinstance(path, list) and isinstance(env, dict)
    if not (
        strings
        and all(isinstance(item, str) for item in [*args, *path, *env, *env.values()])
        and isinstance(request.get("log"), str)
        and isinstance(request.get("cwd"), (str, type(None)))
    ):
        raise ValueError("spawn needs args and path (lists of str), log, cwd and env (map)")


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
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the server's pipes, among others
        if request["cwd"] is not None:
            os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        sys.argv = [sys.executable, *request["args"]]
        reseed()
        from envserver.cli.app import main

        status = main(request["args"])
    except SystemExit as exc:
        status = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        exit_child(status)


def serve(reply_fd: int) -> None:
    """The server's loop: preloads, says it is ready, then answers requests until EOF.

    Args:
        reply_fd: Where replies go (requests come on stdin).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    for module in PRELOAD:
        __import__(module)
    requests, children = Lines(0), Children()
    write_line(reply_fd, {"ready": os.getpid()})
    while os.getppid() == parent:
        try:
            request = requests.read(PARENT_CHECK_S)
        except ValueError as exc:
            write_line(reply_fd, {"error": f"unreadable request: {exc}"})
            continue
        if request is None:
            if requests.closed:
                return
            children.reap()
            continue
        try:
            reply = children.handle(request)
        except Exception as exc:  # a request that cannot be served: say why, keep serving
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        if isinstance(request, dict) and "seq" in request:  # which request it answers
            reply = {**reply, "seq": request["seq"]}
        write_line(reply_fd, reply)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
