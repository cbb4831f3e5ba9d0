"""Scale: one trainer driving 1, 4, 16 and 64 hosts, each on its own address, against the floor.

Every host runs in a network namespace of its own, joined to this one by a veth pair on one
bridge (the trainer reaches it over TCP, as it would another machine), and holds one env whose
step waits 1 ms (``envserver.testing``'s JitterEnv, no slow steps). For each host count the
trainer steps ``RemoteVectorEnv`` in lockstep and in first-ready batches (half the envs per
batch), and a protocol-free ZeroMQ client (the raw floor of ``envserver.bench.floors``) steps
the same envs on the same namespaces; rounds alternate between them. Reported: env steps per
second (medians), their ratio to the floor, and the trainer's CPU per host per vector step,
which sets how many hosts one trainer process can drive (see docs/scaling.md).

Needs root and ``ip netns`` (Linux); it makes its namespaces, links and bridge under names
derived from its process id and removes them at the end, whatever happens.

Usage::

    sudo .venv/bin/python benchmarks/scale.py              # 1, 4, 16, 64 hosts (a few minutes)
    .venv/bin/python benchmarks/scale.py --quick           # 1 and 4 hosts, seconds
    .venv/bin/python benchmarks/scale.py --hosts 1,8 --seconds 3 --out report.md
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import datetime
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from envserver import client
from envserver.bench.floors import RawFloor
from envserver.testing import HostProcess, ip, netns_unavailable, start_host

#: The env of every host: each step waits 1 ms, next to no CPU (an env that waits).
ENV_ID = "envserver.testing:envserver/Jitter-v0"
ENV_KWARGS: dict[str, Any] = {"step_s": 0.001, "slow_prob": 0.0}
HOST_PORT, FLOOR_PORT = 5555, 5556
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
RESULTS = Path(__file__).parent / "results"


class Fabric:
    """``count`` network namespaces on one bridge, each with an address of its own.

    Names and the /24 come from the process id, so that two runs on one machine do not meet.
    """

    def __init__(self, count: int) -> None:
        if count > 240:
            raise ValueError("at most 240 namespaces on one /24")
        self.tag = os.getpid() % 10000
        self.count = count
        self.bridge = f"esb{self.tag}"
        self.net = f"10.215.{self.tag % 250}"
        self.namespaces = [f"es{self.tag}s{k}" for k in range(count)]
        self.addresses = [f"{self.net}.{k + 10}" for k in range(count)]

    def prefix(self, k: int) -> list[str]:
        """The command prefix that runs a program in namespace ``k``."""
        return ["ip", "netns", "exec", self.namespaces[k]]

    @contextlib.contextmanager
    def made(self) -> Iterator[Fabric]:
        """Makes the bridge and the namespaces; removes them all afterwards."""
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.net}.1/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for k, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
                outer, inner = f"esv{self.tag}o{k}", f"esv{self.tag}i{k}"
                ip("netns", "add", ns)
                ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                ip("link", "set", inner, "netns", ns)
                ip("link", "set", outer, "master", self.bridge)
                ip("link", "set", outer, "up")
                ip("netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", inner)
                ip("netns", "exec", ns, "ip", "link", "set", inner, "up")
                ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            yield self
        finally:
            for ns in self.namespaces:  # its end of the veth pair goes with it, and the pair
                ip("netns", "del", ns, check=False)
            ip("link", "del", self.bridge, check=False)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this fabric that still exist (none after :meth:`made`)."""
        names = ip("netns", "list").stdout + ip("link", "show").stdout
        return sorted({n for n in [*self.namespaces, self.bridge] if f"{n} " in names + " "})


def start_hosts(fabric: Fabric, directory: Path, count: int) -> list[HostProcess]:
    """``envserver serve`` in each of the first ``count`` namespaces, started 8 at a time."""

    def start(k: int) -> HostProcess:
        bind = f"tcp://{fabric.addresses[k]}:{HOST_PORT}"
        return start_host(directory / f"h{k}", bind=bind, prefix=fabric.prefix(k))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(start, range(count)))


