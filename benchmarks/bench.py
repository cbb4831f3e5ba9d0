"""envserver benchmark: RemoteVectorEnv against Gymnasium's vector envs, in one interleaved run.

Every variant of a workload is built first, then they run in rounds, A B C A B C ..., each for
the same wall time with the same action sequences. The table reports each variant's median
env steps per second and the median of its per-round ratios to the references, because on a
shared machine absolute numbers swing several-fold from minute to minute while ratios measured
in the same round hold. The raw ZeroMQ echo round trip of this run (the floor under any
inter-process design) is printed first; a run whose floor is far above its quiet value is
labelled a bad phase, to be repeated rather than tuned to.

Usage::

    python benchmarks/bench.py                 # the full run (several minutes), as `make bench`
    python benchmarks/bench.py --quick         # a seconds-long smoke run
    python benchmarks/bench.py --env my_pkg:MyEnv-v0 --num-envs 32 --hosts 1,2 --batch-size 16
                                               # your own env against Gymnasium's vector envs
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.util
import json
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import zmq

import client
from envserver.batching import select
from envserver.interrupts import Interrupted, exit_status, signals_interrupt
from envserver.protocol import Command, Status, encode_reply, encode_request
from envserver.testing import HostProcess, start_host

#: The raw echo round trip measured on this kind of machine in a quiet phase.
QUIET_ECHO_FLOOR_US = 31.0
#: A run whose echo floor exceeds the quiet value this many times is a bad phase.
BAD_PHASE_FACTOR = 3.0
RESULTS = Path(__file__).parent / "results"


@dataclass
class Variant:
    """One vector env implementation under test, and its measured rates."""

    name: str
    make: Callable[[], Any]
    first_ready: bool = False
    env: Any = None
    rates: list[float] = field(default_factory=list)
    hosts: list[HostProcess] = field(default_factory=list)  # the env hosts started for it
    error: str | None = None  # why it could not be built, if it could not
    num_envs: int | None = None  # fewer envs than the workload's (the first ones), if set


@dataclass
class Workload:
    """An env, an env count, and the variants compared on it."""

    title: str
    env_id: str
    kwargs: dict[str, Any]
    num_envs: int
    variants: list[Variant]
    references: tuple[str, ...]
    hosts: Hosts
    actions: list[Any] = field(default_factory=list)


# ---------------------------------------------------------------- hosts


class Hosts:
    """Env-host processes for one workload, on ipc:// or loopback tcp://.

    Args:
        directory: Where their logs and sockets go.
        allow_pickle: Start them with ``--allow-pickle``.
    """

    #: More ``envserver serve`` arguments for every host of the run (``--host-args``).
    extra_args: tuple[str, ...] = ()

    def __init__(self, directory: Path, allow_pickle: bool = False) -> None:
        self.directory = directory
        self.allow_pickle = allow_pickle
        self.started: list[HostProcess] = []

    def endpoints(self, count: int, transport: str, more: tuple[str, ...] = ()) -> list[str]:
        """Starts ``count`` hosts (with ``more`` serve arguments) and returns their endpoints."""
        bind = "tcp://127.0.0.1:*" if transport == "tcp" else None
        args = [*self.extra_args, *more, *(["--allow-pickle"] if self.allow_pickle else [])]
        endpoints = []
        for _ in range(count):
            self.started.append(start_host(self.directory, *args, bind=bind))  # stopped by stop()
            endpoints.append(self.started[-1].endpoint)
        return endpoints

    def stop(self) -> None:
        """Stops every host started."""
        for host in self.started:
            host.stop()
        self.started = []


def _peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ---------------------------------------------------------------- variants


def gym_variants(env_id: str, kwargs: dict[str, Any], num_envs: int) -> list[Variant]:
    """Gymnasium's own vector envs on the same envs."""
    fns = [functools.partial(gym.make, env_id, **kwargs)] * num_envs
    return [
        Variant("SyncVectorEnv", lambda: gym.vector.SyncVectorEnv(fns)),
        Variant(
            "AsyncVectorEnv shm",
            lambda: gym.vector.AsyncVectorEnv(fns, shared_memory=True),
        ),
        Variant(
            "AsyncVectorEnv no-shm",
            lambda: gym.vector.AsyncVectorEnv(fns, shared_memory=False),
        ),
    ]


def even_split(num_envs: int, num_hosts: int) -> list[int]:
    """Envs per host as RemoteVectorEnv lays them out: even, earlier hosts one more."""
    base, extra = divmod(num_envs, num_hosts)
    return [base + (1 if i < extra else 0) for i in range(num_hosts)]


