"""``envserver bench``: RemoteVectorEnv against Gymnasium's vector envs, in one interleaved run.

Every variant of a workload is built first, then they run in rounds, A B C A B C ..., each for
the same wall time with the same action sequences. The table reports each variant's median
env steps per second and the median of its per-round ratios to the references, because on a
shared machine absolute numbers swing several-fold from minute to minute while ratios measured
in the same round hold. The raw ZeroMQ echo round trip of this run (the floor under any
inter-process design) is printed first; a run whose floor is far above its quiet value is
labelled a bad phase, to be repeated rather than tuned to.

Two sections show what a user gets without choosing anything: the *defaults* group
(``make_vec(env_id, 16)`` with no options against ``AsyncVectorEnv`` and ``SyncVectorEnv`` with
theirs, on an env that waits, CartPole and an env that computes) and the *start-up* times
(construct + reset + one step + close, warm and first in a fresh process;
:mod:`envserver.bench.startup`).

The report goes to ``./envserver-bench-YYYYmmdd-HHMMSS.md`` (or ``--out``), and a chart of the
workload tables beside it, with the same stem and ``.png``, when matplotlib is installed
(:mod:`envserver.bench.chart`).

Usage::

    envserver bench                 # the full run (several minutes); `make bench` writes it
                                    # into benchmarks/results/
    envserver bench --quick         # a smoke run of about a minute: short rounds, fewer envs
    envserver bench --quick --only defaults,startup
                                    # what a user gets with no options, and start-up
    envserver bench --quick --rounds 1 --round-seconds 0.01 --soak-steps 500
                                    # the shortest: every variant built, stepped a little
    envserver bench --env my_pkg:MyEnv-v0 --num-envs 32 --hosts 1,2 --batch-size 16
                                    # your own env against Gymnasium's vector envs
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import shlex
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import zmq

from envserver.bench.chart import PLOT_EXTRA, write_chart
from envserver.bench.floors import latency_section, local_latency_section
from envserver.bench.report import soak_section, targets
from envserver.bench.startup import STARTUP_TITLE, StartupResults, startup_section
from envserver.bench.variants import Hosts, Workload, run_workload, workload_table
from envserver.bench.workloads import Plan, workloads_of
from envserver.cli.commands import Subcommand
from envserver.cli.interrupts import Interrupted, exit_status, signals_interrupt
from envserver.cli.settings import positive_int, positive_seconds

__all__ = ["BAD_PHASE_FACTOR", "QUIET_ECHO_FLOOR_US", "Report", "bench", "run_report", "selected"]

#: What a ``--quick`` run of the standard workloads says it leaves out.
QUICK_NOTE = (
    "--quick runs CartPole and the 1 ms-step env at 4 envs, and leaves out the synthetic pixel "
    "and Atari Pong workloads, the 64-host one and the full-size runs: the targets that need them "
    "read n/a."
)
#: The raw echo round trip measured on this kind of machine in a quiet phase.
QUIET_ECHO_FLOOR_US = 31.0
#: A run whose echo floor exceeds the quiet value this many times is a bad phase.
BAD_PHASE_FACTOR = 3.0


@dataclass
class Report:
    """The report so far: its markdown sections, and the workloads whose tables are in it."""

    title: str
    sections: list[str] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)


# ---------------------------------------------------------------- command line


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object, for the command line."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r}")
    return value


def _int_list(text: str) -> list[int]:
    """``"8,16"`` -> ``[8, 16]``, for the command line."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of counts: {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"counts must be positive: {text!r}")
    return list(dict.fromkeys(values))


def _terms(text: str) -> tuple[str, ...]:
    """``"defaults,Start-up"`` -> ``("defaults", "startup")``, for the command line."""
    terms = tuple(dict.fromkeys(_normal(t) for t in text.split(",") if t.strip()))
    if not terms:
        raise argparse.ArgumentTypeError(f"no titles to select: {text!r}")
    return terms


def _normal(text: str) -> str:
    """``text`` as ``--only`` compares it: lower case, no hyphens, no surrounding spaces."""
    return text.strip().lower().replace("-", "")


def selected(only: tuple[str, ...] | None, title: str, skip: tuple[str, ...] | None = None) -> bool:
    """Whether the section ``title`` runs.

    ``--only`` selects it (any of its terms in the title), and ``--skip`` does not leave it out
    (any of its terms in the title).
    """
    normal = _normal(title)
    chosen = not only or any(term in normal for term in only)
    return chosen and not (skip and any(term in normal for term in skip))


def _transports(text: str) -> tuple[str, ...]:
    """``"ipc,tcp"`` -> ``("ipc", "tcp")``, for the command line."""
    values = tuple(dict.fromkeys(text.split(",")))
    if not set(values) <= {"ipc", "tcp"}:
        raise argparse.ArgumentTypeError(f"ipc and/or tcp, not {text!r}")
    return values


