"""The report's closing sections: the client's memory over a soak, and the targets table."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from envserver import client
from envserver.bench.agents import AGENTS_LOCAL, AGENTS_LOOP, AGENTS_REFERENCE, AGENTS_TITLE
from envserver.bench.floors import LOCAL_HOST, LOCAL_PUFFER, LOCAL_SYNC
from envserver.bench.startup import StartupResults, make_vec_ratio
from envserver.bench.variants import (
    PUFFERLIB,
    Hosts,
    Workload,
    current_rss_mb,
    per_round_ratio,
    ratio,
    why_skipped,
)
from envserver.bench.workloads import (
    BEST_ASYNC,
    COMPUTE_TITLE,
    DEFAULTS_NUM_ENVS,
    DEFAULTS_TITLE,
    EMBEDDED,
    MANY_HOSTS,
    SLOW_TITLE,
    forked_name,
    processes_name,
)

__all__ = ["BEST_ASYNC", "soak_section", "target_row", "targets"]


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
                samples.append((t * num_envs, current_rss_mb()))
        samples.append((vector_steps * num_envs, current_rss_mb()))
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


# ---------------------------------------------------------------- targets


def target_row(
    label: str,
    value: float | None,
    goal: str = "-",
    met: Callable[[float], bool] | None = None,
    skipped: str | None = None,
) -> str:
    """One row of the targets table: its verdict only where it has a goal and a value.

    A row without a value says why where its variants were skipped (``skipped``).
    """
    verdict = "-" if met is None or value is None else ("met" if met(value) else "MISSED")
    shown = f"{value:.2f}" if value is not None else f"n/a ({skipped})" if skipped else "n/a"
    return f"| {label} | {shown} | {goal} | {verdict} |"


def forked_targets(slow: Workload | None, wide: Workload | None) -> list[str]:
    """Context rows: one env per host on hosts forked from one parent.

    Local hosts (the trainer's fork server) and one ``envserver serve --processes``: they stand
    beside the rows on as many spawned ``envserver serve`` processes.
    """
    rows = []
    for count, workload in ((16, slow), (MANY_HOSTS, wide)):
        floor = f"raw ZeroMQ floor ipc {count} hosts"
        refs = (("best AsyncVectorEnv", BEST_ASYNC), ("raw ZeroMQ floor", floor))
        for name in (forked_name(count), processes_name(count)):
            for ref, key in refs:
                value = ratio(workload, name, key)
                rows.append(target_row(f"(context) 1 ms-step env, {name} / {ref}", value))
    return rows


def slow_env_targets(workloads: list[Workload]) -> list[str]:
    """The 1 ms-step env's rows (their 16-env and 8-envs-per-host workloads: not in --quick)."""
    slow = next((w for w in workloads if w.title == f"{SLOW_TITLE}, 16 envs"), None)
    scaling = next((w for w in workloads if w.title.startswith(f"{SLOW_TITLE}, 8 envs per")), None)
    wide = next((w for w in workloads if w.title.endswith(", one per host")), None)
    layouts = [
        (value, v.name)
        for v in (slow.variants if slow else [])
        if v.name.startswith("Remote") and (value := ratio(slow, v.name, BEST_ASYNC)) is not None
    ]
    best, best_name = max(layouts, default=(None, "Remote"))
    automatic = "Remote embedded default"  # the hosts choose their env threads
    scaled = ratio(scaling, "Remote ipc 4 hosts", "Remote ipc 1 host")  # automatic threads
    return [
        target_row(
            f"1 ms-step env, 16 envs, best layout ({best_name}) / best AsyncVectorEnv",
            best,
            ">= 1.2",
            lambda v: v >= 1.2,
        ),
        target_row(
            f"1 ms-step env, 16 envs, {automatic} / best AsyncVectorEnv",
            ratio(slow, automatic, BEST_ASYNC),
            ">= 0.9",
            lambda v: v >= 0.9,
        ),
        *(
            target_row(
                f"(context) 1 ms-step env, 16 envs, {name} / best AsyncVectorEnv",
                ratio(slow, name, BEST_ASYNC),
                skipped=why_skipped(slow, name),
            )
            for name in (
                "Remote embedded default, env_threads=16",
                "Remote embedded default, in turn",
                "SB3 SubprocVecEnv",
                "raw ZeroMQ floor ipc 16 hosts",
            )
        ),
        target_row(
            "1 ms-step env, 16 hosts x 1 env, Remote ipc 16 hosts, in turn / best AsyncVectorEnv",
            ratio(slow, "Remote ipc 16 hosts, in turn", BEST_ASYNC),
            ">= 0.95",
            lambda v: v >= 0.95,
        ),
        target_row(
            "1 ms-step env, 16 hosts x 1 env, Remote ipc 16 hosts, in turn / SB3 SubprocVecEnv",
            ratio(slow, "Remote ipc 16 hosts, in turn", "SB3 SubprocVecEnv"),
            "> 1",
            lambda v: v > 1,
            why_skipped(slow, "SB3 SubprocVecEnv"),
        ),
        *forked_targets(slow, wide),
        target_row(
            f"1 ms-step env, {MANY_HOSTS} local hosts x 1 env, Remote / raw ZeroMQ floor",
            ratio(wide, *(f"{v} ipc {MANY_HOSTS} hosts" for v in ("Remote", "raw ZeroMQ floor"))),
            ">= 0.8",
            lambda v: v >= 0.8,
        ),
        *(
            target_row(
                f"(context) 1 ms-step env, {MANY_HOSTS} envs, {name} / best AsyncVectorEnv",
                ratio(wide, name, BEST_ASYNC),
                skipped=why_skipped(wide, name),
            )
            for name in (f"Remote ipc {MANY_HOSTS} hosts", "SB3 SubprocVecEnv")
        ),
        target_row(
            "1 ms-step env, 8 envs per host, 1 -> 4 hosts: scaling efficiency (rate ratio / 4)",
            None if scaled is None else scaled / 4,
            ">= 0.9",
            lambda v: v >= 0.9,
        ),
    ]


def defaults_targets(workloads: list[Workload], startup: StartupResults) -> list[str]:
    """Issue 20's rows: ``make_vec`` with no options against AsyncVectorEnv's defaults."""
    by_title = {w.title: w for w in workloads if w.title.startswith(DEFAULTS_TITLE)}

    def defaults(env: str, reference: str = "AsyncVectorEnv, defaults") -> float | None:
        workload = by_title.get(f"{DEFAULTS_TITLE}: {env}, {DEFAULTS_NUM_ENVS} envs")
        return ratio(workload, "make_vec, no options", reference)

    ours = "defaults, 16 envs, make_vec no options / AsyncVectorEnv defaults"
    rows = [
        target_row(f"{SLOW_TITLE}: {ours}", defaults(SLOW_TITLE), ">= 0.9", lambda v: v >= 0.9),
        target_row(f"(context) CartPole: {ours}", defaults("CartPole-v1")),
        target_row(f"(context) env that computes: {ours}", defaults(COMPUTE_TITLE)),
        *(
            target_row(
                f"{env}: make_vec no options / make_vec env_threads=1 (in turn, the old default)",
                defaults(env, "make_vec, env_threads=1"),
                ">= 0.95",
                lambda v: v >= 0.95,
            )
            for env in ("CartPole-v1", COMPUTE_TITLE)
        ),
    ]
    for num_envs, goal in ((4, 3.0), (16, 2.0)):
        rows.append(
            target_row(
                f"start-up, {num_envs} envs, make_vec / AsyncVectorEnv default context (time)",
                make_vec_ratio(startup, num_envs, "warm"),
                f"<= {goal:g}",
                lambda v, goal=goal: v <= goal,
            )
        )
        rows.append(
            target_row(
                f"(context) start-up first in a fresh process, {num_envs} envs (time)",
                make_vec_ratio(startup, num_envs, "fresh"),
            )
        )
    return rows


def targets(
    workloads: list[Workload],
    latency: dict,
    soak_growth: float,
    startup: StartupResults | None = None,
    local_latency: dict[str, list[float]] | None = None,
) -> str:
    """The issue's targets, each with this run's value (n/a where its variants did not run).

    Rows marked "(context)" have no goal: they say where a target's value stands.
    ``local_latency`` is :func:`~envserver.bench.floors.local_latency_section`'s.
    """
    by_title = {w.title.split(",")[0] + f", {w.num_envs}": w for w in workloads}
    cart = by_title.get("CartPole-v1, 16")
    pixels = by_title.get("synthetic pixels 84x84x4, 16")
    jitter = next((w for w in workloads if w.title.startswith("slow jittery")), None)
    remote, floor = "Remote ipc 2 hosts", "raw ZeroMQ floor ipc 2 hosts"
    first_ready = jitter.variants[-1].name if jitter else "Remote first-ready"
    rows = [
        *slow_env_targets(workloads),
        *defaults_targets(workloads, startup or {}),
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
            f"(context) CartPole 16 envs, {EMBEDDED} / the same, shared_memory=False",
            ratio(cart, EMBEDDED, f"{EMBEDDED}, shared_memory=False"),
        ),
        target_row(
            f"pixels 16 envs, {EMBEDDED} / AsyncVectorEnv shm",
            ratio(pixels, EMBEDDED, "AsyncVectorEnv shm"),
            ">= 2.0",
            lambda v: v >= 2.0,
        ),
        target_row(
            f"(context) pixels 16 envs, {EMBEDDED} / the same, shared_memory=False",
            ratio(pixels, EMBEDDED, f"{EMBEDDED}, shared_memory=False"),
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
    agents = next((w for w in workloads if w.title.startswith(AGENTS_TITLE)), None)
    rows += [
        target_row(
            f"multi-agent, 16 envs x 8 agents, {AGENTS_LOCAL} / {AGENTS_REFERENCE}",
            ratio(agents, AGENTS_LOCAL, AGENTS_REFERENCE),
            ">= 1.0",
            lambda v: v >= 1.0,
            why_skipped(agents),
        ),
        target_row(
            f"(context) multi-agent, {AGENTS_LOCAL} / {AGENTS_LOOP}",
            ratio(agents, AGENTS_LOCAL, AGENTS_LOOP),
            skipped=why_skipped(agents),
        ),
    ]
    for transport, r in latency.items():
        value = per_round_ratio(r["step"], r["echo"])
        rows.append(
            target_row(
                f"one env step / echo floor ({transport})", value, "<= 1.8", lambda v: v <= 1.8
            )
        )
    rows += local_latency_targets(local_latency or {})
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


def local_latency_targets(times: dict[str, list[float]]) -> list[str]:
    """The one-env round trip on one local host against PufferLib's worker and the process."""

    def per_round(name: str, other: str) -> float | None:
        if not times.get(name) or not times.get(other):
            return None
        return per_round_ratio(times[name], times[other])

    return [
        target_row(
            f"one env round trip, {LOCAL_HOST} / {LOCAL_PUFFER}",
            per_round(LOCAL_HOST, LOCAL_PUFFER),
            "<= 2",
            lambda v: v <= 2,
            None if LOCAL_PUFFER in times else PUFFERLIB.missing(),
        ),
        target_row(
            f"(context) one env round trip, {LOCAL_HOST} / {LOCAL_SYNC}",
            per_round(LOCAL_HOST, LOCAL_SYNC),
        ),
    ]
