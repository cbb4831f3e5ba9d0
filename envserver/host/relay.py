"""What envs say on a host: their warnings and output, caught per command, sent with its reply.

A trainer should hear its envs as it does ``AsyncVectorEnv``'s workers. While the host runs an
env command, :class:`Relay` collects into a :class:`Said`:

- Python warnings (``warnings.showwarning`` is the relay's), each distinct one once per session
  (Python's default: once per location), with the envs that raised it and how often;
- what env code writes to ``sys.stdout`` and ``sys.stderr`` (the relay's streams), line by line,
  with the env that wrote it (:data:`speaker`: the worker says which env runs on each thread);
- what native code writes to file descriptors 1 and 2 (a pipe the relay reads), with no env.

Each command collects what is said on its own threads (:data:`speaker`: the thread that runs it,
and the worker's threads stepping its envs): commands of sessions that overlap run on threads at
once, and each hears its own envs only. Native output cannot tell its thread: it goes to the
command the loop runs while no overlapping request runs beside it, else to the log.

Identical lines of one command are kept once with their envs and count; a command keeps at
most :data:`envserver.wire.said.LIMITS` entries and counts what it cut, so a chatty env costs
bounded memory. The host's own log goes to the original stderr, and carries what the envs said
too (the same bounded part, with a line for what was cut). For a session that does not hear its
envs nothing is collected (no cost per command): what they say goes to the log as it comes,
each distinct warning once. Only ``envserver serve`` installs a relay (it takes over the
process's stdout and stderr); a host without one says nothing.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import io
import logging
import os
import select
import sys
import threading
import warnings
from typing import Any, TextIO

from envserver.wire.said import LIMITS, encode_said

__all__ = ["Relay", "Said", "speaker"]

logger = logging.getLogger("envserver.env")

#: Which env runs on this thread (``speaker.env``: its index in its session's block, or None),
#: and what the command it runs for collects (``speaker.said``: None if that is not heard; not
#: set on a thread of the env's own, which the loop's command hears while it runs alone).
speaker = threading.local()
_UNSET = object()
#: Distinct warnings remembered per session (beyond, new ones are cut, not sent).
MAX_SEEN_WARNINGS = 1024
#: The pipe's capacity: native output that may wait for the reader without blocking the env.
PIPE_BYTES = 1 << 20
#: One read of the pipe, and the most reads in one go (the rest waits for the next).
READ_BYTES, MAX_READS = 65536, 32

WarningKey = tuple[str, str, str, int]


class Said:
    """What the envs said during one command, within the protocol's bounds.

    Args:
        seen: The warnings the session was already sent (updated here).
    """

    def __init__(self, seen: set[WarningKey]) -> None:
        self._seen = seen
        self._lock = threading.Lock()  # envs stepped on threads speak at once
        self._warnings: dict[WarningKey, dict[str, Any]] = {}
        self._lines: dict[str, dict[str, Any]] = {}
        self._partial: dict[int | None, str] = {}
        self.cut = {"warnings": 0, "lines": 0, "bytes": 0}
        #: Whether anything was said (a warning not sent before, or text): most commands say
        #: nothing, and their replies are sent as they are without a look at the rest.
        self.spoke = False

    def warning(self, env: int | None, category: type, message: str, filename: str, line: int):
        """Records a warning raised by ``env`` (None: not in an env call)."""
        name = f"{category.__module__}.{category.__qualname__}"
        key = (name, message[: LIMITS.line_chars], filename, line)
        with self._lock:
            entry = self._warnings.get(key)
            if entry is None:
                if key in self._seen:
                    return  # sent before to this session: once per location, as Python does
                self.spoke = True
                if len(self._warnings) >= LIMITS.warnings or len(self._seen) >= MAX_SEEN_WARNINGS:
                    self.cut["warnings"] += 1
                    return
                self._seen.add(key)
                entry = self._warnings[key] = {
                    "category": name,
                    "message": key[1],
                    "filename": filename,
                    "lineno": line,
                    "envs": set(),
                    "count": 0,
                }
            entry["count"] += 1
            if env is not None:
                entry["envs"].add(env)

    def write(self, env: int | None, text: str) -> None:
        """Records text ``env`` wrote (None: native code, or not in an env call)."""
        with self._lock:
            self.spoke = True
            text = self._partial.pop(env, "") + text
            *lines, rest = text.split("\n")
            for line in lines:
                self._line(env, line)
            if rest:
                if len(rest) > LIMITS.line_chars:  # a line without end: cut it here
                    self._line(env, rest)
                else:
                    self._partial[env] = rest

    def _line(self, env: int | None, text: str) -> None:
        text = text.rstrip("\r")
        if len(text) > LIMITS.line_chars:
            self.cut["bytes"] += len(text) - LIMITS.line_chars
            text = text[: LIMITS.line_chars - 1] + "…"
        entry = self._lines.get(text)
        if entry is None:
            if len(self._lines) >= LIMITS.lines:
                self.cut["lines"] += 1
                self.cut["bytes"] += len(text) + 1
                return
            entry = self._lines[text] = {"text": text, "envs": set(), "count": 0}
        entry["count"] += 1
        if env is not None:
            entry["envs"].add(env)

    def document(self) -> dict[str, Any] | None:
        """The said document (see :mod:`envserver.wire.said`), or None if nothing was said."""
        if not (self._partial or self._warnings or self._lines or any(self.cut.values())):
            return None
        with self._lock:  # each unfinished line becomes a line (or a cut): still not empty
            for env, rest in self._partial.items():
                self._line(env, rest)
            self._partial.clear()
        entries = [*self._warnings.values(), *self._lines.values()]
        for entry in entries:
            entry["envs"] = sorted(entry["envs"])
        return {
            "warnings": list(self._warnings.values()),
            "output": list(self._lines.values()),
            "cut": dict(self.cut),
        }


class _EnvStream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` of a host: env code's text goes to the command's said."""

    def __init__(self, relay: Relay, fallback: TextIO, fd: int) -> None:
        super().__init__()
        self._relay = relay
        self._fallback = fallback
        self._fd = fd

    def write(self, text: str) -> int:
        said = self._relay.of_thread()
        if said is None:
            return self._fallback.write(text)
        said.write(getattr(speaker, "env", None), text)
        return len(text)

    def flush(self) -> None:
        self._fallback.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