# ---------------------------------------------------------------- run


def run_report(
    args: argparse.Namespace,
    plan: Plan,
    report: Report,
    check: Callable[[], None] = lambda: None,
) -> None:
    """Runs the benchmark, printing each section and adding it to ``report`` as it is done.

    ``check`` is called between rounds: it raises to stop the run.
    """
    rounds = args.rounds or (2 if args.quick else 5)
    seconds = args.round_seconds or (0.1 if args.quick else 1.0)
    soak_steps = args.soak_steps or (2_000 if args.quick else 1_000_000)
    with tempfile.TemporaryDirectory(prefix="envserver-bench-") as tmp:
        directory = Path(tmp)
        everything = workloads_of(directory, plan)  # described only: hosts start as they run
        workloads = [w for w in everything if selected(args.only, w.title, args.skip)]
        with_startup = plan.env_id is None and selected(args.only, STARTUP_TITLE, args.skip)
        if not workloads and not with_startup:
            titles = sorted({w.title for w in everything} | {STARTUP_TITLE})
            raise ValueError(
                f"--only and --skip select nothing; the sections are: {'; '.join(titles)}"
            )
        latency_text, latency = latency_section(directory, rounds, 200 if args.quick else 2000)
        local_text, local_latency = local_latency_section(rounds, 200 if args.quick else 2000)
        latency_text += "\n" + local_text
        floor = min(statistics.median(r["echo"]) for r in latency.values())
        phase = (
            "quiet enough"
            if floor <= BAD_PHASE_FACTOR * QUIET_ECHO_FLOOR_US
            else f"BAD PHASE (floor over {BAD_PHASE_FACTOR:.0f}x the quiet "
            f"{QUIET_ECHO_FLOOR_US:.0f} us): the ratios below are not comparable; repeat the run"
        )
        sections = report.sections
        sections += [
            f"# {report.title}",
            "",
            f"**Echo floor this run: {floor:.0f} us** (raw ZeroMQ DEALER/ROUTER round trip of a "
            f"step's message sizes) - {phase}.",
            "",
            f"{rounds} interleaved rounds of {seconds:g} s per variant; rates are medians over "
            "rounds, ratios are medians of per-round ratios. Python "
            f"{sys.version.split()[0]}, gymnasium {gym.__version__}, numpy {np.__version__}, "
            f"pyzmq {zmq.__version__}.",
            "",
            *([QUICK_NOTE, ""] if args.quick and plan.env_id is None else []),
        ]
        print("\n".join(sections), flush=True)
        print(latency_text, flush=True)
        for workload in workloads:
            try:
                run_workload(workload, rounds, seconds, check)
                table = workload_table(workload)
            finally:
                workload.hosts.stop()
            print(table, flush=True)
            sections.append(table)
            if not workload.skipped:  # (a skipped one has no bars to chart)
                report.workloads.append(workload)
        startup: StartupResults = {}
        if with_startup:
            startup_text, startup = startup_section(directory / "startup", rounds)
            print(startup_text, flush=True)
            sections.append(startup_text)
        sections.append(latency_text)
        if plan.env_id is None:  # the soak and targets are about the standard workloads
            soak_text, growth = soak_section(directory, soak_steps)
            summary = targets(workloads, latency, growth, startup, local_latency)
            print(soak_text, summary, sep="\n", flush=True)
            sections += [soak_text, summary]
        client_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        footer = f"Client peak RSS over the whole run: {client_rss:.0f} MB.\n"
        print(footer)
        sections.append(footer)


