"""Local hosts' start-up: the trainer's fork server against multiprocessing's forkserver.

    python benchmarks/local_host_startup.py [--rounds 5] [--hosts 1 2 8] [--trainer-import torch]

Prints, per number of hosts, the milliseconds from asking for the hosts to every one of them
answering a PING: "cold" is a trainer's first hosts (its server starts too), "warm" comes after one
host was started and stopped (a respawn, or the trainer's next vector env). Each measurement is a
fresh trainer process; rounds interleave the two ways. The forkserver way is the smallest shim
over public API (``Process(target=run_host)`` after ``set_forkserver_preload``, the fork server's
own preload list); like every forkserver child, its hosts re-import the trainer's main module
(this script), so ``--trainer-import MODULE`` makes this script import MODULE first, as a trainer
script that imports it would (see docs/architecture.md, "Local hosts' fork server").
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

if os.environ.get("BENCH_TRAINER_IMPORT"):  # a trainer's own imports, run again in each child
    importlib.import_module(os.environ["BENCH_TRAINER_IMPORT"])

WAYS = ("ours", "forkserver")


def run_host(args: list[str], log: str, env: dict[str, str]) -> None:
    """A forkserver child's target: what the fork server's hosts do (``cli/forkhost.py``)."""
    from envserver.cli.app import main
    from envserver.launch.forked import exit_child, reseed

    status = 1
    try:
        os.setsid()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), 2)
        os.environ.clear()
        os.environ.update(env)
        reseed()
        status = main([*args, "--parent-pid", str(os.getppid())])
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    finally:
        exit_child(status)


def start_hosts(way: str, count: int) -> float:
    """Starts ``count`` hosts, waits until each answers a PING, stops them; returns the ms."""
    from envserver.cli.forkhost import PRELOAD
    from envserver.cli.ping import ping_all
    from envserver.launch.forkserver import ForkedProcess, ForkServer
    from envserver.launch.spawn import serve_args

    directory = tempfile.mkdtemp()
    sockets = [os.path.join(directory, f"host-{i}.sock") for i in range(count)]
    logs = [os.path.join(directory, f"host-{i}.log") for i in range(count)]
    env = dict(os.environ)
    started = time.perf_counter()
    if way == "ours":
        server = ForkServer.shared(env)
        processes = [
            server.spawn(
                serve_args(f"ipc://{socket}", allow_pickle=True, parent_pid=server.pid),
                log,
                env,
                sys.path,
                os.getcwd(),
            )
            for socket, log in zip(sockets, logs)
        ]
    else:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOAD))
        processes = [
            context.Process(
                target=run_host,
                args=(serve_args(f"ipc://{socket}", allow_pickle=True), log, env),
            )
            for socket, log in zip(sockets, logs)
        ]
        for process in processes:
            process.start()
    pending = [f"ipc://{socket}" for socket in sockets]
    while pending:  # refused until the host listens
        pending = [answer.endpoint for answer in ping_all(pending, None, 30.0) if not answer.info]
    elapsed_ms = (time.perf_counter() - started) * 1000
    for process in processes:
        process.kill()
    for process in processes:
        if isinstance(process, ForkedProcess):
            process.wait(30)
        else:
            process.join(30)
    return elapsed_ms


def measure(way: str, count: int, state: str, trainer_import: str | None) -> float:
    """One measurement in a fresh trainer process."""
    env = dict(os.environ)
    if trainer_import:
        env["BENCH_TRAINER_IMPORT"] = trainer_import
    command = [sys.executable, __file__, "--one", way, str(count), state]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return float(result.stdout)


def main() -> None:
    """Runs the rounds and prints one table row per number of hosts and state."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--states", nargs="+", default=["cold", "warm"])
    parser.add_argument("--trainer-import", help="a module the trainer script imports first")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        way, count, state = args.one
        if state == "warm":
            start_hosts(way, 1)
        print(f"{start_hosts(way, int(count)):.1f}")
        return
    times: dict[tuple[int, str, str], list[float]] = {}
    for _ in range(args.rounds):
        for count in args.hosts:
            for state in args.states:
                for way in WAYS:
                    ms = measure(way, count, state, args.trainer_import)
                    times.setdefault((count, state, way), []).append(ms)
    print("| hosts | state | ours, ms | forkserver, ms | forkserver / ours |")
    print("|---|---|---|---|---|")
    for count in args.hosts:
        for state in args.states:
            ours, theirs = (times[count, state, way] for way in WAYS)
            cells = [
                f"{statistics.median(t):.0f} ({min(t):.0f}-{max(t):.0f})" for t in (ours, theirs)
            ]
            ratio = statistics.median(theirs) / statistics.median(ours)
            print(f"| {count} | {state} | {cells[0]} | {cells[1]} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