def host_cpu_s(pids: list[int]) -> float:
    """The CPU seconds the processes ``pids`` have used (user and system)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS_PER_S


@dataclasses.dataclass
class Round:
    """One round of one variant: env steps, and the wall, trainer and hosts' seconds it took."""

    env_steps: int
    vector_steps: int
    wall_s: float
    trainer_s: float
    hosts_s: float


def timed(step: Callable[[], int], seconds: float, pids: list[int]) -> Round:
    """Calls ``step`` (which returns the env steps it made) for ``seconds``, measured."""
    env_steps = vector_steps = 0
    hosts, cpu, start = host_cpu_s(pids), time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        env_steps += step()
        vector_steps += 1
    wall = time.perf_counter() - start
    return Round(env_steps, vector_steps, wall, time.process_time() - cpu, host_cpu_s(pids) - hosts)


def lockstep(env: Any) -> Callable[[], int]:
    """One vector step of ``env`` (all its envs, at once)."""
    actions = np.zeros(env.num_envs, dtype=np.int64)
    return lambda: env.step(actions) and env.num_envs


def first_ready(env: client.RemoteVectorEnv) -> Callable[[], int]:
    """One first-ready batch of ``env``: the first to finish are sent on at once."""

    def step() -> int:
        *_, infos = env.recv()
        ids = infos["env_id"]
        env.send(np.zeros(len(ids), dtype=np.int64), ids)
        return len(ids)

    return step


