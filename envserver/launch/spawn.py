"""Starting an env host as a child process: the one place that builds its command line.

Both the client's embedded local hosts and :func:`envserver.testing.start_host` start hosts
through here, so the ``python -m envserver serve ...`` line is written once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SERVING_ON", "serve_args", "serve_command", "spawn_host"]

#: The line a host logs once it serves, its endpoint in group 1 (a plain line or a JSON one).
SERVING_ON = re.compile(r"serving on ([^\s\"]+)")


def serve_args(
    bind: str,
    *,
    allow_pickle: bool = False,
    parent_pid: int | None = None,
    log_level: str | None = None,
    orphan_cleanup: Sequence[str] = (),
    channel_spin_s: float = 0.0,
    extra: Sequence[str] = (),
) -> list[str]:
    """The arguments of ``envserver serve``, from ``serve`` on.

    Args:
        bind: The endpoint the host binds.
        allow_pickle: Accept cloudpickled env factories (``--allow-pickle``).
        parent_pid: Exit when this process is no longer the host's parent (embedded hosts).
        log_level: The host's log level (default: the command's own default).
        orphan_cleanup: Files the host removes if it outlives its parent (embedded hosts).
        channel_spin_s: How long it watches its channels before a wait blocks
            (``--channel-spin``; 0: the host's default).
        extra: More ``serve`` arguments, e.g. ``("--env", "CartPole-*")``.
    """
    args = ["serve", "--bind", bind]
    if allow_pickle:
        args.append("--allow-pickle")
    if parent_pid is not None:
        args += ["--parent-pid", str(parent_pid)]
    if log_level is not None:
        args += ["--log-level", log_level]
    for path in orphan_cleanup:
        args += ["--orphan-cleanup", path]
    if channel_spin_s:
        args += ["--channel-spin", repr(channel_spin_s)]
    return [*args, *extra]


def serve_command(bind: str, *, prefix: Sequence[str] = (), **options: Any) -> list[str]:
    """The command line of ``python -m envserver serve`` with this interpreter.

    Args:
        bind: The endpoint the host binds.
        prefix: A command that runs the host, e.g. ``("ip", "netns", "exec", "ns1")``.
        **options: The options of :func:`serve_args`.

    Returns:
        The arguments, ready for :class:`subprocess.Popen`.
    """
    return [*prefix, sys.executable, "-m", "envserver", *serve_args(bind, **options)]


def spawn_host(
    command: Sequence[str],
    log: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    own_session: bool = False,
) -> subprocess.Popen:
    """Starts a host with no stdin or stdout, its stderr appended to ``log``.

    Args:
        command: The command line, usually from :func:`serve_command`.
        log: The file the host's log lines go to (created if missing, appended to).
        env: The host's environment (default: this process's).
        own_session: Start the host in a session (and process group) of its own, so that
            signals from this process's terminal (Ctrl-C) do not reach it.

    Returns:
        The host's process.
    """
    with open(Path(log), "ab") as stderr:
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=None if env is None else dict(env),
            start_new_session=own_session,
        )
