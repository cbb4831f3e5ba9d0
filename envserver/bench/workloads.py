"""What a run measures: the standard workloads (or one env of the user's) and their variants."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from envserver import client
from envserver.bench.agents import agents_workload
from envserver.bench.envs import COMPUTE_ID, calibrate_work
from envserver.bench.floors import RawFloor
from envserver.bench.variants import (
    Extra,
    Hosts,
    Variant,
    Workload,
    gym_variants,
    puffer_variants,
    remote_variant,
    sb3_variants,
)

__all__ = [
    "BEST_ASYNC",
    "COMPUTE_TITLE",
    "DEFAULTS_NUM_ENVS",
    "DEFAULTS_TITLE",
    "MANY_HOSTS",
    "SLOW_ID",
    "SLOW_KWARGS",
    "SLOW_TITLE",
    "Plan",
    "defaults_workloads",
    "forked_name",
    "one_env_per_host_workload",
    "processes_name",
    "slow_env_workloads",
    "workloads_of",
]

#: The synthetic pixel env (Atari-sized frames).
PIXELS_ID = "envserver.testing:envserver/Pixels-v0"
#: Local hosts as ``make_vec`` starts them with no options.
EMBEDDED = "make_vec (local hosts), no options"

#: What the Atari workload needs.
ATARI = Extra("bench", ("ale_py",), "ale-py")

#: The best of Gymnasium's AsyncVectorEnv variants, as a ratio's reference.
BEST_ASYNC = "AsyncVectorEnv shm|AsyncVectorEnv no-shm"


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
    embedded: bool = False,
    needs: Extra | None = None,
    puffer: bool = False,
) -> Workload:
    """Gymnasium's vector envs and RemoteVectorEnv in every configuration asked, on one env.

    ``embedded`` adds ``make_vec`` with local hosts as a user gets them, with and without
    shared memory (their channels, and the observations' slab), with one local host (where
    it and the trainer each have a core, their channel's waits spin first), and with the run's
    first-ready batches if it has some. ``puffer`` adds
    PufferLib's Multiprocessing (skipped where pufferlib is not installed). The workload is
    skipped where ``needs`` is missing.
    """
    hosts = Hosts(directory, plan.allow_pickle)
    if needs is not None and (why := needs.missing()) is not None:
        references = (BEST_ASYNC, "SyncVectorEnv")
        title = f"{title}, {num_envs} envs"
        return Workload(title, env_id, kwargs, num_envs, [], references, hosts, skipped=why)
    variants = gym_variants(env_id, kwargs, num_envs)
    if embedded:
        make = functools.partial(client.make_vec, env_id, num_envs, **kwargs)
        variants += [
            Variant(EMBEDDED, make),
            Variant(f"{EMBEDDED}, shared_memory=False",
                    functools.partial(make, vector_kwargs={"shared_memory": False})),
            Variant(f"{EMBEDDED}, num_local_hosts=1",
                    functools.partial(make, vector_kwargs={"num_local_hosts": 1})),
        ]  # fmt: skip
        if plan.batch_size is not None:  # first-ready on the local hosts a user gets
            batch = {"batch_size": plan.batch_size}
            variants.append(
                Variant(f"{EMBEDDED}, batch_size={plan.batch_size}",
                        functools.partial(make, vector_kwargs=batch), first_ready=True)
            )  # fmt: skip
    if raw_floor:  # CartPole: SB3's SubprocVecEnv as a peer too
        variants += sb3_variants(env_id, kwargs, num_envs)
    if puffer:
        variants += puffer_variants(env_id, kwargs, num_envs)
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
            remote_variant(
                hosts, env_id, kwargs, num_envs, count, "ipc",
                name=f"Remote ipc {count} host{'s' if count > 1 else ''}, env output off",
                forward_env_output=False,
            )  # what hearing the envs costs (on by default), when they say nothing
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
        (BEST_ASYNC, "SyncVectorEnv"),
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
        ("synthetic pixels 84x84x4, 100 us steps", PIXELS_ID, {"step_cost_s": 0.0001}),
    ]
    if not plan.quick:
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
                    embedded=env_id in (PIXELS_ID, "CartPole-v1"),
                    puffer=env_id in (PIXELS_ID, "CartPole-v1"),
                    needs=ATARI if env_id.startswith("ale_py:") else None,
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
            ("Remote lockstep", BEST_ASYNC),
            hosts,
        )
    )
    workloads.append(agents_workload(directory / "agents"))  # skipped without the bench extra
    return (
        workloads
        + slow_env_workloads(directory, plan.quick)
        + defaults_workloads(directory / "defaults")
    )


#: The slow env of the issue: each step sleeps 1 ms and spends next to no CPU, as an env that
#: waits on I/O, a remote simulator or a C engine releasing the GIL does.
SLOW_ID = "envserver.testing:envserver/Jitter-v0"
SLOW_KWARGS: dict[str, Any] = {"step_s": 0.001, "slow_prob": 0.0}
SLOW_TITLE = "1 ms-step env (sleeps)"


def slow_env_workloads(directory: Path, quick: bool) -> list[Workload]:
    """The 1 ms-step env: host layouts and in-host threads against the others; host scaling.

    The first workload puts RemoteVectorEnv in several layouts (2, 4 and 16 hosts stepping
    their envs in turn, in-host threads, the embedded default: automatic, in turn, and with
    ``env_threads``) next to Gymnasium's vector
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
        *(
            remote(count, "ipc", name=f"Remote ipc {count} hosts, in turn", env_threads=1)
            for count in host_counts
        ),
        remote(1, "ipc", name=f"Remote ipc 1 host, {num_envs} env threads", env_threads=num_envs),
        remote(2, "ipc", name=f"Remote ipc 2 hosts, {half} env threads each", env_threads=half),
        remote(1, "embedded", name="Remote embedded default"),  # automatic env threads
        remote(1, "embedded", name="Remote embedded default, in turn", env_threads=1),
        remote(  # the same layout on hosts forked from one parent, not spawned interpreters
            num_envs,
            "embedded",
            name=forked_name(num_envs),
            env_threads=1,
            num_local_hosts=num_envs,
        ),
        remote(num_envs, "processes", name=processes_name(num_envs), env_threads=1),
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
    wide = [] if quick else [one_env_per_host_workload(directory, MANY_HOSTS)]
    scaling_hosts = Hosts(directory / "scaling")
    # Hosts scaling, not threads: each host steps its envs in turn.
    one = remote_variant(scaling_hosts, SLOW_ID, SLOW_KWARGS, per_host, 1, "ipc", env_threads=1)
    one.num_envs = per_host  # the first envs of the workload's actions
    return [
        Workload(
            f"{SLOW_TITLE}, {num_envs} envs",
            SLOW_ID,
            SLOW_KWARGS,
            num_envs,
            variants,
            (BEST_ASYNC, "SyncVectorEnv"),
            hosts,
        ),
        Workload(
            f"{SLOW_TITLE}, {per_host} envs per host, 1 and {most} hosts",
            SLOW_ID,
            SLOW_KWARGS,
            per_host * most,
            [
                one,
                remote_variant(
                    scaling_hosts, SLOW_ID, SLOW_KWARGS, per_host * most, most, "ipc", env_threads=1
                ),
            ],
            ("Remote ipc 1 host",),
            scaling_hosts,
        ),
        *wide,
    ]


#: The hosts of the widest 1 ms-step layout: one env each.
MANY_HOSTS = 64


def forked_name(count: int) -> str:
    """The variant of ``count`` local hosts forked by the trainer's fork server, in turn."""
    return f"Remote local {count} hosts (forked), in turn"


def processes_name(count: int) -> str:
    """The variant of ``count`` hosts forked by one ``envserver serve --processes``, in turn."""
    return f"Remote ipc {count} hosts (serve --processes {count}), in turn"


def one_env_per_host_workload(directory: Path, count: int) -> Workload:
    """The 1 ms-step env, ``count`` envs on ``count`` local hosts (one each), beside the others.

    The raw ZeroMQ floor on as many processes, AsyncVectorEnv and SB3's SubprocVecEnv (one
    process per env each): the trainer's cost per host, not the envs, sets the pace here.
    """
    hosts = Hosts(directory / f"wide{count}")
    remote = functools.partial(remote_variant, hosts, SLOW_ID, SLOW_KWARGS, count, count)
    variants = [
        *(v for v in gym_variants(SLOW_ID, SLOW_KWARGS, count) if v.name != "SyncVectorEnv"),
        *sb3_variants(SLOW_ID, SLOW_KWARGS, count),
        remote("ipc", name=f"Remote ipc {count} hosts", env_threads=1),
        remote("embedded", name=forked_name(count), env_threads=1, num_local_hosts=count),
        remote("processes", name=processes_name(count), env_threads=1),
        Variant(
            f"raw ZeroMQ floor ipc {count} hosts",
            functools.partial(
                RawFloor, SLOW_ID, count, count, directory / f"wide{count}raw", SLOW_KWARGS
            ),
        ),
    ]
    return Workload(
        f"{SLOW_TITLE}, {count} envs, one per host",
        SLOW_ID,
        SLOW_KWARGS,
        count,
        variants,
        (BEST_ASYNC, f"raw ZeroMQ floor ipc {count} hosts"),
        hosts,
    )


#: The env that computes, in the defaults group's titles.
COMPUTE_TITLE = "env that computes (1 ms of pure-Python work per step)"
#: The title every workload of the defaults group starts with.
DEFAULTS_TITLE = "defaults, no options"
#: The env count of the defaults group, --quick included (the defaults may depend on it).
DEFAULTS_NUM_ENVS = 16


def defaults_workloads(directory: Path, num_envs: int = DEFAULTS_NUM_ENVS) -> list[Workload]:
    """What a user gets without choosing: ``make_vec`` with no options against Gymnasium's own.

    ``envserver.client.make_vec(env_id, num_envs)`` (local hosts, every option at its default,
    whatever the defaults are at the time) beside ``AsyncVectorEnv`` and ``SyncVectorEnv`` with
    theirs, on an env that waits (the 1 ms-step env), a cheap env (CartPole) and an env that
    computes (about 1 ms of pure-Python work per step, calibrated on this machine).

    Args:
        directory: Where the workloads' files go (their hosts are the client's own).
        num_envs: The env count.

    Returns:
        One workload per env, titled ``"defaults, no options: <env>, <n> envs"``.
    """
    work = calibrate_work(0.001)
    envs: list[tuple[str, str, dict[str, Any]]] = [
        (SLOW_TITLE, SLOW_ID, SLOW_KWARGS),
        ("CartPole-v1", "CartPole-v1", {}),
        (COMPUTE_TITLE, COMPUTE_ID, {"work": work}),
    ]
    workloads = []
    for i, (title, env_id, kwargs) in enumerate(envs):
        fns = [functools.partial(gym.make, env_id, **kwargs)] * num_envs
        call = ", ".join([repr(env_id), str(num_envs), *(f"{k}={v!r}" for k, v in kwargs.items())])
        note = (
            f"`make_vec({call})` with no options (local hosts, every default of this checkout) "
            "against `AsyncVectorEnv` and `SyncVectorEnv` with theirs."
        )
        workloads.append(
            Workload(
                f"{DEFAULTS_TITLE}: {title}, {num_envs} envs",
                env_id,
                kwargs,
                num_envs,
                [
                    Variant(
                        "make_vec, no options",
                        functools.partial(client.make_vec, env_id, num_envs, **kwargs),
                    ),
                    Variant(  # the default before the hosts chose: what "no slower" compares to
                        "make_vec, env_threads=1",
                        functools.partial(
                            client.make_vec,
                            env_id,
                            num_envs,
                            vector_kwargs={"env_threads": 1},
                            **kwargs,
                        ),
                    ),
                    Variant(
                        "AsyncVectorEnv, defaults",
                        functools.partial(gym.vector.AsyncVectorEnv, fns),
                    ),
                    Variant("SyncVectorEnv", functools.partial(gym.vector.SyncVectorEnv, fns)),
                ],
                ("AsyncVectorEnv, defaults", "SyncVectorEnv"),
                Hosts(directory / f"d{i}"),  # none started: make_vec starts its own
                note=note,
            )
        )
    return workloads
