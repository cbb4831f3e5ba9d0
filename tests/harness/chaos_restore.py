"""The chaos soak in ``on_host_failure="restore"`` mode: a rollout that must not see its faults.

A trainer steps CartPole envs (short episodes: resets on the way) on the soak's hosts
(tests/harness/chaos.py: spares, some hosts in network namespaces) with
``on_host_failure="restore"``, in lockstep or in first-ready batches (half the envs, the first
to finish), while the fault injector kills, freezes, restarts and cuts hosts, some at once and
some during a recovery. Beside it, ``SyncVectorEnv`` steps the same envs with the same seed and
actions, and never fails (in first-ready batches, one 1-env ``SyncVectorEnv`` per env, each
stepped when its env is sent). What it checks: every step's results (observations, rewards,
terminations, truncations, infos) equal SyncVectorEnv's exactly, no env is ever reported lost,
and every recovery restored its envs (none fell back to making them anew). Half of the steps
send their actions as a numpy array (a lean STEP_RAW in lockstep), the others as a list.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from chaos import WAIT_S, ChaosConfig, chaos_cluster
from chaos_faults import Act, Fault, Injector, Watch
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import SyncVectorEnv

from envserver import client

__all__ = ["RestoreReport", "run_restore"]

#: The envs: short episodes, so that resets (and fresh snapshots) happen under faults too.
ENV_ID, MAX_EPISODE_STEPS = "CartPole-v1", 40

logger = logging.getLogger("chaos")


@dataclasses.dataclass
class RestoreReport:
    """What the rollout did, and every difference from SyncVectorEnv's found."""

    seed: int
    namespaces: str
    first_ready: bool = False
    num_envs: int = 0
    steps: int = 0
    sent_as_lists: int = 0
    faults: list[Fault] = dataclasses.field(default_factory=list)
    recoveries: int = 0
    restored: int = 0
    remade: int = 0
    resumed: int = 0
    reported_lost: int = 0
    host_restarts: int = 0
    seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        """The report, for a person."""
        kinds: dict[str, int] = {}
        for fault in self.faults:
            kinds[fault.kind.value] = kinds.get(fault.kind.value, 0) + 1
        return "\n".join(
            [
                f"restore mode, {'first-ready' if self.first_ready else 'lockstep'}: "
                f"{self.seconds:.1f} s, {self.num_envs} envs, seed {self.seed}, {self.namespaces}",
                f"  faults: {len(self.faults)} ({kinds}), {sum(f.hit for f in self.faults)} on "
                f"envs' hosts, {sum(f.during_recovery for f in self.faults)} during a recovery",
                f"  steps: {self.steps} vector steps ({self.sent_as_lists} sent as lists)",
                f"  recoveries: {self.recoveries} begun: {self.restored} restored, "
                f"{self.resumed} resumed, {self.remade} made anew (host_restarts "
                f"{self.host_restarts}); envs reported lost: {self.reported_lost}",
                f"  differences from SyncVectorEnv: {len(self.problems)}",
                *(f"    {problem}" for problem in self.problems[:20]),
            ]
        )


def run_restore(
    directory: Path,
    config: ChaosConfig,
    plan: Callable[[random.Random, bool], Iterable[Act]],
    seconds: float,
    snapshot_every: int = 10,
    first_ready: bool = False,
) -> RestoreReport:
    """The rollout under the faults of ``plan`` (from the generator and whether links can be
    cut), at most ``seconds`` long, then 20 steps more with every fault healed."""
    rng = random.Random(config.seed)
    with chaos_cluster(directory, config) as (cluster, unavailable):
        namespaces = unavailable or "hosts in namespaces too"
        report = RestoreReport(config.seed, namespaces, first_ready)
        num_envs = config.envs_per_host * len(cluster.active)
        report.num_envs = num_envs
        watch = Watch()
        client_logger = logging.getLogger("envserver.client")
        client_logger.addHandler(watch)
        envs = client.RemoteVectorEnv(
            env_id=ENV_ID,
            env_kwargs={"max_episode_steps": MAX_EPISODE_STEPS},
            num_envs=num_envs,
            hosts=[host.endpoint for host in cluster.active],
            on_host_failure="restore",
            snapshot_every=snapshot_every,
            spare_hosts=[host.endpoint for host in cluster.spares],
            host_timeout_s=config.host_timeout_s,
            restart_timeout_s=config.restart_timeout_s,
            batch_size=num_envs // 2 if first_ready else None,
        )
        rollout = (FirstReadyRollout if first_ready else LockstepRollout)(
            envs, report, np.random.default_rng(rng.randrange(2**31))
        )
        done_at = [time.monotonic()]
        injector = Injector(
            cluster,
            rng,
            config.host_timeout_s,
            watch,
            lambda: set(envs.hosts),
            lambda: done_at[-1],
        )
        started = time.monotonic()

        def step() -> None:
            rollout.step()
            report.steps += 1
            done_at.append(time.monotonic())

        try:
            rollout.start(rng.randrange(2**31))
            injector.start(plan(rng, not unavailable))
            while not injector.finished.is_set() and time.monotonic() - started < seconds:
                step()
            injector.stop()
            for _ in range(20):
                step()
        except Exception as exc:
            logger.exception("the rollout failed")
            report.problems.append(f"the rollout failed: {exc!r}")
        finally:
            injector.stop()
            report.host_restarts = envs.host_restarts
            envs.close()
            rollout.close()
            client_logger.removeHandler(watch)
            (directory / "client-restore.log").write_text("\n".join(watch.lines) + "\n")
        if injector.error is not None:
            report.problems.append(f"the fault injector failed: {injector.error!r}")
        report.faults = injector.faults
        report.recoveries, report.restored = watch.begun, watch.restores
        report.remade, report.resumed = watch.remakes, watch.resumed
        report.seconds = time.monotonic() - started
        if report.remade:
            report.problems.append(f"{report.remade} recoveries made envs anew, fresh")
        if report.reported_lost:
            report.problems.append(f"{report.reported_lost} envs reported lost")
    return report


