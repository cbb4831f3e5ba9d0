"""The benchmark's vocabulary: variants, workloads, their env hosts, and how a workload is run.

A workload is built, then its variants run interleaved, round by round (see
:mod:`envserver.bench.run`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import multiprocessing
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from envserver import client
from envserver.cli.interrupts import closing_mid_call
from envserver.testing import HostProcess, start_host
from envserver.wire.batching import select

__all__ = [
    "METRICS",
    "PUFFERLIB",
    "SB3",
    "Extra",
    "Hosts",
    "Variant",
    "Workload",
    "current_rss_mb",
    "even_split",
    "gym_variants",
    "peak_rss_mb",
    "per_round_ratio",
    "puffer_variants",
    "ratio",
    "remote_variant",
    "run_round",
    "run_workload",
    "sb3_variants",
    "why_skipped",
    "workload_table",
]


@dataclass(frozen=True)
class Extra:
    """Optional packages that a part of the benchmark needs, and the extra that installs them.

    Attributes:
        name: The extra: ``pip install 'envserver[NAME]'``.
        modules: The modules the part imports.
        packages: The packages as pip names them, for the line that says what is missing.
    """

    name: str
    modules: tuple[str, ...]
    packages: str

    def missing(self) -> str | None:
        """Why a part that needs these is skipped here; None when every module is installed."""
        if all(importlib.util.find_spec(module) is not None for module in self.modules):
            return None
        return f"needs {self.packages}: pip install 'envserver[{self.name}]'"


#: SB3's SubprocVecEnv, a peer of the others.
SB3 = Extra("sb3", ("stable_baselines3",), "stable-baselines3")
#: PufferLib's Multiprocessing vectorization, a peer on CartPole and the pixel env.
PUFFERLIB = Extra("puffer", ("pufferlib",), "pufferlib-core")
#: Hosts that serve Prometheus metrics (``--metrics-port``).
METRICS = Extra("metrics", ("prometheus_client",), "prometheus-client")


@dataclass
class Variant:
    """One vector env implementation under test, and its measured rates.

    A variant whose ``skipped`` says why it cannot run here (an extra not installed) is listed
    under its workload's table, never built.
    """

    name: str
    make: Callable[[], Any]
    first_ready: bool = False
    env: Any = None
    rates: list[float] = field(default_factory=list)
    hosts: list[HostProcess] = field(default_factory=list)  # the env hosts started for it
    error: str | None = None  # why it could not be built, if it could not
    num_envs: int | None = None  # fewer envs than the workload's (the first ones), if set
    skipped: str | None = None  # why it does not run here, if it does not


@dataclass
class Workload:
    """An env, an env count, and the variants compared on it.

    The variants that cannot run here are kept apart, in ``skipped_variants``; a workload whose
    ``skipped`` says why it cannot run at all (an extra not installed) is only its title and
    that line in the report.
    """

    title: str
    env_id: str
    kwargs: dict[str, Any]
    num_envs: int
    variants: list[Variant]
    references: tuple[str, ...]
    hosts: Hosts
    actions: list[Any] = field(default_factory=list)
    note: str = ""  # a line printed under the title, if any
    action_space: gym.Space | None = None  # the batched actions' (None: the env id's, batched)
    skipped: str | None = None  # why it does not run here, if it does not
    skipped_variants: list[Variant] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.skipped_variants = [v for v in self.variants if v.skipped]
        self.variants = [v for v in self.variants if not v.skipped]


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
        #: The ``serve --processes`` parents started (not hosts: no RSS of their own to show).
        self.parents: list[HostProcess] = []

    def endpoints(self, count: int, transport: str, more: tuple[str, ...] = ()) -> list[str]:
        """Starts ``count`` hosts (with ``more`` serve arguments) and returns their endpoints.

        ``transport`` is ``ipc``, ``tcp``, or ``processes``: ipc hosts forked by one ``envserver
        serve --processes`` (stopping it stops them).
        """
        bind = "tcp://127.0.0.1:*" if transport == "tcp" else None
        args = [*self.extra_args, *more, *(["--allow-pickle"] if self.allow_pickle else [])]
        if transport == "processes":  # one ipc `envserver serve --processes count` forks them
            self.parents.append(start_host(self.directory, "--processes", str(count), *args))
            return self.parents[-1].served(count)
        endpoints = []
        for _ in range(count):
            self.started.append(start_host(self.directory, *args, bind=bind))  # stopped by stop()
            endpoints.append(self.started[-1].endpoint)
        return endpoints

    def stop(self) -> None:
        """Stops every host started."""
        for host in self.started + self.parents:
            host.stop()
        self.started, self.parents = [], []


def peak_rss_mb(pid: int) -> float:
    """The peak resident set size of process ``pid`` (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def current_rss_mb() -> float:
    """This process's resident set size now."""
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

    Its processes start as AsyncVectorEnv's do here, by the default start method (fork on Linux
    before Python 3.14), not from SB3's default, the fork server: each process started there
    imports SB3, and torch with it, seconds of CPU before its first step. The steps are the same.
    Only the calls the benchmark makes: ``reset(seed=...)``, ``step``, ``close``.
    """

    def __init__(self, fns: list[Callable[[], gym.Env]]) -> None:
        from stable_baselines3.common.vec_env import SubprocVecEnv

        self.env = SubprocVecEnv(fns, start_method=multiprocessing.get_start_method())

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
    """SB3's SubprocVecEnv on the same envs (skipped where stable-baselines3 is not installed)."""
    fns = [functools.partial(gym.make, env_id, **kwargs)] * num_envs
    return [Variant("SB3 SubprocVecEnv", functools.partial(SB3Peer, fns), skipped=SB3.missing())]