class SB3Peer:
    """Stable-Baselines3's ``SubprocVecEnv`` (one process per env), as a peer of the others.

    Only the calls the benchmark makes: ``reset(seed=...)``, ``step``, ``close``.
    """

    def __init__(self, fns: list[Callable[[], gym.Env]]) -> None:
        from stable_baselines3.common.vec_env import SubprocVecEnv

        self.env = SubprocVecEnv(fns)

    def reset(self, seed: int | None = None) -> Any:
        """Seeds env ``i`` with ``seed + i`` and resets them all."""
        self.env.seed(seed)
        return self.env.reset()

    def step(self, actions: Any) -> Any:
        """Steps every env (SB3 resets finished ones)."""
        return self.env.step(actions)

    def close(self) -> None:
        """Stops the env processes."""
        self.env.close()


def sb3_variants(env_id: str, kwargs: dict[str, Any], num_envs: int) -> list[Variant]:
    """SB3's SubprocVecEnv on the same envs, when stable-baselines3 is installed."""
    if importlib.util.find_spec("stable_baselines3") is None:
        return []
    fns = [functools.partial(gym.make, env_id, **kwargs)] * num_envs
    return [Variant("SB3 SubprocVecEnv", functools.partial(SB3Peer, fns))]


def remote_variant(
    hosts: Hosts,
    env_id: str,
    kwargs: dict[str, Any],
    num_envs: int,
    num_hosts: int,
    transport: str,
    batch_size: int | None = None,
    name: str | None = None,
    host_args: tuple[str, ...] = (),
    env_threads: int = 1,
) -> Variant:
    """A RemoteVectorEnv on hosts started for it (first-ready when ``batch_size`` is given).

    ``env_threads`` is passed on; ``transport`` ``"embedded"`` leaves the hosts to the client
    (its default layout: ``num_hosts`` is then only the label's).
    """

    def make() -> client.RemoteVectorEnv:
        return client.RemoteVectorEnv(
            env_id=env_id,
            env_kwargs=kwargs,
            num_envs=num_envs,
            hosts=None
            if transport == "embedded"
            else hosts.endpoints(num_hosts, transport, host_args),
            batch_size=batch_size,
            allow_pickle=hosts.allow_pickle or transport == "embedded",
            env_threads=env_threads,
        )

    label = name or f"Remote {transport} {num_hosts} host{'s' if num_hosts > 1 else ''}"
    return Variant(label, make, first_ready=batch_size is not None)


RAW_HOST = """
import json, sys, gymnasium as gym, numpy as np, zmq
envs = [gym.make(sys.argv[2], **json.loads(sys.argv[4])) for _ in range(int(sys.argv[3]))]
socket = zmq.Context().socket(zmq.ROUTER)
socket.bind(sys.argv[1])
print(socket.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
while True:
    identity, request = socket.recv_multipart()
    if request == b"quit":
        break
    if request.startswith(b"reset "):
        seed = int(request.split()[1])
        obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
        socket.send_multipart([identity, np.stack(obs).tobytes()])
        continue
    obs, rewards, flags = [], np.zeros(len(envs)), np.zeros((2, len(envs)), bool)
    for i, (env, action) in enumerate(zip(envs, np.frombuffer(request, np.int64))):
        o, rewards[i], flags[0, i], flags[1, i], _ = env.step(action)
        if flags[0, i] or flags[1, i]:
            o, _ = env.reset()
        obs.append(o)
    socket.send_multipart([identity, np.stack(obs).tobytes(), rewards.tobytes(), flags.tobytes()])
"""


