"""``envserver rollout``: random-action rollouts through :func:`envserver.client.make_vec`.

The client contributes this command to ``envserver`` through the ``envserver.commands`` entry
point group (see :mod:`envserver.cli.commands`), so that the host side never imports the client.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from envserver.cli.commands import (
    IMPORT_VARIABLE,
    Subcommand,
    add_curve_client_arguments,
    add_import_argument,
    import_modules,
    modules_to_import,
)
from envserver.cli.interrupts import (
    Interrupted,
    closing_mid_call,
    exit_status,
    signals_interrupt,
)
from envserver.cli.settings import HostList, positive_int, positive_seconds
from envserver.launch.environment import HOSTS_VARIABLE, MIN_HOSTS_VARIABLE, HostChoice

from . import make_vec
from ._options import DEFAULT_OPTIONS
from ._rollout import RandomRollout, summary_lines

__all__ = ["rollout"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help="registered env id, e.g. CartPole-v1")
    parser.add_argument(
        "--num-envs", type=positive_int, default=8, help="number of envs (default: 8)"
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=1000,
        help="vector steps; each steps every env (default: 1000)",
    )
    parser.add_argument(
        "--hosts",
        action=HostList,
        followed_by="env_id",
        help="env hosts, separated by spaces or commas: endpoints (tcp://sim-a:5555), "
        "dns://NAME:PORT for every address of NAME, slurm://NODES:PORT for every node of a "
        "Slurm job (NODES: job, het-group-N or a node list), or ray:// alone (hosts started on "
        "a Ray cluster); `local` starts local hosts (default: "
        f"${HOSTS_VARIABLE}, else local hosts)",
    )
    parser.add_argument(
        "--min-hosts",
        type=positive_int,
        metavar="N",
        help="wait until N hosts answer (those of dns:// and slurm:// specs included; default: "
        f"${MIN_HOSTS_VARIABLE}, else one per dns:// name and every host of a slurm:// spec)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=positive_seconds,
        default=DEFAULT_OPTIONS.connect_timeout_s,
        metavar="SECONDS",
        help="how long to wait for the hosts (default: %(default)g)",
    )
    parser.add_argument(
        "--on-host-failure",
        choices=("raise", "restart", "restore"),
        default=DEFAULT_OPTIONS.on_host_failure,
        help="stop at a lost host, re-make its envs and go on, or re-make them in the state "
        "they were in (from snapshots) and go on (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for envs and actions")
    add_curve_client_arguments(parser)
    add_import_argument(parser, "in this process and in its local hosts")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (no progress bar)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _run(args: argparse.Namespace) -> int:
    local = HostChoice.of(args.hosts).local
    if args.imports and not local:
        raise ValueError(
            "--import applies to this process and its local hosts; the hosts given with "
            f"--hosts or ${HOSTS_VARIABLE} import their own modules (envserver serve --import)"
        )
    if local:
        modules = modules_to_import(args)
        import_modules(modules)
        if modules:  # the local hosts inherit the environment
            os.environ[IMPORT_VARIABLE] = ",".join(modules)

    summary: dict[str, Any] = {"env_id": args.env_id, "num_envs": args.num_envs}
    started = time.perf_counter()
    envs = rollout = progress = None
    try:
        with signals_interrupt() as interrupts:
            try:
                envs = make_vec(
                    args.env_id,
                    num_envs=args.num_envs,
                    hosts=args.hosts,
                    vector_kwargs={
                        "curve_server_key": args.curve_server_key,
                        "curve_client_key": args.curve_client_key,
                        "min_hosts": args.min_hosts,
                        "connect_timeout_s": args.connect_timeout,
                        "on_host_failure": args.on_host_failure,
                    },
                )
                summary["setup_seconds"] = time.perf_counter() - started
                progress = _progress_bar(args.steps * args.num_envs, args.no_progress or args.json)
                rollout = RandomRollout(envs, args.seed)
                rollout.run(args.steps, progress, check=interrupts.check)
            finally:
                if progress is not None:
                    progress.close()
                if envs is not None:
                    summary.update(rollout.summary() if rollout is not None else {})
                    summary["host_restarts"] = envs.host_restarts
                    summary["envs_moved"] = envs.envs_moved
                    summary["hosts"] = [
                        {"endpoint": endpoint, "num_envs": count}
                        for endpoint, count in zip(envs.hosts, envs.envs_per_host)
                    ]
                    with closing_mid_call():  # a call a signal interrupted is pending
                        envs.close()
    except Interrupted as exc:
        steps = summary.get("env_steps", 0)
        print(
            f"envserver rollout: interrupted ({exc.signal_name}) after {steps} env steps",
            file=sys.stderr,
            flush=True,
        )
        _print_summary(args, {**summary, "interrupted": True, "signal": exc.signal_name})
        return exit_status(exc)
    _print_summary(args, summary)
    return 0


def _progress_bar(total: int, quiet: bool) -> Any:
    """A tqdm bar over ``total`` env steps, or None when quiet."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return None if quiet else tqdm(total=total, unit="step", unit_scale=True)


def _print_summary(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print("\n".join(summary_lines(summary)), flush=True)


#: ``envserver rollout``, the ``envserver.commands`` entry point ``rollout``.
rollout = Subcommand(
    help="run random-action rollouts", add_arguments=_arguments, run=_run, log_level="WARNING"
)