class PufferPeer:
    """PufferLib's ``Multiprocessing`` vectorization (``num_workers`` processes), as a peer.

    Each env is a Gymnasium env wrapped in PufferLib's ``GymnasiumPufferEnv``, as PufferLib does
    for Gymnasium envs; ``num_envs / num_workers`` of them step in turn in each worker, every
    worker in each batch (``batch_size=num_envs``: lockstep, as the others here). PufferLib
    refuses more workers than physical cores unless told to overwork: told here, so that the
    layout measured is the one named on any machine. Its workers and its ``recv`` wait by
    spinning on shared memory (a worker keeps spinning 0.5 s after its last step, then polls
    every 10 ms): on a machine with fewer cores than workers + 1, they compete with each other.
    Only the calls the benchmark makes: ``reset(seed=...)``, ``step``, ``close``.
    """

    def __init__(self, fn: Callable[[], gym.Env], num_envs: int, num_workers: int) -> None:
        import pufferlib.emulation
        import pufferlib.vector

        # Its workers are forked with this process's signal handlers, and PufferLib stops them
        # with SIGTERM: the default action there, not the benchmark's handler (a traceback each).
        previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            self.env = pufferlib.vector.make(
                functools.partial(pufferlib.emulation.GymnasiumPufferEnv, env_creator=fn),
                num_envs=num_envs,
                num_workers=num_workers,
                batch_size=num_envs,
                backend=pufferlib.vector.Multiprocessing,
                overwork=True,
            )
        finally:
            signal.signal(signal.SIGTERM, previous)

    def reset(self, seed: int | None = None) -> Any:
        """Resets every env (worker ``w`` seeds its env ``i`` with ``seed + w + i``)."""
        return self.env.reset(seed=0 if seed is None else seed)

    def step(self, actions: Any) -> Any:
        """Steps every env: observations, rewards, terminals, truncations and a list of infos.

        PufferLib resets a finished env at its next step (Gymnasium's next-step autoreset).
        """
        return self.env.step(actions)

    def close(self) -> None:
        """Stops the worker processes (PufferLib terminates them) and reaps them."""
        self.env.close()
        for process in self.env.processes:
            process.join(timeout=10)