class RawFloor:
    """The floor under any inter-process design in Python over ZeroMQ, for reference.

    Host processes step the same envs with the same actions, but with no protocol, no checks,
    no infos, no sessions and no failure handling: raw bytes of Discrete actions out, of Box
    observations, rewards and flags back. What envserver adds is the gap between it and this.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        num_hosts: int,
        directory: Path,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        kwargs = kwargs or {}
        space = gym.make(env_id, **kwargs).observation_space
        self.obs_dtype, self.obs_shape = space.dtype, space.shape
        counts = even_split(num_envs, num_hosts)  # the envs laid out as RemoteVectorEnv does
        self.slices = [slice(sum(counts[:i]), sum(counts[: i + 1])) for i in range(num_hosts)]
        self.context = zmq.Context()
        self.processes: list[subprocess.Popen] = []
        self.sockets: list[zmq.Socket] = []
        try:
            for i, count in enumerate(counts):
                bind = f"ipc://{directory}/raw{i}.sock"
                self.processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            RAW_HOST,
                            bind,
                            env_id,
                            str(count),
                            json.dumps(kwargs),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
                endpoint = self.processes[-1].stdout.readline().strip()
                if not endpoint:
                    raise RuntimeError(f"raw host {i} did not start")
                self.sockets.append(self.context.socket(zmq.DEALER))
                self.sockets[-1].setsockopt(zmq.LINGER, 0)
                self.sockets[-1].connect(endpoint)
        except BaseException:
            self.close()
            raise

    def _obs(self, frame: bytes) -> np.ndarray:
        return np.frombuffer(frame, self.obs_dtype).reshape(-1, *self.obs_shape)

    def reset(self, seed: int = 0) -> tuple[np.ndarray, dict]:
        """Resets env ``i`` with ``seed + i``."""
        for socket, part in zip(self.sockets, self.slices):
            socket.send(f"reset {seed + part.start}".encode())
        return np.concatenate([self._obs(s.recv()) for s in self.sockets]), {}

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        """Steps every env; one that ends is reset at once (no final observation kept)."""
        actions = np.asarray(actions, dtype=np.int64)
        for socket, part in zip(self.sockets, self.slices):
            socket.send(actions[part].tobytes())
        replies = [s.recv_multipart() for s in self.sockets]
        obs = np.concatenate([self._obs(r[0]) for r in replies])
        rewards = np.concatenate([np.frombuffer(r[1]) for r in replies])
        flags = np.concatenate([np.frombuffer(r[2], bool).reshape(2, -1) for r in replies], axis=1)
        return obs, rewards, flags[0], flags[1], {}

    def close(self) -> None:
        """Stops the host processes."""
        for socket in self.sockets:
            socket.send(b"quit")
            socket.close()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.context.term()


# ---------------------------------------------------------------- measuring


def run_round(variant: Variant, workload: Workload, seconds: float) -> float:
    """Steps ``variant`` for ``seconds`` of wall time; returns env steps per second."""
    env = variant.env
    actions = workload.actions
    num_envs = variant.num_envs or workload.num_envs
    if num_envs != workload.num_envs:
        actions = [a[:num_envs] for a in actions]  # Discrete and Box batches
    steps = 0
    start = time.perf_counter()
    deadline = start + seconds
    if variant.first_ready:
        space = env.single_action_space
        while time.perf_counter() < deadline:
            *_, infos = env.recv()
            ids = infos["env_id"]
            env.send(select(space, actions[steps % len(actions)], ids), ids)
            steps += 1
        return steps * env.batch_size / (time.perf_counter() - start)
    while time.perf_counter() < deadline:
        env.step(actions[steps % len(actions)])
        steps += 1
    return steps * num_envs / (time.perf_counter() - start)


def run_workload(workload: Workload, rounds: int, seconds: float) -> None:
    """Builds every variant, then runs them interleaved, round by round."""
    space = gym.vector.utils.batch_space(
        gym.make(workload.env_id, **workload.kwargs).action_space, workload.num_envs
    )
    space.seed(0)
    workload.actions = [space.sample() for _ in range(256)]
    try:
        for variant in workload.variants:
            started = len(workload.hosts.started)
            try:
                variant.env = variant.make()
                if variant.first_ready:
                    variant.env.async_reset(seed=0)
                else:
                    variant.env.reset(seed=0)
                run_round(variant, workload, min(0.2, seconds))  # warm-up
            except Exception as exc:  # e.g. an env whose infos need pickle: report, go on
                variant.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                print(f"{workload.title}: {variant.name} failed: {variant.error}", file=sys.stderr)
                if variant.env is not None:
                    variant.env.close()
                    variant.env = None
            finally:
                variant.hosts = workload.hosts.started[started:]
        running = [v for v in workload.variants if v.error is None]
        for _ in range(rounds):
            for variant in running:
                variant.rates.append(run_round(variant, workload, seconds))
    except KeyboardInterrupt:  # a Ctrl-C also stops AsyncVectorEnv's workers: close may fail
        for variant in workload.variants:
            if variant.env is not None:
                with contextlib.suppress(Exception):
                    variant.env.close()
                variant.env = None
        raise
    finally:
        for variant in workload.variants:
            if variant.env is not None:
                variant.env.close()


def ratio(workload: Workload | None, name: str, reference: str) -> float | None:
    """The median over rounds of ``name``'s rate over ``reference``'s.

    ``reference`` may name several variants separated by ``|``: the best of them each round
    (of those that ran). None if ``name`` or every reference was left out or failed.
    """
    variants = {v.name: v for v in workload.variants} if workload else {}
    refs = [variants[r].rates for r in reference.split("|") if r in variants and variants[r].rates]
    if name not in variants or not variants[name].rates or not refs:
        return None
    per_round = [rate / max(ref[i] for ref in refs) for i, rate in enumerate(variants[name].rates)]
    return statistics.median(per_round)


def workload_table(workload: Workload) -> str:
    """The markdown table of one workload, with the peak RSS of each env host (while running)."""
    lines = [
        f"### {workload.title}",
        "",
        "| variant | env steps/s (median) | "
        + " | ".join(f"ratio to {r.replace('|', ' or ')}" for r in workload.references)
        + " | peak RSS of each env host (MB) |",
        "|---|---:|" + "---:|" * len(workload.references) + "---|",
    ]
    for variant in workload.variants:
        values = [ratio(workload, variant.name, r) for r in workload.references]
        ratios = " | ".join("-" if v is None else f"{v:.2f}x" for v in values)
        rss = ", ".join(f"{_peak_rss_mb(h.process.pid):.0f}" for h in variant.hosts) or "-"
        rate = (
            f"failed: {variant.error}"
            if variant.error
            else f"{statistics.median(variant.rates):,.0f}"
        )
        lines.append(f"| {variant.name} | {rate} | {ratios} | {rss} |")
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- latency


ECHO_SERVER = """
import sys, zmq
sizes = [int(s) for s in sys.argv[2:]]
reply = [b"\\0" * s for s in sizes]
socket = zmq.Context().socket(zmq.ROUTER)
socket.bind(sys.argv[1])
print(socket.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
while True:
    frames = socket.recv_multipart()
    if frames[1] == b"quit":
        break
    socket.send_multipart([frames[0], *reply])
"""


@contextlib.contextmanager
def echo_server(bind: str, reply_sizes: list[int]) -> Iterator[str]:
    """A ROUTER process answering every message with frames of ``reply_sizes``."""
    process = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, bind, *map(str, reply_sizes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    endpoint = process.stdout.readline().strip()
    try:
        yield endpoint
    finally:
        process.kill()
        process.wait()


def step_message_sizes() -> tuple[list[bytes], list[int]]:
    """The frames of a 1-env CartPole STEP request, and the sizes of its reply's frames."""
    request = encode_request(
        1, Command.STEP, b"s" * 16, {"actions": np.zeros(1, np.int64)}, allow_pickle=True
    )
    reply = encode_reply(
        1,
        Status.OK,
        {
            "obs": np.zeros((1, 4), np.float32),
            "rewards": [0.0],  # a host sends up to 64 values as a plain list
            "terminations": [False],
            "truncations": [False],
            "infos": [],
        },
    )
    return [bytes(memoryview(f)) for f in request], [memoryview(f).nbytes for f in reply]


def latency_section(directory: Path, rounds: int, iterations: int) -> tuple[str, dict]:
    """One-env step round trip against the raw DEALER/ROUTER echo of the same sizes."""
    request, reply_sizes = step_message_sizes()
    hosts = Hosts(directory / "latency")
    results: dict[str, dict[str, list[float]]] = {}
    context = zmq.Context()
    try:
        for transport in ("ipc", "tcp"):
            bind = f"ipc://{directory}/echo.sock" if transport == "ipc" else "tcp://127.0.0.1:*"
            envs = client.RemoteVectorEnv(
                env_id="CartPole-v1", num_envs=1, hosts=hosts.endpoints(1, transport)
            )
            with echo_server(bind, reply_sizes) as endpoint:
                dealer = context.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.connect(endpoint)
                action = np.zeros(1, dtype=np.int64)
                envs.reset(seed=0)
                echo: list[float] = []
                step: list[float] = []
                for _ in range(rounds + 1):  # the first round warms up
                    start = time.perf_counter()
                    for _ in range(iterations):
                        dealer.send_multipart(request)
                        dealer.recv_multipart()
                    echo.append((time.perf_counter() - start) / iterations * 1e6)
                    start = time.perf_counter()
                    for _ in range(iterations):
                        envs.step(action)
                    step.append((time.perf_counter() - start) / iterations * 1e6)
                dealer.send_multipart([b"quit"])
                dealer.close()
            envs.close()
            results[transport] = {"echo": echo[1:], "step": step[1:]}
    finally:
        hosts.stop()
        context.term()
    lines = [
        "### One env: step round trip against the raw ZeroMQ echo floor",
        "",
        "| transport | echo floor (us) | RemoteVectorEnv.step (us) | ratio (median per round) |",
        "|---|---:|---:|---:|",
    ]
    for transport, r in results.items():
        per_round = statistics.median(s / e for s, e in zip(r["step"], r["echo"]))
        lines.append(
            f"| {transport} | {statistics.median(r['echo']):.0f} | "
            f"{statistics.median(r['step']):.0f} | {per_round:.2f}x |"
        )
    lines.append("")
    return "\n".join(lines), results


# ---------------------------------------------------------------- soak


def soak_section(directory: Path, env_steps: int) -> tuple[str, float]:
    """Steps CartPole for ``env_steps`` env steps, sampling the client's RSS."""
    hosts = Hosts(directory / "soak")
    num_envs = 16
    try:
        envs = client.RemoteVectorEnv(
            env_id="CartPole-v1", num_envs=num_envs, hosts=hosts.endpoints(2, "ipc")
        )
        envs.reset(seed=0)
        space = envs.action_space
        space.seed(0)
        actions = [space.sample() for _ in range(64)]
        vector_steps = max(1, env_steps // num_envs)
        warmup = vector_steps // 10
        samples: list[tuple[int, float]] = []
        start = time.perf_counter()
        for t in range(vector_steps):
            envs.step(actions[t % len(actions)])
            if t >= warmup and (t - warmup) % max(1, (vector_steps - warmup) // 10) == 0:
                samples.append((t * num_envs, _current_rss_mb()))
        samples.append((vector_steps * num_envs, _current_rss_mb()))
        elapsed = time.perf_counter() - start
        envs.close()
    finally:
        hosts.stop()
    growth = samples[-1][1] - samples[0][1]
    text = textwrap.dedent(
        f"""\
        ### Soak: {vector_steps * num_envs:,} CartPole env steps, 16 envs, 2 hosts, ipc

        Client RSS after warm-up {samples[0][1]:.1f} MB, at the end {samples[-1][1]:.1f} MB
        (growth {growth:+.1f} MB; samples: {", ".join(f"{m:.1f}" for _, m in samples)}),
        {vector_steps * num_envs / elapsed:,.0f} env steps/s.
        """
    )
    return text, growth


# ---------------------------------------------------------------- plan


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


def _transports(text: str) -> tuple[str, ...]:
    """``"ipc,tcp"`` -> ``("ipc", "tcp")``, for the command line."""
    values = tuple(dict.fromkeys(text.split(",")))
    if not set(values) <= {"ipc", "tcp"}:
        raise argparse.ArgumentTypeError(f"ipc and/or tcp, not {text!r}")
    return values


@dataclass
class Plan:
    """What to run: the issue's workloads (the default), or one env of the user's own."""

    sizes: list[int]  # env counts
    host_counts: list[int]
    quick: bool = False
    env_id: str | None = None  # a user's env: only it is run (no jittery env, no soak)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    transports: tuple[str, ...] = ("ipc", "tcp")
    batch_size: int | None = None  # adds first-ready variants with batches of this size
    allow_pickle: bool = False  # hosts and clients of the RemoteVectorEnv variants


def env_workload(
    directory: Path,
    title: str,
    env_id: str,
    kwargs: dict[str, Any],
    num_envs: int,
    plan: Plan,
    raw_floor: bool = False,
) -> Workload:
    """Gymnasium's vector envs and RemoteVectorEnv in every configuration asked, on one env."""
    hosts = Hosts(directory, plan.allow_pickle)
    variants = gym_variants(env_id, kwargs, num_envs)
    if raw_floor:  # CartPole: SB3's SubprocVecEnv as a peer too
        variants += sb3_variants(env_id, kwargs, num_envs)
    counts = [c for c in plan.host_counts if c <= num_envs]
    for transport in plan.transports:
        for count in counts:
            variants.append(remote_variant(hosts, env_id, kwargs, num_envs, count, transport))
    if plan.batch_size is not None:
        for count in counts:
            variants.append(
                remote_variant(
                    hosts,
                    env_id,
                    kwargs,
                    num_envs,
                    count,
                    plan.transports[0],
                    batch_size=plan.batch_size,
                    name=f"Remote {plan.transports[0]} {count} host{'s' if count > 1 else ''}, "
                    f"first-ready batches of {plan.batch_size}",
                )
            )
    for count in counts if raw_floor else ():  # the overhead workload: show the floor under it
        variants.append(
            remote_variant(
                hosts, env_id, kwargs, num_envs, count, "ipc",
                name=f"Remote ipc {count} host{'s' if count > 1 else ''}, metrics on",
                host_args=("--metrics-port", "0"),
            )  # what counting into Prometheus metrics costs, next to the same without
        )  # fmt: skip
        variants.append(
            Variant(
                f"raw ZeroMQ floor ipc {count} host{'s' if count > 1 else ''}",
                functools.partial(RawFloor, env_id, num_envs, count, directory / f"raw{count}"),
            )
        )
    return Workload(
        f"{title}, {num_envs} envs",
        env_id,
        kwargs,
        num_envs,
        variants,
        ("AsyncVectorEnv shm|AsyncVectorEnv no-shm", "SyncVectorEnv"),
        hosts,
    )


def workloads_of(directory: Path, plan: Plan) -> list[Workload]:
    """The workloads of the run; each gets its own hosts, started as its variants are built."""
    if plan.env_id is not None:
        title = plan.env_id + (f" {json.dumps(plan.env_kwargs)}" if plan.env_kwargs else "")
        return [
            env_workload(directory / f"w{i}", title, plan.env_id, plan.env_kwargs, n, plan)
            for i, n in enumerate(plan.sizes)
        ]
    workloads = []
    envs: list[tuple[str, str, dict[str, Any]]] = [
        ("CartPole-v1", "CartPole-v1", {}),
        (
            "synthetic pixels 84x84x4, 100 us steps",
            "envserver.testing:envserver/Pixels-v0",
            {"step_cost_s": 0.0001},
        ),
    ]
    if not plan.quick and importlib.util.find_spec("ale_py") is not None:
        envs.append(("Atari Pong (ale-py), 210x160x3", "ale_py:ALE/Pong-v5", {}))
    for title, env_id, kwargs in envs[:1] if plan.quick else envs:
        for num_envs in plan.sizes:
            workloads.append(
                env_workload(
                    directory / f"w{len(workloads)}",
                    title,
                    env_id,
                    kwargs,
                    num_envs,
                    plan,
                    raw_floor=env_id == "CartPole-v1",
                )
            )
    jitter_id = "envserver.testing:envserver/Jitter-v0"
    jitter_kwargs = {"step_s": 0.001, "slow_prob": 0.1, "slow_factor": 10.0}
    num_envs, num_hosts = (4, 2) if plan.quick else (16, 4)
    batch = num_envs // 2
    hosts = Hosts(directory / "jitter")
    jitter = functools.partial(
        remote_variant, hosts, jitter_id, jitter_kwargs, num_envs, num_hosts, "ipc"
    )
    workloads.append(
        Workload(
            f"slow jittery env (1 ms steps, 10% of them 10 ms), {num_envs} envs, "
            f"{num_hosts} hosts, ipc",
            jitter_id,
            jitter_kwargs,
            num_envs,
            [
                *gym_variants(jitter_id, jitter_kwargs, num_envs),
                jitter(name="Remote lockstep"),
                jitter(batch_size=batch, name=f"Remote first-ready, batches of {batch}"),
            ],
            ("Remote lockstep", "AsyncVectorEnv shm|AsyncVectorEnv no-shm"),
            hosts,
        )
    )
    return workloads + slow_env_workloads(directory, plan.quick)


#: The slow env of the issue: each step sleeps 1 ms and spends next to no CPU, as an env that
#: waits on I/O, a remote simulator or a C engine releasing the GIL does.
SLOW_ID = "envserver.testing:envserver/Jitter-v0"
SLOW_KWARGS: dict[str, Any] = {"step_s": 0.001, "slow_prob": 0.0}
SLOW_TITLE = "1 ms-step env (sleeps)"


def slow_env_workloads(directory: Path, quick: bool) -> list[Workload]:
    """The 1 ms-step env: host layouts and in-host threads against the others; host scaling.

    The first workload puts RemoteVectorEnv in several layouts (2, 4 and 16 hosts, in-host
    threads, the embedded default with and without ``env_threads``) next to Gymnasium's vector
    envs, SB3's SubprocVecEnv and the raw ZeroMQ floor of the same host counts; the second steps
    8 envs per host on 1 host and on 4 (quick: 2 per host, 1 and 2 hosts).
    """
    num_envs, host_counts = (4, (2, 4)) if quick else (16, (2, 4, 16))
    hosts = Hosts(directory / "slow")
    remote = functools.partial(remote_variant, hosts, SLOW_ID, SLOW_KWARGS, num_envs)
    half = num_envs // 2
    variants = [
        *gym_variants(SLOW_ID, SLOW_KWARGS, num_envs),
        *sb3_variants(SLOW_ID, SLOW_KWARGS, num_envs),
        *(remote(count, "ipc") for count in host_counts),
        remote(1, "ipc", name=f"Remote ipc 1 host, {num_envs} env threads", env_threads=num_envs),
        remote(2, "ipc", name=f"Remote ipc 2 hosts, {half} env threads each", env_threads=half),
        remote(1, "embedded", name="Remote embedded default"),
        remote(
            1,
            "embedded",
            name=f"Remote embedded default, env_threads={num_envs}",
            env_threads=num_envs,
        ),
        *(
            Variant(
                f"raw ZeroMQ floor ipc {count} hosts",
                functools.partial(
                    RawFloor, SLOW_ID, num_envs, count, directory / f"slow{count}", SLOW_KWARGS
                ),
            )
            for count in host_counts
        ),
    ]
    per_host, most = (2, 2) if quick else (8, 4)
    scaling_hosts = Hosts(directory / "scaling")
    one = remote_variant(scaling_hosts, SLOW_ID, SLOW_KWARGS, per_host, 1, "ipc")
    one.num_envs = per_host  # the first envs of the workload's actions
    return [
        Workload(
            f"{SLOW_TITLE}, {num_envs} envs",
            SLOW_ID,
            SLOW_KWARGS,
            num_envs,
            variants,
            ("AsyncVectorEnv shm|AsyncVectorEnv no-shm", "SyncVectorEnv"),
            hosts,
        ),
        Workload(
            f"{SLOW_TITLE}, {per_host} envs per host, 1 and {most} hosts",
            SLOW_ID,
            SLOW_KWARGS,
            per_host * most,
            [
                one,
                remote_variant(scaling_hosts, SLOW_ID, SLOW_KWARGS, per_host * most, most, "ipc"),
            ],
            ("Remote ipc 1 host",),
            scaling_hosts,
        ),
    ]


BEST_ASYNC = "AsyncVectorEnv shm|AsyncVectorEnv no-shm"


def target_row(
    label: str, value: float | None, goal: str = "-", met: Callable[[float], bool] | None = None
) -> str:
    """One row of the targets table: its verdict only where it has a goal and a value."""
    verdict = "-" if met is None or value is None else ("met" if met(value) else "MISSED")
    shown = "n/a" if value is None else f"{value:.2f}"
    return f"| {label} | {shown} | {goal} | {verdict} |"


def slow_env_targets(workloads: list[Workload]) -> list[str]:
    """The 1 ms-step env's rows (their 16-env and 8-envs-per-host workloads: not in --quick)."""
    slow = next((w for w in workloads if w.title == f"{SLOW_TITLE}, 16 envs"), None)
    scaling = next((w for w in workloads if w.title.startswith(f"{SLOW_TITLE}, 8 envs per")), None)
    layouts = [
        (value, v.name)
        for v in (slow.variants if slow else [])
        if v.name.startswith("Remote") and (value := ratio(slow, v.name, BEST_ASYNC)) is not None
    ]
    best, best_name = max(layouts, default=(None, "Remote"))
    threaded_default = "Remote embedded default, env_threads=16"
    scaled = ratio(scaling, "Remote ipc 4 hosts", "Remote ipc 1 host")
    return [
        target_row(
            f"1 ms-step env, 16 envs, best layout ({best_name}) / best AsyncVectorEnv",
            best,
            ">= 1.2",
            lambda v: v >= 1.2,
        ),
        target_row(
            f"1 ms-step env, 16 envs, {threaded_default} / best AsyncVectorEnv",
            ratio(slow, threaded_default, BEST_ASYNC),
            ">= 0.9",
            lambda v: v >= 0.9,
        ),
        *(
            target_row(
                f"(context) 1 ms-step env, 16 envs, {name} / best AsyncVectorEnv",
                ratio(slow, name, BEST_ASYNC),
            )
            for name in (
                "Remote embedded default",
                "SB3 SubprocVecEnv",
                "raw ZeroMQ floor ipc 16 hosts",
            )
        ),
        target_row(
            "1 ms-step env, 8 envs per host, 1 -> 4 hosts: scaling efficiency (rate ratio / 4)",
            None if scaled is None else scaled / 4,
            ">= 0.9",
            lambda v: v >= 0.9,
        ),
    ]


def targets(workloads: list[Workload], latency: dict, soak_growth: float) -> str:
    """The issue's targets, each with this run's value (n/a where its variants did not run).

    Rows marked "(context)" have no goal: they say where a target's value stands.
    """
    by_title = {w.title.split(",")[0] + f", {w.num_envs}": w for w in workloads}
    cart = by_title.get("CartPole-v1, 16")
    pixels = by_title.get("synthetic pixels 84x84x4, 16")
    jitter = next((w for w in workloads if w.title.startswith("slow jittery")), None)
    remote, floor = "Remote ipc 2 hosts", "raw ZeroMQ floor ipc 2 hosts"
    first_ready = jitter.variants[-1].name if jitter else "Remote first-ready"
    rows = [
        *slow_env_targets(workloads),
        target_row(
            f"CartPole 16 envs, {remote} / {floor}",
            ratio(cart, remote, floor),
            ">= 0.85",
            lambda v: v >= 0.85,
        ),
        *(
            target_row(f"(context) CartPole 16 envs, {name} / {ref}", ratio(cart, name, key))
            for name, ref, key in (
                (remote, "best AsyncVectorEnv", BEST_ASYNC),
                (remote, "SyncVectorEnv", "SyncVectorEnv"),
                (floor, "best AsyncVectorEnv", BEST_ASYNC),
            )
        ),
        target_row(
            f"(context) pixels 16 envs, {remote} / AsyncVectorEnv shm",
            ratio(pixels, remote, "AsyncVectorEnv shm"),
        ),
        target_row(
            f"(context) jittery env, {first_ready} / lockstep",
            ratio(jitter, first_ready, "Remote lockstep"),
        ),
    ]
    for transport, r in latency.items():
        value = statistics.median(s / e for s, e in zip(r["step"], r["echo"]))
        rows.append(
            target_row(
                f"one env step / echo floor ({transport})", value, "<= 1.8", lambda v: v <= 1.8
            )
        )
    rows.append(
        target_row(
            "client RSS growth over the soak (MB)",
            soak_growth,
            "flat (< 5 MB)",
            lambda v: abs(v) < 5,
        )
    )
    return "\n".join(
        ["### Targets", "", "| target | measured | goal | |", "|---|---:|---|---|", *rows, ""]
    )


def run_report(args: argparse.Namespace, plan: Plan, stamp: str, sections: list[str]) -> None:
    """Runs the benchmark, printing each section and adding it to ``sections`` as it is done."""
    rounds = args.rounds or (2 if args.quick else 5)
    seconds = args.round_seconds or (0.1 if args.quick else 1.0)
    soak_steps = args.soak_steps or (2_000 if args.quick else 1_000_000)
    with tempfile.TemporaryDirectory(prefix="envserver-bench-") as tmp:
        directory = Path(tmp)
        latency_text, latency = latency_section(directory, rounds, 200 if args.quick else 2000)
        floor = min(statistics.median(r["echo"]) for r in latency.values())
        phase = (
            "quiet enough"
            if floor <= BAD_PHASE_FACTOR * QUIET_ECHO_FLOOR_US
            else f"BAD PHASE (floor over {BAD_PHASE_FACTOR:.0f}x the quiet "
            f"{QUIET_ECHO_FLOOR_US:.0f} us): the ratios below are not comparable; repeat the run"
        )
        sections += [
            f"# envserver benchmark, {stamp}",
            "",
            f"**Echo floor this run: {floor:.0f} us** (raw ZeroMQ DEALER/ROUTER round trip of a "
            f"step's message sizes) - {phase}.",
            "",
            f"{rounds} interleaved rounds of {seconds:g} s per variant; rates are medians over "
            "rounds, ratios are medians of per-round ratios. Python "
            f"{sys.version.split()[0]}, gymnasium {gym.__version__}, numpy {np.__version__}, "
            f"pyzmq {zmq.__version__}.",
            "",
        ]
        print("\n".join(sections), flush=True)
        print(latency_text, flush=True)
        workloads = [
            w for w in workloads_of(directory, plan) if not args.only or args.only in w.title
        ]
        for workload in workloads:
            try:
                run_workload(workload, rounds, seconds)
                table = workload_table(workload)
            finally:
                workload.hosts.stop()
            print(table, flush=True)
            sections.append(table)
        sections.append(latency_text)
        if plan.env_id is None:  # the soak and targets are about the standard workloads
            soak_text, growth = soak_section(directory, soak_steps)
            summary = targets(workloads, latency, growth)
            print(soak_text, summary, sep="\n", flush=True)
            sections += [soak_text, summary]
        client_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        footer = f"Client peak RSS over the whole run: {client_rss:.0f} MB.\n"
        print(footer)
        sections.append(footer)


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and writes its markdown report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5; quick 2)")
    parser.add_argument(
        "--round-seconds", type=float, help="seconds per variant per round (default 1.0)"
    )
    parser.add_argument("--soak-steps", type=int, help="env steps of the soak (default 1M)")
    parser.add_argument("--out", type=Path, help="where to write the markdown table")
    parser.add_argument(
        "--only", metavar="TEXT", help="run only the workloads whose title contains TEXT"
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
        "--batch-size", type=int, help="also run first-ready batches of this size, per host count"
    )
    own.add_argument(
        "--allow-pickle",
        action="store_true",
        help="hosts and clients may pickle what the codec cannot carry (custom spaces, objects "
        "in infos); only for hosts you trust",
    )
    args = parser.parse_args(argv)
    Hosts.extra_args = tuple(shlex.split(args.host_args))
    sizes = args.num_envs or ([4] if args.quick else [8, 16])
    if args.env is None and args.env_kwargs:
        parser.error("--env-kwargs needs --env")
    if args.hosts and max(args.hosts) > min(sizes):
        parser.error(f"--hosts: no more hosts than envs ({min(sizes)})")
    if args.batch_size is not None and not 1 <= args.batch_size <= min(sizes):
        parser.error(f"--batch-size must be between 1 and the smallest env count ({min(sizes)})")
    if args.env is not None:
        try:
            gym.make(args.env, **args.env_kwargs).close()
        except Exception as exc:
            parser.error(f"--env: cannot make {args.env}: {type(exc).__name__}: {exc}")
    plan = Plan(
        sizes=sizes,
        host_counts=args.hosts or ([1] if args.quick else [1, 2, 4]),
        quick=args.quick,
        env_id=args.env,
        env_kwargs=args.env_kwargs,
        transports=args.transports,
        batch_size=args.batch_size,
        allow_pickle=args.allow_pickle,
    )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / f"bench-{stamp}.md"
    sections: list[str] = []  # the report so far
    try:
        with signals_interrupt():
            run_report(args, plan, stamp, sections)
    except Interrupted as exc:  # Ctrl-C or SIGTERM: hosts stopped, temporary directory removed
        sections.append(f"**Interrupted ({exc.signal_name}): a partial report.**\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(sections))
        print(f"bench: interrupted ({exc.signal_name}); the partial report is in {out}")
        return exit_status(exc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(sections))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