def measure(count: int, hosts: list[HostProcess], fabric: Fabric, args: Any) -> dict[str, Any]:
    """Ours (lockstep, first-ready) and the floor on ``count`` hosts, rounds interleaved.

    Returns per variant the median env steps per second, trainer CPU per host per env step
    and hosts' CPU per env step (microseconds).
    """
    endpoints = [host.endpoint for host in hosts[:count]]
    common = {"env_id": ENV_ID, "env_kwargs": ENV_KWARGS, "num_envs": count, "env_threads": 1}
    ours = client.RemoteVectorEnv(hosts=endpoints, **common)
    ready = client.RemoteVectorEnv(hosts=endpoints, batch_size=max(1, count // 2), **common)
    floor = RawFloor(
        ENV_ID, count, count, Path(tempfile.mkdtemp()), ENV_KWARGS,
        binds=[f"tcp://{a}:{FLOOR_PORT}" for a in fabric.addresses[:count]],
        prefixes=[fabric.prefix(k) for k in range(count)],
    )  # fmt: skip
    ours_pids = [host.process.pid for host in hosts[:count]]
    variants = {
        "ours": (lockstep(ours), ours_pids),
        "first-ready": (first_ready(ready), ours_pids),
        "floor": (lockstep(_Floor(floor, count)), [p.pid for p in floor.processes]),
    }
    runs: dict[str, list[Round]] = {name: [] for name in variants}
    try:
        ours.reset(seed=0)
        ready.async_reset(seed=0)
        floor.reset(0)
        for _ in range(args.rounds):
            for name, (step, pids) in variants.items():
                runs[name].append(timed(step, args.seconds, pids))
    finally:
        ours.close()
        ready.close()
        floor.close()
    result: dict[str, Any] = {"hosts": count}
    for name, rounds in runs.items():
        result[name] = statistics.median(r.env_steps / r.wall_s for r in rounds)
        per_step = [r.trainer_s / r.env_steps * 1e6 for r in rounds]
        result[f"{name} cpu"] = statistics.median(per_step)
        result[f"{name} host cpu"] = statistics.median(
            r.hosts_s / r.env_steps * 1e6 for r in rounds
        )
        result[f"{name} wall"] = statistics.median(r.wall_s / r.vector_steps * 1e6 for r in rounds)
    return result


class _Floor:
    """The raw floor with a ``num_envs``, for :func:`lockstep`."""

    def __init__(self, floor: RawFloor, num_envs: int) -> None:
        self.floor, self.num_envs = floor, num_envs

    def step(self, actions: np.ndarray) -> Any:
        return self.floor.step(actions)


def report(results: list[dict[str, Any]], args: Any, seconds: float) -> str:
    """The markdown report: the measured table, and the model's constants and predictions."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        f"# envserver scale, {stamp}",
        "",
        f"One trainer process; each host in its own network namespace on one bridge (TCP), "
        f"one env per host whose step waits 1 ms; {args.rounds} interleaved rounds of "
        f"{args.seconds:g} s, medians; {seconds:.0f} s in all; {os.cpu_count()} cores for all.",
        "",
        "| hosts | ours, lockstep (env steps/s) | first-ready, batches of half | raw floor "
        "| ours / floor | trainer CPU per env step: ours (us) | first-ready | floor "
        "| hosts' CPU per env step: ours (us) | floor |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['hosts']} | {r['ours']:,.0f} | {r['first-ready']:,.0f} | {r['floor']:,.0f} "
            f"| {r['ours'] / r['floor']:.2f} | {r['ours cpu']:.0f} | {r['first-ready cpu']:.0f} "
            f"| {r['floor cpu']:.0f} | {r['ours host cpu']:.0f} | {r['floor host cpu']:.0f} |"
        )
    return "\n".join([*lines, "", *model_lines(results)]) + "\n"


def model_lines(results: list[dict[str, Any]]) -> list[str]:
    """The model of docs/scaling.md, fed with this run's constants: predicted against measured.

    A lockstep vector step over H hosts (one env each) takes one env step's round trip ``T``
    (the wall time of a step on one host) plus the trainer's CPU ``c`` for each other host (it
    serves the hosts one after another): ``T + c * (H - 1)``; on one machine, at least every
    process's CPU ``H * (c + h)`` spread over its cores (``h``: a host's CPU per env step).
    """
    one, most = results[0], results[-1]
    cores = os.cpu_count() or 1
    lines = ["## The model, with this run's constants", ""]
    lines.append("| | T: one step, 1 host (us) | c: trainer CPU per host (us) | h: host CPU (us) |")
    lines.append("|---|---:|---:|---:|")
    constants = {}
    for name in ("ours", "floor"):
        t, c, h = one[f"{name} wall"], most[f"{name} cpu"], most[f"{name} host cpu"]
        constants[name] = (t, c, h)
        lines.append(f"| {name} | {t:.0f} | {c:.0f} | {h:.0f} |")
    lines += ["", "| hosts | ours: predicted here / measured | floor: predicted / measured |"]
    lines.append("|---:|---:|---:|")
    for r in results:
        cells = []
        for name, (t, c, h) in constants.items():
            step_s = max(t + c * (r["hosts"] - 1), r["hosts"] * (c + h) / cores) / 1e6
            cells.append(f"{r['hosts'] / step_s:,.0f} / {r[name]:,.0f}")
        lines.append(f"| {r['hosts']} | {cells[0]} | {cells[1]} |")
    lines += ["", "| hosts on their own machines | ours: predicted env steps/s | floor |"]
    lines.append("|---:|---:|---:|")
    for hosts in (1, 4, 16, 64, 256, 1000):
        cells = [f"{hosts / ((t + c * (hosts - 1)) / 1e6):,.0f}" for t, c, _ in constants.values()]
        lines.append(f"| {hosts} | {cells[0]} | {cells[1]} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Runs the scale benchmark and writes its report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default=None, help="host counts, e.g. 1,4,16,64")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per variant")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per round")
    parser.add_argument("--quick", action="store_true", help="1 and 4 hosts, short rounds")
    parser.add_argument("--out", type=Path, help="the markdown report (default: results/)")
    args = parser.parse_args(argv)
    counts = [int(c) for c in (args.hosts or ("1,4" if args.quick else "1,4,16,64")).split(",")]
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.seconds = args.seconds or (0.5 if args.quick else 2.0)
    why = netns_unavailable()
    if why is not None:
        print(f"scale: cannot run: {why}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    fabric = Fabric(max(counts))
    hosts: list[HostProcess] = []
    with tempfile.TemporaryDirectory() as directory, fabric.made():
        try:
            hosts = start_hosts(fabric, Path(directory), max(counts))
            results = []
            for count in counts:
                results.append(measure(count, hosts, fabric, args))
                print(f"scale: {count} host(s) measured", file=sys.stderr, flush=True)
        finally:
            for host in hosts:
                host.stop()
    text = report(results, args, time.perf_counter() - started)
    out = args.out or RESULTS / f"scale-{datetime.datetime.now():%Y%m%d-%H%M%S}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
