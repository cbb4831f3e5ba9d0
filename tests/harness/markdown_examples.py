"""Runs the Python and shell examples of Markdown pages, so that the docs cannot rot.

``tests/system/test_docs_examples.py`` runs README.md and every ``docs/**/*.md`` page this way,
one pytest item per page. Run by hand::

    python tests/harness/markdown_examples.py                # what each page runs, counted
    python tests/harness/markdown_examples.py --run README.md docs/guides/dns.md

What is an example
    A fenced block (backticks or tildes, indented or not) whose info string starts with
    ``python`` or ``py`` (exec'd) or with ``sh``, ``bash`` or ``shell`` (run by
    ``bash -euo pipefail -c``). Any other language (text, yaml, console, ...) and a bare fence
    are not examples. A block whose info string holds ``title="NAME"`` (MkDocs Material's) is
    written to NAME in the page's working directory before any block runs, and not run.

Directives: HTML comments, one a line, invisible on the site
    ``<!-- test: skip REASON -->``
        On the line(s) right before a block (blank lines between allowed): the block is not
        run (nor written); pytest lists it as a skipped test, with REASON.
    ``<!-- test: background -->``
        Right before a shell block: it is started in a process group (and session) of its own
        and left running while the page's later blocks run; at the page's end it gets SIGINT,
        then SIGTERM and SIGKILL after a grace. If it exited with a non-zero status before the
        end, the page fails. Its output is shown whenever the page fails.
    ``<!-- test: cluster -->``
        Right before a shell block that needs Docker: ``make test`` lists it as skipped (see
        ``CLUSTER_REASON``); ``make test-cluster`` runs the page with it, in a copy of the
        repository (``run_page(..., cluster=True, work_from=...)``).
    ``<!-- test: replace OLD NEW -->``
        Anywhere, repeatable: before the page runs, OLD becomes NEW in every block, directive
        by directive. A token holds no spaces, or is double-quoted (``\\"`` for a quote). NEW's
        ``{port}`` and ``{port+N}`` (N below 32) are one base port, chosen for each run of the
        page, such that base...base+31 are free on every local address.
    ``<!-- test: timeout SECONDS -->``
        Anywhere, once: the page's bound (120 s without it).

A directive that is malformed, unknown, not right before a block it applies to, or a ``replace``
whose OLD is in no block, makes the page's test fail saying so: a typo cannot turn a check off.

How a page runs
    ``run_page`` (in the test process) applies the replacements and starts this file as the
    page's *reaper*, in a session of its own; the reaper starts it again as the *runner*, the
    one interpreter that runs every block of the page, in order, in a fresh working directory:
    Python blocks exec'd in one namespace (a ``__main__`` module of their own), compiled with the
    page's path as file name and their lines where they are in the page, so a traceback points
    at the page's line; shell blocks by bash. The environment: the interpreter's directory first
    on ``PATH`` (``envserver`` and ``python`` are this venv's), no ``ENVSERVER_*`` variable,
    ``PYTHONPATH`` starting with the working directory (titled files import) and without this
    repository (the examples run on the installed package), ``MPLBACKEND=Agg``.

    The reaper bounds the page and makes sure nothing outlives it. It is a child subreaper
    (Linux's ``PR_SET_CHILD_SUBREAPER``): a process of the page whose parent dies, a host that
    forked or put itself in a session of its own included, is adopted by the reaper rather than
    by init, so that every process the page started is found among the reaper's descendants.
    At the timeout it sends SIGINT to the runner's process group (a Python block gets a
    ``KeyboardInterrupt``: its traceback says where the page hung); once the runner has
    stopped its background blocks and exited, whatever still runs is reported and killed.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import ctypes
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ports import free_ports

#: The repository (this file is tests/harness/markdown_examples.py).
ROOT = Path(__file__).resolve().parents[2]
#: A page's bound without a ``timeout`` directive.
DEFAULT_TIMEOUT_S = 120.0
#: How many ports from the base that ``{port}`` stands for are free: ``{port+31}`` at most.
PORT_SPAN = 32
#: After the timeout's SIGINT, how long the runner has to stop its blocks and report.
INTERRUPT_GRACE_S = 20.0
#: After the runner exited, how long the page's other processes have to end on their own.
LEFTOVER_GRACE_S = 15.0
#: At the page's end, a background block's grace after SIGINT, then after SIGTERM.
BACKGROUND_GRACES_S = ((signal.SIGINT, 8.0), (signal.SIGTERM, 4.0), (signal.SIGKILL, 4.0))
#: How long run_page waits for the reaper beyond the page's timeout before killing it all.
REAPER_MARGIN_S = INTERRUPT_GRACE_S + LEFTOVER_GRACE_S + 20.0
#: The lines of output a failure shows (the page's, and each background block's).
TAIL_LINES = 60
POLL_S = 0.05

PYTHON = "python"
SHELL = "shell"
#: Why make test does not run a block marked ``cluster``.
CLUSTER_REASON = "needs Docker: make test-cluster runs it (tests/cluster/test_docs_cluster.py)"
#: Info-string languages that are examples, by what runs them.
LANGUAGES = {"python": PYTHON, "py": PYTHON, "sh": SHELL, "bash": SHELL, "shell": SHELL}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*test:(?P<body>.*?)-->\s*$")
_DIRECTIVE_START = re.compile(r"^\s*<!--\s*test\b")
_TOKEN = re.compile(r'"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s"]+)')
_TITLE = re.compile(r"""(?:^|\s)title=(?:"(?P<double>[^"]*)"|'(?P<single>[^']*)')""")
_PORT = re.compile(r"\{port(?:\+(?P<offset>\d+))?\}")
_PORT_LIKE = re.compile(r"\{\s*port[^}]*\}")