def puffer_variants(env_id: str, kwargs: dict[str, Any], num_envs: int) -> list[Variant]:
    """PufferLib's Multiprocessing on the same envs: 1 worker, and 2 when ``num_envs`` is even.

    Skipped where pufferlib is not installed.
    """
    fn = functools.partial(gym.make, env_id, **kwargs)
    skipped = PUFFERLIB.missing()
    layouts = [(1, num_envs), *([(2, num_envs // 2)] if num_envs % 2 == 0 else [])]
    return [
        Variant(
            f"PufferLib Multiprocessing, {workers} worker{'s' if workers > 1 else ''} x {per}",
            functools.partial(PufferPeer, fn, num_envs, workers),
            skipped=skipped,
        )
        for workers, per in layouts
    ]


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
    env_threads: int | None = None,
    forward_env_output: bool | None = None,
    num_local_hosts: int | None = None,
) -> Variant:
    """A RemoteVectorEnv on hosts started for it (first-ready when ``batch_size`` is given).

    ``env_threads`` and ``forward_env_output`` are passed on (None: the defaults); ``transport``
    ``"embedded"`` leaves the hosts to the client (forked by its fork server; its default layout
    unless ``num_local_hosts`` is given: ``num_hosts`` is then only the label's).
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
            forward_env_output=forward_env_output,
            num_local_hosts=num_local_hosts,
        )

    label = name or f"Remote {transport} {num_hosts} host{'s' if num_hosts > 1 else ''}"
    skipped = METRICS.missing() if "--metrics-port" in host_args else None
    return Variant(label, make, first_ready=batch_size is not None, skipped=skipped)


# ---------------------------------------------------------------- measuring


def run_round(variant: Variant, workload: Workload, seconds: float) -> float:
    """Steps ``variant`` for ``seconds`` of wall time; returns env steps per second.

    At least one step, however short the round or busy the machine: a rate is never 0 (the
    ratios divide by it).
    """
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
        while steps == 0 or time.perf_counter() < deadline:
            *_, infos = env.recv()
            ids = infos["env_id"]
            env.send(select(space, actions[steps % len(actions)], ids), ids)
            steps += 1
        return steps * env.batch_size / (time.perf_counter() - start)
    while steps == 0 or time.perf_counter() < deadline:
        env.step(actions[steps % len(actions)])
        steps += 1
    return steps * num_envs / (time.perf_counter() - start)


def run_workload(
    workload: Workload, rounds: int, seconds: float, check: Callable[[], None] = lambda: None
) -> None:
    """Builds every variant, then runs them interleaved, round by round.

    ``check`` is called after each variant's round: it raises to stop (a Ctrl-C whose exception
    pyzmq dropped, see :class:`envserver.cli.interrupts.Interrupts`). A skipped workload is
    not run.
    """
    if workload.skipped:
        return
    space = workload.action_space or gym.vector.utils.batch_space(
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
            check()
        running = [v for v in workload.variants if v.error is None]
        for _ in range(rounds):
            for variant in running:
                variant.rates.append(run_round(variant, workload, seconds))
                check()
    except KeyboardInterrupt:  # a Ctrl-C also stops AsyncVectorEnv's workers: close may fail
        for variant in workload.variants:
            if variant.env is not None:
                with contextlib.suppress(Exception), closing_mid_call():
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
    best = [max(ref[i] for ref in refs) for i in range(len(variants[name].rates))]
    return per_round_ratio(variants[name].rates, best)


def per_round_ratio(values: Sequence[float], references: Sequence[float]) -> float:
    """The median over rounds of each round's value over that round's reference."""
    return statistics.median(value / ref for value, ref in zip(values, references))


def why_skipped(workload: Workload | None, *names: str) -> str | None:
    """Why ``workload``, or its variant of one of ``names``, was skipped here (None if not).

    ``names`` may hold ``|``, as :func:`ratio`'s do.
    """
    if workload is None:
        return None
    if workload.skipped:
        return workload.skipped
    wanted = {part for name in names for part in name.split("|")}
    return next((v.skipped for v in workload.skipped_variants if v.name in wanted), None)


def workload_table(workload: Workload) -> str:
    """The markdown table of one workload, with the peak RSS of each env host (while running).

    Under it, the variants skipped here and why; a skipped workload has only that line.
    """
    if workload.skipped:
        return f"### {workload.title}\n\nSkipped: {workload.skipped}.\n"
    lines = [
        f"### {workload.title}",
        "",
        *([workload.note, ""] if workload.note else []),
        "| variant | env steps/s (median) | "
        + " | ".join(f"ratio to {r.replace('|', ' or ')}" for r in workload.references)
        + " | peak RSS of each env host (MB) |",
        "|---|---:|" + "---:|" * len(workload.references) + "---|",
    ]
    for variant in workload.variants:
        values = [ratio(workload, variant.name, r) for r in workload.references]
        ratios = " | ".join("-" if v is None else f"{v:.2f}x" for v in values)
        rss = ", ".join(f"{peak_rss_mb(h.process.pid):.0f}" for h in variant.hosts) or "-"
        rate = (
            f"failed: {variant.error}"
            if variant.error
            else f"{statistics.median(variant.rates):,.0f}"
        )
        lines.append(f"| {variant.name} | {rate} | {ratios} | {rss} |")
    lines.append("")
    if workload.skipped_variants:
        why = "; ".join(f"{v.name} ({v.skipped})" for v in workload.skipped_variants)
        lines += [f"Skipped: {why}.", ""]
    return "\n".join(lines)