def _oracle(num_envs: int) -> SyncVectorEnv:
    make = functools.partial(gym.make, ENV_ID, max_episode_steps=MAX_EPISODE_STEPS)
    return SyncVectorEnv([make] * num_envs)


def _sent(actions: np.ndarray, rng: np.random.Generator, report: RestoreReport) -> Any:
    """The actions as sent: the array, or (half the time) a list."""
    if rng.random() < 0.5:
        report.sent_as_lists += 1
        return actions.tolist()
    return actions


def _note(got: Any, expected: Any, report: RestoreReport) -> None:
    """Notes envs reported lost, and a difference from the oracle's results."""
    if "host_failure" in got[4]:
        report.reported_lost += int(got[4]["_host_failure"].sum())
    if not data_equivalence(got, expected, exact=True):
        report.problems.append(f"step {report.steps}: results differ from SyncVectorEnv's")


class LockstepRollout:
    """Lockstep steps of every env, beside one SyncVectorEnv."""

    def __init__(
        self, envs: client.RemoteVectorEnv, report: RestoreReport, rng: np.random.Generator
    ) -> None:
        self.envs, self.report, self.rng = envs, report, rng
        self.oracle = _oracle(envs.num_envs)

    def start(self, seed: int) -> None:
        if not data_equivalence(
            self.envs.reset(seed=seed), self.oracle.reset(seed=seed), exact=True
        ):
            self.report.problems.append("the first reset differs from SyncVectorEnv's")

    def step(self) -> None:
        actions = self.rng.integers(0, 2, self.envs.num_envs)
        self.envs.step_async(_sent(actions, self.rng, self.report))
        got = self.envs.step_wait(timeout=WAIT_S)
        _note(got, self.oracle.step(actions), self.report)

    def close(self) -> None:
        self.oracle.close()


class FirstReadyRollout:
    """First-ready batches (``recv``, then ``send`` to the envs received), beside one 1-env
    SyncVectorEnv per env, stepped when its env is sent."""

    def __init__(
        self, envs: client.RemoteVectorEnv, report: RestoreReport, rng: np.random.Generator
    ) -> None:
        self.envs, self.report, self.rng = envs, report, rng
        self.oracles = [_oracle(1) for _ in range(envs.num_envs)]
        self.expected: list[Any] = []  # each env's oracle's last results

    def start(self, seed: int) -> None:
        self.expected = [oracle.reset(seed=seed + i) for i, oracle in enumerate(self.oracles)]
        self.envs.async_reset(seed=seed)

    def step(self) -> None:
        obs, rewards, terminations, truncations, infos = self.envs.recv(timeout=WAIT_S)
        if "host_failure" in infos:
            self.report.reported_lost += int(infos["_host_failure"].sum())
        ids = infos["env_id"].tolist()
        for k, i in enumerate(ids):
            expected = self.expected[i]
            if len(expected) == 2:  # a reset's results: no reward, no flags
                want = (expected[0][0], np.float64(0), np.bool_(False), np.bool_(False))
            else:
                want = tuple(column[0] for column in expected[:4])
            got = (obs[k], rewards[k], terminations[k], truncations[k])
            if not data_equivalence(got, want, exact=True):
                self.report.problems.append(
                    f"step {self.report.steps}: env {i}'s results differ from SyncVectorEnv's"
                )
        actions = self.rng.integers(0, 2, len(ids))
        for i, action in zip(ids, actions):
            self.expected[i] = self.oracles[i].step(np.array([action]))
        self.envs.send(_sent(actions, self.rng, self.report), ids)

    def close(self) -> None:
        for oracle in self.oracles:
            oracle.close()