class PageError(Exception):
    """A page's examples cannot run as written: a directive or a fence is wrong.

    Args:
        name: The page, relative to the repository.
        message: What is wrong, starting with ``page:line``.
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced block that is run, written or skipped.

    Attributes:
        page: The page, relative to the repository (``docs/guides/dns.md``).
        line: The opening fence's line, from 1; the code starts on the next.
        language: ``PYTHON`` or ``SHELL``; for a titled block of another language, its own.
        code: The block's text, without the fence's indentation.
        title: Where a titled block is written, relative to the working directory.
        background: Whether it runs in the background (a shell block).
        skip: Why it is not run, if it is not.
        cluster: Whether only the cluster test runs it (a shell block that needs Docker).
    """

    page: str
    line: int
    language: str
    code: str
    title: str | None = None
    background: bool = False
    skip: str | None = None
    cluster: bool = False

    @property
    def where(self) -> str:
        """``page:line``, the block's pytest id when it is skipped."""
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether the block is run (not written, not skipped), by one test or the other."""
        return self.skip is None and self.title is None

    @property
    def not_run_because(self) -> str | None:
        """Why ``make test`` does not run the block: its ``skip`` reason, or the cluster's."""
        return self.skip or (CLUSTER_REASON if self.cluster else None)


@dataclasses.dataclass(frozen=True)
class Page:
    """A Markdown page's examples and directives.

    Attributes:
        path: The page's file.
        name: The page relative to the repository, its pytest id.
        blocks: Its blocks that are run, written or skipped, in page order.
        replacements: The ``replace`` directives' (OLD, NEW) pairs, in page order.
        timeout_s: The page's bound.
    """

    path: Path
    name: str
    blocks: tuple[Block, ...]
    replacements: tuple[tuple[str, str], ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def runnable(self) -> list[Block]:
        """The blocks that ``make test`` runs, in order."""
        return [block for block in self.blocks if block.runs and not block.cluster]

    @property
    def runnable_in_cluster(self) -> list[Block]:
        """The blocks the cluster test runs (any, if one is marked ``cluster``), in order."""
        if not any(block.cluster for block in self.blocks):
            return []
        return [block for block in self.blocks if block.runs]

    @property
    def files(self) -> list[Block]:
        """The titled blocks written before the page runs."""
        return [block for block in self.blocks if block.title is not None and block.skip is None]

    @property
    def skipped(self) -> list[Block]:
        """The blocks ``make test`` does not run: a ``skip`` directive's, and ``cluster`` ones."""
        return [block for block in self.blocks if block.not_run_because is not None]

    @property
    def uses_port(self) -> bool:
        """Whether a replacement asks for ``{port}``."""
        return any(_PORT.search(new) for _, new in self.replacements)


# ------------------------------------------------------------------------------------ parsing


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every ``docs/**/*.md`` under ``root``, the docs sorted by path."""
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    docs = root / "docs"
    return found + sorted(docs.rglob("*.md"), key=lambda p: p.relative_to(root).as_posix())


def collect(root: Path = ROOT) -> list[Page | PageError]:
    """Every page of :func:`pages`, parsed; a page that cannot be, as its error."""
    collected: list[Page | PageError] = []
    for path in pages(root):
        try:
            collected.append(parse_page(path, root))
        except PageError as error:
            collected.append(error)
    return collected


def parse_page(path: Path, root: Path = ROOT) -> Page:
    """The examples and directives of the Markdown page at ``path``.

    Raises:
        PageError: If a directive or a fence is wrong (see the module's docstring).
    """
    name = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    replacements: list[tuple[int, str, str]] = []
    timeouts: list[tuple[int, float]] = []
    pending: list[tuple[int, str, str]] = []  # skip and background, for the next block
    index = 0
    while index < len(lines):
        number, text = index + 1, lines[index]
        index += 1
        fence = _opening_fence(text)
        if fence is not None:
            indent, marker, info = fence
            body, index = _fence_body(name, lines, index, number, indent, marker)
            block = _block(name, number, info, body, pending)
            if block is not None:
                blocks.append(block)
            pending = []
            continue
        directive = _directive(name, number, text)
        if directive is None:
            if text.strip() and pending:
                line, verb, _ = pending[0]
                raise PageError(name, f"{name}:{line}: `{verb}` is not right before a code block")
            continue
        verb, argument = directive
        if verb in ("skip", "background", "cluster"):
            pending.append((number, verb, argument))
        elif verb == "replace":
            replacements.append((number, *_replacement(name, number, argument)))
        else:  # timeout (_directive knows no other verbs)
            timeouts.append((number, _timeout(name, number, argument)))
    if pending:
        raise PageError(name, f"{name}:{pending[0][0]}: `{pending[0][1]}` is before no code block")
    if len(timeouts) > 1:
        raise PageError(name, f"{name}:{timeouts[1][0]}: a second `timeout` directive")
    _check_replacements(name, blocks, replacements)
    return Page(
        path=path,
        name=name,
        blocks=tuple(blocks),
        replacements=tuple((old, new) for _, old, new in replacements),
        timeout_s=timeouts[0][1] if timeouts else DEFAULT_TIMEOUT_S,
    )


def _opening_fence(text: str) -> tuple[str, str, str] | None:
    """The indentation, fence and info string of an opening fence, or None."""
    match = _FENCE.match(text)
    if match is None or (match["fence"][0] == "`" and "`" in match["info"]):
        return None  # a backtick fence's info string holds no backtick (CommonMark)
    return match["indent"], match["fence"], match["info"].strip()


def _fence_body(
    name: str, lines: list[str], index: int, number: int, indent: str, marker: str
) -> tuple[list[str], int]:
    """A fenced block's lines (the fence's indentation taken off) and the index after it."""
    closing = re.compile(rf"^[ \t]*{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$")
    body = []
    while index < len(lines):
        text = lines[index]
        index += 1
        if closing.match(text):
            return body, index
        width = len(text) - len(text.lstrip(" \t"))
        body.append(text[min(width, len(indent)) :])
    raise PageError(name, f"{name}:{number}: the code block is never closed")


def _block(
    name: str, number: int, info: str, body: list[str], pending: list[tuple[int, str, str]]
) -> Block | None:
    """The block a fence opens, with its directives; None if it is not an example."""
    word = info.split()[0].lower() if info else ""
    language = LANGUAGES.get(word)
    title_match = _TITLE.search(info)
    title = None if title_match is None else title_match["double"] or title_match["single"]
    if title_match is not None and not _is_relative_name(title):
        raise PageError(name, f"{name}:{number}: title={title!r} is not a relative file name")
    skip = None
    background = cluster = False
    for line, verb, argument in pending:
        if language is None and title is None:
            shown = f"```{word}" if word else "a bare fence"
            raise PageError(
                name, f"{name}:{line}: `{verb}` is before {shown} block, which never runs"
            )
        if verb == "skip":
            if skip is not None or not argument:
                raise PageError(name, f"{name}:{line}: `skip` needs a reason, once a block")
            skip = argument
        elif verb == "cluster":
            if cluster or argument or language != SHELL or title is not None:
                raise PageError(
                    name, f"{name}:{line}: `cluster` stands alone, once, before a shell block"
                )
            cluster = True
        elif background or argument or language != SHELL or title is not None:
            raise PageError(
                name, f"{name}:{line}: `background` stands alone, once, before a shell block"
            )
        else:
            background = True
    if language is None and title is None:
        return None
    return Block(
        page=name,
        line=number,
        language=language or word,
        code="".join(f"{text}\n" for text in body),
        title=title,
        background=background,
        cluster=cluster,
        skip=skip,
    )


def _is_relative_name(title: str | None) -> bool:
    """Whether ``title`` names a file inside the working directory."""
    if not title:
        return False
    path = Path(title)
    return not path.is_absolute() and ".." not in path.parts


def _directive(name: str, number: int, text: str) -> tuple[str, str] | None:
    """A directive line's verb and argument; None for a line that is not one."""
    match = _DIRECTIVE.match(text)
    if match is None:
        if _DIRECTIVE_START.match(text):
            raise PageError(
                name,
                f"{name}:{number}: a malformed directive (`<!-- test: VERB ... -->`, one line)",
            )
        return None
    verb, _, argument = match["body"].strip().partition(" ")
    if verb not in ("skip", "background", "cluster", "replace", "timeout"):
        raise PageError(
            name,
            f"{name}:{number}: unknown directive {verb!r}"
            " (skip, background, cluster, replace, timeout)",
        )
    return verb, argument.strip()


def _replacement(name: str, number: int, argument: str) -> tuple[str, str]:
    """A ``replace`` directive's OLD and NEW."""
    tokens = []
    position = 0
    for match in _TOKEN.finditer(argument):
        if argument[position : match.start()].strip():
            break  # a stray quote: the check below refuses it
        quoted = match["quoted"]
        tokens.append(re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else match["bare"])
        position = match.end()
    if argument[position:].strip() or len(tokens) != 2 or not tokens[0]:
        raise PageError(
            name, f'{name}:{number}: `replace` takes OLD and NEW (a "quoted" token holds spaces)'
        )
    old, new = tokens
    for found in _PORT_LIKE.finditer(new):
        port = _PORT.fullmatch(found.group())
        if port is None or int(port["offset"] or 0) >= PORT_SPAN:
            raise PageError(
                name,
                f"{name}:{number}: {found.group()} is not {{port}} or {{port+N}}"
                f" with N below {PORT_SPAN}",
            )
    return old, new


def _timeout(name: str, number: int, argument: str) -> float:
    """A ``timeout`` directive's seconds."""
    try:
        seconds = float(argument)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise PageError(name, f"{name}:{number}: `timeout` takes a number of seconds")
    return seconds


def _check_replacements(
    name: str, blocks: list[Block], replacements: list[tuple[int, str, str]]
) -> None:
    """Raises PageError for a ``replace`` whose OLD is in no block (as the earlier ones left it)."""
    codes = [block.code for block in blocks]
    for number, old, new in replacements:
        if not any(old in code for code in codes):
            raise PageError(name, f"{name}:{number}: `replace` finds {old!r} in no code block")
        codes = [code.replace(old, new) for code in codes]


# ------------------------------------------------------------------------- the test process


@dataclasses.dataclass(frozen=True)
class PageRun:
    """What running a page did.

    Attributes:
        page: The page's name.
        executed: How many of its blocks ran (a background block counts once started).
        failure: Why the page failed, for a person; None if it passed.
        duration_s: How long the page took, cleaning up included.
        port: The base port ``{port}`` stood for, if the page asked for one.
        background_pids: The process ids of its background blocks.
    """

    page: str
    executed: int
    failure: str | None
    duration_s: float
    port: int | None
    background_pids: tuple[int, ...]


def run_page(
    page: Page,
    directory: Path,
    leftover_grace_s: float = LEFTOVER_GRACE_S,
    *,
    cluster: bool = False,
    work_from: Path | None = None,
    environment: dict[str, str] | None = None,
) -> PageRun:
    """Runs ``page``'s blocks in one fresh interpreter, in ``directory / "work"``.

    Returns once every process the page started is gone (at most the page's timeout plus about
    a minute). ``directory`` also gets the runner's files (``state/``: the blocks as run, the
    output, the reports). ``leftover_grace_s``: how long the page's processes have to end on
    their own once the runner has exited, before they are reported and killed. ``cluster``:
    the blocks marked ``cluster`` run too. ``work_from``: a directory copied into the working
    directory first. ``environment``: variables added to the page's (``ENVSERVER_*`` ones too).
    """
    started = time.monotonic()
    work, state = directory / "work", directory / "state"
    if work_from is not None:
        shutil.copytree(work_from, work, symlinks=True)
    work.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True)
    port = free_port_base() if page.uses_port else None
    blocks = prepared_blocks(page, port, cluster=cluster)
    spec = state / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "page": page.name,
                "path": str(page.path),
                "timeout_s": page.timeout_s,
                "leftover_grace_s": leftover_grace_s,
                "state": str(state),
                "blocks": [dataclasses.asdict(block) for block in blocks],
            }
        )
    )
    with open(state / "output.log", "wb") as output:
        reaper = subprocess.Popen(
            [sys.executable, __file__, "--reap-page", str(spec)],
            cwd=work,
            env={**page_environment(work), **(environment or {})},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        reaper.wait(timeout=page.timeout_s + REAPER_MARGIN_S)
    except subprocess.TimeoutExpired:
        pass
    finally:  # also when pytest-timeout or Ctrl-C interrupts the wait
        if reaper.poll() is None:
            kill_tree(reaper.pid)
            reaper.kill()
            reaper.wait()
    result = _read_json(state / "result.json")
    reaped = _read_json(state / "reaper.json")
    return PageRun(
        page=page.name,
        executed=result.get("executed", 0),
        failure=_failure(page, blocks, result, reaped, state),
        duration_s=time.monotonic() - started,
        port=port,
        background_pids=tuple(b["pid"] for b in result.get("backgrounds", [])),
    )


def prepared_blocks(page: Page, port: int | None, cluster: bool = False) -> list[Block]:
    """The blocks to run or write, the replacements made (``{port}`` as ``port``); those marked
    ``cluster`` only if ``cluster``."""

    def ports(match: re.Match[str]) -> str:
        assert port is not None, "a {port} replacement without a port"
        return str(port + int(match["offset"] or 0))

    # In one pass, so that a port given to one OLD is not taken for a later OLD (5555 -> 25556,
    # then 5556 -> 25557 would make 225557); where two OLDs start at one place, the earlier wins.
    new_of = {old: _PORT.sub(ports, new) for old, new in reversed(page.replacements)}
    olds = re.compile("|".join(re.escape(old) for old, _ in page.replacements))
    prepared = []
    for block in page.blocks:
        if block.skip is None and (cluster or not block.cluster):
            code = olds.sub(lambda match: new_of[match[0]], block.code) if new_of else block.code
            prepared.append(dataclasses.replace(block, code=code))
    return prepared


def free_port_base(span: int = PORT_SPAN) -> int:
    """A port below the ephemeral range such that it and the ``span - 1`` after it are free on
    every local address (see ``ports``)."""
    return free_ports(span, address="")


def page_environment(work: Path) -> dict[str, str]:
    """The environment a page's blocks run in (see the module's docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVSERVER_")}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, *env.get("PATH", os.defpath).split(os.pathsep)])
    kept = [
        entry
        for entry in env.get("PYTHONPATH", "").split(os.pathsep)
        if entry and not Path(entry).resolve().is_relative_to(ROOT)
    ]
    env["PYTHONPATH"] = os.pathsep.join([str(work), *kept])
    env["MPLBACKEND"] = "Agg"
    return env


def _failure(
    page: Page, blocks: list[Block], result: dict[str, Any], reaped: dict[str, Any], state: Path
) -> str | None:
    """Why the page failed, for a person; None if it did not."""
    parts = []
    failure = result.get("failure")
    if reaped.get("timed_out"):
        parts.append(
            f"{page.name}: timed out after {page.timeout_s:g} s"
            " (`<!-- test: timeout SECONDS -->` sets the page's bound)"
            + (
                ": every block ran, but the interpreter did not exit (a thread that does not"
                " end, an atexit handler?)"
                if result and failure is None
                else ""
            )
        )
    if failure is not None:
        parts.append(_block_failure(page, blocks, failure))
    backgrounds = result.get("backgrounds", [])
    for background in backgrounds:
        if background["status"] not in (None, 0):
            parts.append(
                f"{page.name}:{background['line']}: the background block exited with status"
                f" {background['status']} before the page ended"
            )
    if not result:
        parts.append(f"{page.name}: the runner ended without a report (reaper: {reaped})")
    elif failure is None and result.get("executed") != sum(block.runs for block in blocks):
        expected = sum(block.runs for block in blocks)
        parts.append(f"{page.name}: ran {result.get('executed')} of {expected} blocks")
    if reaped.get("left"):
        left = "".join(f"\n  pid {pid}: {command}" for pid, command in reaped["left"])
        parts.append(f"{page.name}: processes still running after the page (killed):{left}")
    if not parts:
        return None
    for background in backgrounds:
        parts.append(
            f"output of the background block at {page.name}:{background['line']}:\n"
            + _tail(Path(background["log"]))
        )
    parts.append(f"the page's output:\n{_tail(state / 'output.log')}")
    return "\n\n".join(parts)


def _block_failure(page: Page, blocks: list[Block], failure: dict[str, Any]) -> str:
    """A failed block: where, its code (numbered as on the page), the error."""
    block = next(b for b in blocks if b.line == failure["line"])
    how = " (interrupted at the page's timeout)" if failure["interrupted"] else ""
    numbered = "".join(
        f"  {block.line + 1 + i:>5} | {text}\n" for i, text in enumerate(block.code.splitlines())
    )
    return (
        f"{block.where}: the {block.language} block failed{how}:\n\n{numbered}\n"
        f"{failure['error'].rstrip()}"
    )


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log, indented; ``(nothing)`` if empty or missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = ""
    shown = text.splitlines()[-lines:]
    cut = "  ...\n" if len(text.splitlines()) > lines else ""
    return cut + "".join(f"  {line}\n" for line in shown) if shown else "  (nothing)\n"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# ------------------------------------------------------------------------------ processes


def _stat(pid: str) -> tuple[str, int, int] | None:
    """A process's state, parent and process group; None once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2])


def _processes() -> dict[int, tuple[str, int, int]]:
    """Every process's state, parent and process group, by id."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None:
            found[int(entry)] = stat
    return found


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` that run (zombies left out), parents first."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for child, (_, parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, queue = [], list(children.get(pid, []))
    while queue:
        child = queue.pop(0)
        if table[child][0] not in ("Z", "X"):
            found.append(child)
        queue.extend(children.get(child, []))
    return found


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that run."""
    return [
        pid
        for pid, (state, _, group) in _processes().items()
        if group == pgid and state not in ("Z", "X")
    ]


def command_line(pid: int) -> str:
    """A process's arguments joined by spaces ("" once gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def kill_tree(pid: int, timeout_s: float = 10.0) -> None:
    """SIGKILLs every process below ``pid`` until none runs (or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    while (left := descendants(pid)) and time.monotonic() < deadline:
        for child in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        time.sleep(POLL_S)  # descendants() leaves the killed ones out once they are zombies


def _reap_children() -> Iterator[tuple[int, int]]:
    """Reaps this process's ended children (adopted ones too): (pid, wait status) each.

    A generator: it reaps only as far as it is iterated (``list(...)`` for all).
    """
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def _become_subreaper() -> None:
    """Makes the processes of the page that lose their parent this process's (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


# -------------------------------------------------------------------------------- the reaper


def reap_page(spec_path: Path) -> int:
    """The page's reaper: runs the runner, bounds it, and leaves no process of the page behind.

    Writes ``reaper.json`` beside the spec: whether the page timed out, the runner's wait
    status, and the processes that were still running after it (then killed).
    """
    spec = json.loads(spec_path.read_text())
    _become_subreaper()
    runner = subprocess.Popen(
        [sys.executable, __file__, "--run-blocks", str(spec_path)],
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the timeout's SIGINT goes there
    )
    deadline = time.monotonic() + spec["timeout_s"]
    interrupted_at: float | None = None
    status: int | None = None
    while status is None:
        status = next((s for pid, s in list(_reap_children()) if pid == runner.pid), None)
        now = time.monotonic()
        if status is not None:
            break
        if interrupted_at is None and now > deadline:
            interrupted_at = now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(runner.pid, signal.SIGINT)
        elif interrupted_at is not None and now > interrupted_at + INTERRUPT_GRACE_S:
            break
        time.sleep(POLL_S)
    runner.returncode = -1 if status is None else status  # reaped here, not by Popen
    grace_end = time.monotonic() + (spec["leftover_grace_s"] if status is not None else 0.0)
    while (left := descendants(os.getpid())) and time.monotonic() < grace_end:
        list(_reap_children())
        time.sleep(POLL_S)
    report = {
        "timed_out": interrupted_at is not None,
        "runner_status": status,
        "left": [[pid, command_line(pid)] for pid in left if pid != runner.pid],
    }
    kill_tree(os.getpid())
    list(_reap_children())
    (Path(spec["state"]) / "reaper.json").write_text(json.dumps(report))
    return 0


# -------------------------------------------------------------------------------- the runner


class _BlockFailed(Exception):
    """A block failed: its line, and the traceback or output that says why."""

    def __init__(self, line: int, error: str, interrupted: bool = False) -> None:
        super().__init__(error)
        self.line, self.error, self.interrupted = line, error, interrupted


@dataclasses.dataclass
class _Background:
    """A background block's process and log."""

    line: int
    process: subprocess.Popen
    log: Path
    status: int | None = None  # its exit status if it ended before the page's end


def run_blocks(spec_path: Path) -> int:
    """The page's runner: writes the titled files, runs the blocks, stops the background ones.

    Writes ``result.json`` beside the spec: how many blocks ran, the failure (the block's line,
    the error, whether the timeout interrupted it) and the background blocks.
    """
    spec = json.loads(spec_path.read_text())
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or os.curdir).resolve()) != here]
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    state = Path(spec["state"])
    blocks = [Block(**block) for block in spec["blocks"]]
    for block in blocks:
        if block.title is not None:
            target = Path.cwd() / block.title
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module  # pickle finds the blocks' classes and functions there
    backgrounds: list[_Background] = []
    executed, failure = 0, None
    try:
        for block in blocks:
            if block.runs:
                shown = f"{block.language}, background" if block.background else block.language
                print(f"--- markdown_examples: {block.where} ({shown})", flush=True)
                if block.language == PYTHON:
                    _run_python(block, spec["path"], module)
                elif block.background:
                    backgrounds.append(_start_background(block, state))
                else:
                    _run_shell(block, state)
                executed += 1
    except _BlockFailed as failed:
        failure = {"line": failed.line, "error": failed.error, "interrupted": failed.interrupted}
    except KeyboardInterrupt as exc:  # the timeout, between two blocks
        failure = {"line": block.line, "error": _traceback(exc), "interrupted": True}
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a late timeout: the stopping goes on
        for background in backgrounds:
            _stop_background(background)
        report = {
            "executed": executed,
            "failure": failure,
            "backgrounds": [
                {"line": b.line, "pid": b.process.pid, "log": str(b.log), "status": b.status}
                for b in backgrounds
            ],
        }
        (state / "result.json").write_text(json.dumps(report))
        signal.signal(signal.SIGINT, signal.default_int_handler)  # to end a hung exit
    return 0