class Relay:
    """Collects what the envs say while the host runs a command (see the module's docstring).

    Install it once, in the host's own process, before the host logs anything it means to
    keep; then :meth:`listen` before each env command and :meth:`done` after it.
    """

    def __init__(self) -> None:
        #: What the command the loop runs collects (None between commands).
        self.current: Said | None = None
        #: How many requests run on threads beside the loop's (overlapping sessions).
        self.beside = 0
        self._lock = threading.Lock()  # the pipe's reader and the final drain take turns
        self._pipe: int | None = None
        self._log: TextIO = sys.stderr
        self._logged: set[tuple[str, str, str, int]] = set()  # warnings logged, not sent
        self._pending = select.poll()  # whether the pipe holds output
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def install(self) -> None:
        """Takes over this process's stdout, stderr and warnings display; logs keep stderr."""
        self._log = open(  # noqa: SIM115 - the host's log stream, open while the process lives
            os.dup(2), "w", buffering=1, encoding="utf-8", errors="backslashreplace"
        )
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in (
                sys.stderr,
                sys.__stderr__,
            ):
                handler.setStream(self._log)
        read, write = os.pipe()
        with contextlib.suppress(OSError):  # a smaller pipe only makes writers wait sooner
            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        os.set_blocking(read, False)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self._pipe = read
        self._pending.register(read, select.POLLIN)
        sys.stdout = _EnvStream(self, self._log, 1)
        sys.stderr = _EnvStream(self, self._log, 2)
        warnings.simplefilter("always")  # each session hears each warning once: see Said
        warnings.showwarning = self._show_warning
        threading.Thread(target=self._read_native, name="envserver-output", daemon=True).start()

    def listen(self, seen: set[WarningKey] | None, alone: bool = True) -> Said | None:
        """Starts collecting what the envs say on this thread, until :meth:`done`.

        Args:
            seen: The warnings the session was sent already (updated as more are); None: the
                command's envs are not heard (what they say goes to the log).
            alone: Whether this is the loop's command (else one run on a thread beside it).
        """
        said = None if seen is None else Said(seen)
        speaker.env, speaker.said = None, said
        if alone:
            self.current = said
        else:
            with self._lock:
                self.beside += 1
        return said

    def done(self, alone: bool = True) -> None:
        """Stops collecting on this thread, after reading the native output left in the pipe.

        The loop's command takes it; one beside it leaves it to the log (it cannot be told
        apart), before it stops counting as beside, so that a command the loop runs next never
        gets it.
        """
        try:
            self._drain()  # what it left: its own (alone), else the log's (still beside)
        finally:
            if alone:
                self.current = None
            else:
                with self._lock:
                    self.beside -= 1
            speaker.said = None

    def of_thread(self) -> Said | None:
        """What the command this thread speaks for collects (None: the log's)."""
        said = getattr(speaker, "said", _UNSET)
        if said is _UNSET:  # a thread of the env's own: the loop's command, run alone
            return self.current if not self.beside else None
        return said

    def _show_warning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        said = self.of_thread()
        if said is None:  # a session that does not hear its envs, or between commands
            key = (category.__qualname__, str(message), filename, lineno)
            if key not in self._logged and len(self._logged) < MAX_SEEN_WARNINGS:
                self._logged.add(key)  # once per location, as Python shows warnings
                self._log.write(warnings.formatwarning(message, category, filename, lineno, line))
        else:
            said.warning(getattr(speaker, "env", None), category, str(message), filename, lineno)

    def _read_native(self) -> None:
        """The reader of the pipe behind descriptors 1 and 2 (native code's output)."""
        poller = select.poll()
        poller.register(self._pipe, select.POLLIN)
        while True:
            try:
                poller.poll()
                self._drain()
            except Exception:  # the reader must live: a writer would block on a full pipe
                logger.exception("reading the envs' native output failed")

    def _drain(self) -> None:
        """Reads what the pipe holds: the command's output, or (between commands) the log's."""
        if self._pipe is None:
            return
        with self._lock:  # also waits for what the reader has read to be handed on
            if not self._pending.poll(0):
                return
            chunks = []
            for _ in range(MAX_READS):  # bounded: a writer that never stops must not hold it
                try:
                    chunk = os.read(self._pipe, READ_BYTES)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            text = self._decoder.decode(b"".join(chunks))  # a character split over two reads
            if not text:
                return
            said = self.current if not self.beside else None  # (it cannot tell its thread)
            if said is None:
                self._log.write(text)
            else:
                said.write(None, text)

    def send(self, said: Said, context: dict[str, Any]) -> bytes | None:
        """Logs what ``said`` holds for the host's operator; returns its frame (None: nothing).

        Args:
            said: What the envs said during the command.
            context: Fields of the log records (the session).
        """
        document = said.document()
        if document is None:
            return None
        for entry in document["warnings"]:
            logger.warning(
                "env %s warned: %s: %s (%s:%d)",
                _envs(entry["envs"]),
                entry["category"],
                entry["message"],
                entry["filename"],
                entry["lineno"],
                extra=context,
            )
        for entry in document["output"]:
            logger.info("env %s: %s", _envs(entry["envs"]), entry["text"], extra=context)
        if any(document["cut"].values()):
            logger.info("env output cut: %s", document["cut"], extra=context)
        return encode_said(document)


def _envs(indices: list[int]) -> str:
    return ",".join(map(str, indices)) if indices else "?"
