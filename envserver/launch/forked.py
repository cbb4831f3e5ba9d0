"""What a process forked to serve (not exec'd) does first and last.

Used by the fork server's hosts (:mod:`envserver.cli.forkhost`) and by the hosts of
``envserver serve --processes`` (:mod:`envserver.cli.processes`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

__all__ = ["exit_child", "reseed"]


def reseed() -> None:
    """Seeds numpy's global generator anew (Python's own is reseeded on fork; numpy's is not)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def exit_child(status: int) -> NoReturn:
    """Flushes stdout and stderr, then exits at once.

    A forked child never returns into its parent's code, nor runs the parent's ``atexit``
    handlers.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # nothing left to tell it to
            stream.flush()
    os._exit(status)