def _run_python(block: Block, path: str, module: types.ModuleType) -> None:
    """Execs a Python block in ``module``, its lines numbered as on the page at ``path``."""
    try:
        # dont_inherit: this file's `from __future__` imports are not the block's.
        code = compile("\n" * block.line + block.code, path, "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise _BlockFailed(block.line, _traceback(exc)) from None
    except KeyboardInterrupt as exc:
        raise _BlockFailed(block.line, _traceback(exc), interrupted=True) from None
    except BaseException as exc:
        raise _BlockFailed(block.line, _traceback(exc)) from None


def _traceback(exc: BaseException) -> str:
    """The exception's traceback without the runner's own frames."""
    tb = exc.__traceback__
    here = os.path.abspath(__file__)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _bash(block: Block) -> list[str]:
    """The command line that runs a shell block (its lines numbered as on the page)."""
    bash = shutil.which("bash") or "/bin/bash"
    return [bash, "-euo", "pipefail", "-c", "\n" * block.line + block.code]


def _run_shell(block: Block, state: Path) -> None:
    """Runs a shell block in the foreground; its output goes to the page's output too."""
    log = state / f"shell-{block.line}.log"
    interrupted = False
    with open(log, "wb") as output:
        try:
            status = subprocess.run(
                _bash(block), stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT
            ).returncode
        except KeyboardInterrupt:
            status, interrupted = None, True
    text = log.read_text(errors="replace")
    sys.stdout.write(text)
    if interrupted or status != 0:
        ended = "was interrupted" if interrupted else f"exited with status {status}"
        said = _tail(log).rstrip("\n")
        raise _BlockFailed(block.line, f"bash {ended}; its output:\n{said}\n", interrupted)


def _start_background(block: Block, state: Path) -> _Background:
    """Starts a background block in a session (and process group) of its own."""
    log = state / f"background-{block.line}.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            _bash(block),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return _Background(block.line, process, log)


def _stop_background(background: _Background) -> None:
    """Records whether the block ended on its own, then stops its process group."""
    background.status = background.process.poll()
    pgid = background.process.pid
    for signum, grace_s in BACKGROUND_GRACES_S:
        background.process.poll()
        if not group_members(pgid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signum)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            background.process.poll()  # reaps the block's shell, a member of the group
            if not group_members(pgid):
                return
            time.sleep(POLL_S)


# ------------------------------------------------------------------------------- by hand


def count_lines(collected: Iterable[Page | PageError]) -> list[str]:
    """One line per page saying what it runs, writes and skips, then the totals."""
    lines = []
    totals = dict.fromkeys(("run", "python", "shell", "background", "written", "skipped"), 0)
    totals["cluster"] = 0
    pages_run = 0
    for page in collected:
        if isinstance(page, PageError):
            lines.append(f"{page.name}: ERROR {page}")
            continue
        runnable = page.runnable
        counts = {
            "run": len(runnable),
            "python": sum(b.language == PYTHON for b in runnable),
            "shell": sum(b.language == SHELL and not b.background for b in runnable),
            "background": sum(b.background for b in runnable),
            "written": len(page.files),
            "skipped": len(page.skipped),
            "cluster": sum(block.cluster for block in page.blocks),
        }
        pages_run += bool(runnable)
        for key, value in counts.items():
            totals[key] += value
        lines.append(f"{page.name}: {_counted(counts)}")
    lines.append(f"total, {pages_run} page(s) run: {_counted(totals)}")
    return lines


def _counted(counts: dict[str, int]) -> str:
    return (
        f"{counts['run']} run ({counts['python']} python, {counts['shell']} shell,"
        f" {counts['background']} background), {counts['written']} written,"
        f" {counts['skipped']} skipped ({counts['cluster']} of them run by the cluster test)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Counts the examples of every page, or runs the pages named (``--run``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] in ("--reap-page", "--run-blocks"):  # run_page's processes
        return (reap_page if args[0] == "--reap-page" else run_blocks)(Path(args[1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="store_true", help="run the pages (default: count)")
    parser.add_argument("pages", nargs="*", type=Path, help="pages (default: README and docs)")
    options = parser.parse_args(args)
    paths = [p.resolve() for p in options.pages] or pages(ROOT)
    collected: list[Page | PageError] = []
    for path in paths:
        try:
            collected.append(parse_page(path, ROOT))
        except PageError as error:
            collected.append(error)
    if not options.run:
        print("\n".join(count_lines(collected)))
        return 0
    failed = 0
    for page in collected:
        if isinstance(page, PageError) or not page.runnable:
            failed += isinstance(page, PageError)
            print(f"{page.name}: {page if isinstance(page, PageError) else 'nothing to run'}")
            continue
        with tempfile.TemporaryDirectory(prefix="markdown-examples-") as directory:
            run = run_page(page, Path(directory))
        failed += run.failure is not None
        print(f"{page.name}: {'FAILED' if run.failure else 'passed'} in {run.duration_s:.1f} s")
        if run.failure:
            print(run.failure)
    return int(failed > 0)


if __name__ == "__main__":
    sys.exit(main())