def _arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``envserver bench``."""
    parser.description = __doc__.split("\n\n")[0].split(": ", 1)[1]
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of about a minute: every kind of section, 2 rounds of 0.1 s, fewer "
        "envs (no pixel or Pong workload)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        help="interleaved rounds, and start-up measurements per variant (default 5; quick 2)",
    )
    parser.add_argument(
        "--round-seconds",
        type=positive_seconds,
        help="seconds per variant per round, at least one step (default 1.0; quick 0.1); each "
        "variant's untimed warm-up is as long, 0.2 at most",
    )
    parser.add_argument(
        "--soak-steps", type=positive_int, help="env steps of the soak (default 1M)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="where to write the markdown report (default: ./envserver-bench-YYYYmmdd-HHMMSS.md); "
        "the chart goes beside it, with the same name and .png",
    )
    parser.add_argument(
        "--only",
        type=_terms,
        metavar="TEXT,...",
        help="run only the workloads (and the start-up section) whose title contains one of the "
        "TEXTs, case and hyphens ignored; e.g. 'defaults,startup' runs the defaults group "
        "(make_vec with no options against Gymnasium's vector envs with theirs) and the start-up "
        "times; the latency section, the soak and the targets always run",
    )
    parser.add_argument(
        "--skip",
        type=_terms,
        metavar="TEXT,...",
        help="leave out the workloads (and the start-up section) whose title contains one of the "
        "TEXTs, as --only reads them; e.g. 'defaults,startup'",
    )
    parser.add_argument(
        "--host-args",
        default="",
        metavar="ARGS",
        help="more `envserver serve` arguments for every host, e.g. '--metrics-port 0'",
    )
    own = parser.add_argument_group(
        "your own env",
        "--env runs one env of yours instead of the standard workloads (then no jittery env, soak "
        "or targets); the other options also narrow the standard run",
    )
    own.add_argument("--env", metavar="ENV_ID", help="a Gymnasium id, e.g. 'my_pkg:MyEnv-v0'")
    own.add_argument(
        "--env-kwargs", type=_json_object, default={}, metavar="JSON", help="its gym.make kwargs"
    )
    own.add_argument(
        "--num-envs", type=_int_list, metavar="N,...", help="env counts (default 8,16; quick 4)"
    )
    own.add_argument(
        "--hosts", type=_int_list, metavar="N,...", help="host counts (default 1,2,4; quick 1)"
    )
    own.add_argument(
        "--transports",
        type=_transports,
        default=("ipc", "tcp"),
        metavar="ipc,tcp",
        help="transports of the RemoteVectorEnv variants (first-ready ones use the first)",
    )
    own.add_argument(
        "--batch-size",
        type=positive_int,
        help="also run first-ready batches of this size, per host count",
    )
    own.add_argument(
        "--allow-pickle",
        action="store_true",
        help="hosts and clients may pickle what the codec cannot carry (custom spaces, objects "
        "in infos); only for hosts you trust",
    )


def _plan(args: argparse.Namespace) -> Plan:
    """What the options ask to run.

    Raises:
        ValueError: The options do not go together, or ``--env`` cannot be made.
    """
    sizes = args.num_envs or ([4] if args.quick else [8, 16])
    if args.env is None and args.env_kwargs:
        raise ValueError("--env-kwargs needs --env")
    if args.hosts and max(args.hosts) > min(sizes):
        raise ValueError(f"--hosts: no more hosts than envs ({min(sizes)})")
    if args.batch_size is not None and not 1 <= args.batch_size <= min(sizes):
        raise ValueError(
            f"--batch-size must be between 1 and the smallest env count ({min(sizes)})"
        )
    if args.env is not None:
        try:
            gym.make(args.env, **args.env_kwargs).close()
        except Exception as exc:
            raise ValueError(f"--env: cannot make {args.env}: {type(exc).__name__}: {exc}") from exc
    return Plan(
        sizes=sizes,
        host_counts=args.hosts or ([1] if args.quick else [1, 2, 4]),
        quick=args.quick,
        env_id=args.env,
        env_kwargs=args.env_kwargs,
        transports=args.transports,
        batch_size=args.batch_size,
        allow_pickle=args.allow_pickle,
    )


def _write(out: Path, report: Report) -> None:
    """Writes the markdown report to ``out`` and its chart beside it (same stem, ``.png``).

    Without matplotlib the chart is left out, and one line says how to get it.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(report.sections))
    if not report.workloads:  # e.g. --only startup: no table to chart
        return
    chart = out.with_suffix(".png")
    try:
        write_chart(report.workloads, chart, report.title)
    except ImportError as exc:
        print(f"no chart: cannot import matplotlib ({exc}); pip install '{PLOT_EXTRA}' adds it")
    else:
        print(f"chart written to {chart}")


def _run(args: argparse.Namespace) -> int:
    """Runs the benchmark and writes its markdown report (and chart)."""
    plan = _plan(args)
    Hosts.extra_args = tuple(shlex.split(args.host_args))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or Path.cwd() / f"envserver-bench-{stamp}.md"
    report = Report(f"envserver benchmark, {stamp}")
    try:
        with signals_interrupt() as interrupts:
            run_report(args, plan, report, interrupts.check)
    except Interrupted as exc:  # Ctrl-C or SIGTERM: hosts stopped, temporary directory removed
        report.sections.append(f"**Interrupted ({exc.signal_name}): a partial report.**\n")
        _write(out, report)
        print(f"bench: interrupted ({exc.signal_name}); the partial report is in {out}")
        return exit_status(exc)
    _write(out, report)
    print(f"written to {out}")
    return 0


#: ``envserver bench``, the ``envserver.commands`` entry point ``bench``.
bench = Subcommand(
    help="benchmark RemoteVectorEnv against Gymnasium's vector envs (a report and a chart)",
    add_arguments=_arguments,
    run=_run,
    log_level="WARNING",
)
