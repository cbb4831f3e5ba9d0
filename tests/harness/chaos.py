"""A chaos soak: a long rollout on hosts that keep failing, with every env step accounted for.

A trainer steps ``chaos/Counter-v0`` envs (tests/harness/chaos_envs.py: each instance names
itself and counts its calls) on hosts started with ``envserver serve --import chaos_envs``, with
``on_host_failure="restart"`` and spare hosts, first in lockstep (``step``), then in first-ready
batches (``send``/``recv`` with ``batch_size``). Half of its steps, at random, send the actions
as a numpy array (the step goes raw, STEP_RAW, and its replies are written straight into the
batches), the others as a list (a STEP, decoded the general way). Beside it, a second vector
env of the same trainer holds a session on every host too: ``chaos/Quiet-v0`` envs, which say
nothing in their infos (their observations say who they are), so that their steps go raw with
no info entries, the leanest replies there are; it is checked the same way. Meanwhile a fault
injector, from a seed it prints, SIGKILLs hosts (and starts them again a little later on the
same port), SIGSTOPs them for longer than ``host_timeout_s`` (they answer late when they come
back), restarts them at once on the same port, and cuts the link of the hosts that run in
network namespaces (where ``ip netns`` works: root, iproute2); some faults together (two hosts
down at once) and some during a recovery.

What it checks, exactly (``PhaseReport.problems`` lists every breach):

- No step lost, none doubled: each instance's calls, as the trainer saw them, are 1, 2, 3...
  with no gap and no repeat, and an instance the trainer saw reported lost never comes back.
- What the hosts ran (each instance writes its last call's number to a ledger file) is what
  the trainer saw: exactly, for the instances still running at the end; at most one call
  more (the interrupted step, lost with its host) for the ones reported lost; at most one
  call (the first reset) for instances the trainer never saw (made anew, then lost again).
- Every lost env reported exactly once (docs/protocol.md, "Recovery"): an env's instance is
  only ever replaced after a report (``infos["host_failure"]``); in lockstep each re-made
  host reports each of its envs in the step that re-made it, so the reports are exactly
  ``host_restarts`` x envs per host (in first-ready batches an env re-made twice before its
  next step reports once: at most that many, and at least one per replaced instance); every
  recovery the client began ended (a resumed session or a re-made host); and no env still
  counted as running lives on a host process that was killed.
- Every result is a counted call or a loss report, and there are exactly as many as the
  calls asked for (lockstep: steps x envs).
- Afterwards every host's session count returns to 0 (``envserver ping --json``).

It also records the time from each fault to the next completed vector step (printed, never
asserted). Run it as a script::

    python tests/harness/chaos.py --minutes 5 --hosts 6 --seed 7

tests/system/test_chaos.py runs a short version, with a fixed plan of faults, in ``make test``.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from chaos_envs import ENV_ID, QUIET_ID, instance_of_tag, read_ledger
from chaos_faults import Act, Fault, Injector, Kind, Watch, random_plan
from chaos_hosts import Cluster

from envserver import client
from envserver.testing import namespaces, netns_unavailable

__all__ = [
    "ChaosConfig",
    "PhaseReport",
    "RunReport",
    "Tally",
    "Trainer",
    "chaos_cluster",
    "main",
    "run",
    "run_phase",
]

#: How long one step or recv may take before the rollout counts as hung (recoveries included).
WAIT_S = 120.0
#: How many problems a phase keeps word for word (the rest are counted).
MAX_PROBLEMS_KEPT = 40

logger = logging.getLogger("chaos")


# --------------------------------------------------------------------- what the trainer saw


class Tally:
    """Every result the trainer received, checked as it comes in.

    Each result is one env's: a call of an instance (``infos["instance"]``, ``["call"]``), a
    report of a loss (``infos["host_failure"]``), or both (a reset of an env made anew).
    """

    def __init__(self, num_envs: int) -> None:
        self.current: list[str | None] = [None] * num_envs  # the instance each env runs
        self.last: dict[str, int] = {}  # each instance's last call seen
        self.env_of: dict[str, int] = {}
        self.retired: set[str] = set()  # instances reported lost
        self.reports = np.zeros(num_envs, dtype=np.int64)  # host_failure reports per env
        self.changes = np.zeros(num_envs, dtype=np.int64)  # instances replaced per env
        self.began = np.zeros(num_envs, dtype=np.bool_)  # whether an instance was seen yet
        self.results = 0
        self.handed_out: dict[int, tuple[str, int]] = {}  # an env's last observation (quiet)
        self.reports_only = 0  # results that are a report and no call
        self.steps_lost = 0
        self.steps_doubled = 0
        self.problems: list[str] = []
        self.more_problems = 0

    def problem(self, text: str) -> None:
        """Notes a breach of what the client promises."""
        if len(self.problems) < MAX_PROBLEMS_KEPT:
            self.problems.append(text)
        else:
            self.more_problems += 1

    def batch(self, env_ids: Sequence[int] | np.ndarray, infos: dict[str, Any]) -> None:
        """Takes in the results of ``env_ids`` (in that order) from a batch's infos."""
        none = np.zeros(len(env_ids), dtype=np.bool_)
        has, lost = infos.get("_instance", none), infos.get("_host_failure", none)
        instances, calls = infos.get("instance"), infos.get("call")
        for k, env in enumerate(env_ids):
            if has[k]:
                self.see(int(env), str(instances[k]), int(calls[k]), bool(lost[k]))
            else:
                self.see(int(env), None, 0, bool(lost[k]))

    def observations(
        self, env_ids: Sequence[int] | np.ndarray, obs: np.ndarray, infos: dict[str, Any]
    ) -> None:
        """Takes in the results of ``env_ids`` of envs that say who they are in their
        observations (``chaos/Quiet-v0``: ``[call, tag]``) and nothing in their infos.

        A loss report alone repeats the last observation the env handed out (also when it
        is lost twice in a row: its second report repeats the first's); one with a reset
        carries the new instance's first call.
        """
        lost = infos.get("_host_failure", np.zeros(len(env_ids), dtype=np.bool_))
        for k, env in enumerate(env_ids):
            env = int(env)
            seen = (instance_of_tag(obs[k, 1]), int(obs[k, 0]))
            if lost[k] and seen == self.handed_out.get(env):
                self.see(env, None, 0, True)
            else:
                self.see(env, *seen, bool(lost[k]))
            self.handed_out[env] = seen

    def see(self, env: int, instance: str | None, call: int, lost: bool) -> None:
        """Takes in one env's result."""
        self.results += 1
        if lost:
            self.reports[env] += 1
            if self.current[env] is not None:
                self.retired.add(self.current[env])
                self.current[env] = None
        if instance is None:
            if not lost:
                self.problem(f"env {env}: a result that is neither a call nor a loss report")
            self.reports_only += 1
            return
        if instance in self.retired:
            self.problem(f"env {env}: instance {instance} came back after it was reported lost")
            self.retired.discard(instance)
            self.current[env] = instance
        if instance == self.current[env]:
            expected = self.last[instance] + 1
        else:
            if instance in self.env_of:
                self.problem(f"instance {instance} of env {self.env_of[instance]} at env {env}")
            if self.current[env] is not None:
                self.problem(
                    f"env {env}: instance {self.current[env]} replaced by {instance} "
                    "without a host_failure report"
                )
                self.retired.add(self.current[env])
            self.changes[env] += self.began[env]
            self.began[env] = True
            self.current[env], self.env_of[instance], self.last[instance] = instance, env, 0
            expected = 1
        if call > expected:
            self.steps_lost += call - expected
            self.problem(f"env {env}: instance {instance} call {call} after {expected - 1}")
        elif call < expected:
            self.steps_doubled += 1
            self.problem(f"env {env}: instance {instance} call {call} again (after {expected - 1})")
        self.last[instance] = max(self.last[instance], call)


class Trainer:
    """Steps the envs (lockstep, or first-ready batches), passing every result to the tally.

    The actions are a numpy array (a step that goes raw, STEP_RAW) or a list (a STEP), at
    random.

    Args:
        envs: The vector env.
        tally: Where the results go.
        seed: The seed of the first reset, and of the choice of each step's actions.
        quiet: Whether the envs say who they are in their observations, not their infos.
    """

    def __init__(
        self, envs: client.RemoteVectorEnv, tally: Tally, seed: int, quiet: bool = False
    ) -> None:
        self.envs = envs
        self.tally = tally
        self.seed = seed
        self.quiet = quiet
        self.first_ready = envs.batch_size < envs.num_envs
        self.steps = 0  # vector steps: step() or recv() calls
        self.asked = 0  # env results asked for
        self.sent_as_lists = 0  # steps sent with a list of actions (STEP, not STEP_RAW)
        self.done_at: list[float] = [0.0]  # when each vector step completed
        self._rng = random.Random(seed)

    def _take(self, env_ids: Sequence[int] | np.ndarray, obs: Any, infos: dict[str, Any]) -> None:
        if self.quiet:
            self.tally.observations(env_ids, obs, infos)
        else:
            self.tally.batch(env_ids, infos)

    def _actions(self, count: int) -> Any:
        """``count`` actions: as a list (they go as STEP) half of the time."""
        if self._rng.random() < 0.5:
            self.sent_as_lists += 1
            return [0] * count
        return np.zeros(count, dtype=np.int64)

    def start(self) -> None:
        """Resets every env (in first-ready mode, without waiting)."""
        n = self.envs.num_envs
        self.asked += n
        if self.first_ready:
            self.envs.async_reset(seed=self.seed)
        else:
            obs, infos = self.envs.reset(seed=self.seed)
            self._take(range(n), obs, infos)

    def advance(self) -> None:
        """One vector step: ``step``, or ``recv`` and ``send`` again to the envs received."""
        envs = self.envs
        if self.first_ready:
            obs, *_, infos = envs.recv(timeout=WAIT_S)
            ids = infos["env_id"]
            self._take(ids, obs, infos)
            envs.send(self._actions(len(ids)), ids)
            self.asked += len(ids)
        else:
            self._lockstep_step()
        self.steps += 1
        self.done_at.append(time.monotonic())

    def finish(self) -> None:
        """Receives every env still in flight, then steps all once in lockstep.

        Envs re-made after a failure report the loss at their next step: after this step, no
        report is owed and no step is under way.
        """
        envs = self.envs
        if self.first_ready:
            for _ in range(envs.num_envs // envs.batch_size):
                obs, *_, infos = envs.recv(timeout=WAIT_S)
                self._take(infos["env_id"], obs, infos)
        self._lockstep_step()

    def _lockstep_step(self) -> None:
        n = self.envs.num_envs
        self.envs.step_async(self._actions(n))
        obs, *_, infos = self.envs.step_wait(timeout=WAIT_S)
        self.asked += n
        self._take(range(n), obs, infos)


# --------------------------------------------------------------------- a phase, and a run


@dataclasses.dataclass(frozen=True)
class ChaosConfig:
    """How a soak runs.

    Attributes:
        hosts: How many hosts (spares included).
        spares: How many of them are spares.
        envs_per_host: Envs on each active host.
        host_timeout_s: The trainer's liveness timeout.
        session_lease_s: The hosts' session lease (sessions left behind go after it).
        restart_timeout_s: The trainer's bound on one recovery.
        namespaces: How many hosts run in network namespaces (where those work).
        seed: Every random choice comes from it.
    """

    hosts: int = 6
    spares: int = 2
    envs_per_host: int = 4
    host_timeout_s: float = 1.0
    session_lease_s: float = 5.0
    restart_timeout_s: float = 60.0
    namespaces: int = 2
    seed: int = 0


@dataclasses.dataclass
class PhaseReport:
    """What one rollout under faults did, and every breach of the client's promises found."""

    mode: str
    seconds: float = 0.0
    num_envs: int = 0
    steps: int = 0
    env_results: int = 0
    calls: int = 0
    reports: int = 0
    instances: int = 0
    replaced: int = 0
    never_seen: int = 0
    steps_lost: int = 0
    steps_doubled: int = 0
    host_restarts: int = 0
    recoveries: int = 0
    resumed: int = 0
    faults: list[Fault] = dataclasses.field(default_factory=list)
    skipped_faults: int = 0
    recovery_s: list[float] = dataclasses.field(default_factory=list)
    hit_recovery_s: list[float] = dataclasses.field(default_factory=list)
    sent_as_lists: int = 0
    quiet_envs: int = 0
    quiet_steps: int = 0
    quiet_results: int = 0
    quiet_reports: int = 0
    quiet_host_restarts: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    def kinds(self, hit_only: bool = False) -> Counter[str]:
        """How many faults of each kind (only those that hit the trainer's envs)."""
        return Counter(f.kind.value for f in self.faults if f.hit or not hit_only)

    def lines(self) -> list[str]:
        """The report, for a person."""
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds().items())) or "none"
        hits = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds(True).items())) or "none"
        lines = [
            f"{self.mode}: {self.seconds:.1f} s, {self.num_envs} envs",
            f"  faults injected:      {len(self.faults)} ({kinds}); not injected: "
            f"{self.skipped_faults}",
            f"  faults on envs' hosts {sum(self.kinds(True).values())} ({hits})",
            f"  overlapping faults:   {sum(f.overlapped for f in self.faults)} began while "
            f"another was under way, {sum(f.during_recovery for f in self.faults)} during "
            "a recovery",
            f"  steps:                {self.steps} vector steps, {self.env_results} env results "
            f"({self.calls} env calls + {self.env_results - self.calls} loss reports alone)",
            f"  steps lost:           {self.steps_lost}",
            f"  steps doubled:        {self.steps_doubled}",
            f"  envs reported lost:   {self.reports} (host re-makes {self.host_restarts}, "
            f"sessions resumed {self.resumed}, recoveries {self.recoveries})",
            f"  instances:            {self.instances} seen, {self.replaced} replaced, "
            f"{self.never_seen} made and lost before their first result",
            f"  steps sent as lists:  {self.sent_as_lists} (STEP; the others STEP_RAW)",
            f"  second vector env:    {self.quiet_envs} quiet envs on the same hosts (no infos, "
            f"raw replies): {self.quiet_steps} vector steps, {self.quiet_results} env results, "
            f"{self.quiet_reports} loss reports, host re-makes {self.quiet_host_restarts}",
            f"  recovery (fault to next completed step): {_spread(self.recovery_s)}",
            f"    for faults on envs' hosts:             {_spread(self.hit_recovery_s)}",
        ]
        lines.append(f"  problems:             {len(self.problems)}")
        lines += [f"    - {problem}" for problem in self.problems]
        return lines


@dataclasses.dataclass
class RunReport:
    """A whole soak: its phases, and the sessions the hosts still held at the end."""

    seed: int
    netns: str
    phases: list[PhaseReport] = dataclasses.field(default_factory=list)
    sessions_left: dict[str, int | None] = dataclasses.field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        """Every breach found, in every phase and at the end."""
        found = [f"{phase.mode}: {p}" for phase in self.phases for p in phase.problems]
        left = {e: n for e, n in self.sessions_left.items() if n != 0}
        if left:
            found.append(f"sessions left on hosts (None: no answer): {left}")
        return found

    def text(self) -> str:
        """The report, for a person."""
        lines = [f"chaos soak, seed {self.seed}; network namespaces: {self.netns}"]
        for phase in self.phases:
            lines += phase.lines()
        left = sum(n or 0 for n in self.sessions_left.values())
        unanswered = sum(n is None for n in self.sessions_left.values())
        lines.append(
            f"sessions left: {left} on {len(self.sessions_left)} hosts"
            + (f" ({unanswered} did not answer)" if unanswered else "")
        )
        lines.append(f"problems: {len(self.problems)}")
        return "\n".join(lines)


def _spread(values: Sequence[float]) -> str:
    """p50/p99/max of durations, in seconds."""
    if not values:
        return "none"
    p50, p99 = np.percentile(values, [50, 99])
    return f"p50 {p50:.2f} s, p99 {p99:.2f} s, max {max(values):.2f} s ({len(values)} faults)"


def run_phase(
    cluster: Cluster,
    config: ChaosConfig,
    first_ready: bool,
    plan: Iterable[Act],
    rng: random.Random,
    seconds: float,
    ledger: Path,
) -> PhaseReport:
    """A rollout of ``seconds`` (at most) under the faults of ``plan``, checked.

    The rollout ends when the plan is done or the time is up; then every fault is undone, the
    envs step some more, every env is stepped once in lockstep, and what the hosts ran is
    compared with what the trainer saw.
    """
    report = PhaseReport("first-ready" if first_ready else "lockstep")
    quiet_ledger = ledger.parent / f"{ledger.name}-quiet"
    ledger.mkdir(parents=True)
    quiet_ledger.mkdir(parents=True)
    num_envs = config.envs_per_host * len(cluster.active)
    watch = Watch()
    client_logger = logging.getLogger("envserver.client")
    client_logger.addHandler(watch)

    def vector_env(env_id: str, folder: Path, count: int) -> client.RemoteVectorEnv:
        return client.RemoteVectorEnv(
            env_id=env_id,
            env_kwargs={"ledger": str(folder)},
            num_envs=count,
            hosts=[host.endpoint for host in cluster.active],
            on_host_failure="restart",
            spare_hosts=[host.endpoint for host in cluster.spares],
            host_timeout_s=config.host_timeout_s,
            restart_timeout_s=config.restart_timeout_s,
            batch_size=count // 2 if first_ready else None,
        )

    envs = vector_env(ENV_ID, ledger, num_envs)
    # A second session of this trainer on every host: envs that say nothing in their infos.
    quiet_envs = vector_env(QUIET_ID, quiet_ledger, len(cluster.active))
    tally, quiet_tally = Tally(num_envs), Tally(quiet_envs.num_envs)
    trainer = Trainer(envs, tally, seed=rng.randrange(2**31))
    quiet = Trainer(quiet_envs, quiet_tally, seed=rng.randrange(2**31), quiet=True)

    def advance() -> None:  # the watch counts the recoveries of the first vector env only
        watch.listening = True
        trainer.advance()
        watch.listening = False
        quiet.advance()

    injector = Injector(
        cluster,
        rng,
        config.host_timeout_s,
        watch,
        lambda: set(envs.hosts),
        lambda: trainer.done_at[-1],
    )
    started = time.monotonic()
    final_pids: list[int | None] = []
    quiet_pids: list[int | None] = []
    try:
        trainer.start()
        watch.listening = False
        quiet.start()
        injector.start(plan)
        while not injector.finished.is_set() and time.monotonic() - started < seconds:
            advance()
        injector.stop()
        for _ in range(20):  # everything healed: the rollout goes on
            advance()
        watch.listening = True
        trainer.finish()
        watch.listening = False
        quiet.finish()
        final_pids = [cluster.pid_of(endpoint) for endpoint in envs.hosts]
        quiet_pids = [cluster.pid_of(endpoint) for endpoint in quiet_envs.hosts]
    except Exception as exc:
        logger.exception("the rollout failed")
        tally.problem(f"the rollout failed: {exc!r}")
    finally:
        with contextlib.suppress(Exception):
            injector.stop()
        report.host_restarts = envs.host_restarts
        report.quiet_host_restarts = quiet_envs.host_restarts
        envs.close()
        quiet_envs.close()
        client_logger.removeHandler(watch)
        (ledger.parent / f"client-{report.mode}.log").write_text("\n".join(watch.lines) + "\n")
    if injector.error is not None:
        tally.problem(f"the fault injector failed: {injector.error!r}")
    report.seconds = time.monotonic() - started
    _account(report, tally, trainer, watch, injector, config)
    _account_quiet(report, quiet_tally, quiet)
    if final_pids:
        _compare_ledger(report, tally, read_ledger(ledger), cluster, final_pids, config)
    if quiet_pids:  # the quiet envs know 12 hex digits of their instance: the ledger's prefix
        ran = {instance[:12]: entry for instance, entry in read_ledger(quiet_ledger).items()}
        _compare_ledger(report, quiet_tally, ran, cluster, quiet_pids, config, envs_per_host=1)
    report.steps_lost = tally.steps_lost + quiet_tally.steps_lost
    report.steps_doubled = tally.steps_doubled + quiet_tally.steps_doubled
    report.problems = [
        *tally.problems,
        *([f"... and {tally.more_problems} more"] if tally.more_problems else []),
        *(f"second vector env: {problem}" for problem in quiet_tally.problems),
    ]
    return report


def _account_quiet(report: PhaseReport, tally: Tally, trainer: Trainer) -> None:
    """Fills the report's lines on the second vector env, and checks its counts."""
    report.quiet_envs = trainer.envs.num_envs
    report.quiet_steps = trainer.steps
    report.quiet_results = tally.results
    report.quiet_reports = int(tally.reports.sum())
    if tally.problems:
        return
    if tally.results != trainer.asked:
        tally.problem(f"{tally.results} env results for {trainer.asked} asked")
    calls = sum(tally.last.values())
    if calls + tally.reports_only != tally.results:
        tally.problem(f"{calls} calls + {tally.reports_only} reports alone != {tally.results}")
    wrong = np.flatnonzero(tally.reports < tally.changes)
    for env in wrong:
        tally.problem(
            f"env {env}: replaced {tally.changes[env]} times, {tally.reports[env]} reports"
        )


def _account(
    report: PhaseReport,
    tally: Tally,
    trainer: Trainer,
    watch: Watch,
    injector: Injector,
    config: ChaosConfig,
) -> None:
    """Fills the report from the tally, and checks the counts against one another."""
    report.num_envs = trainer.envs.num_envs
    report.steps = trainer.steps
    report.env_results = tally.results
    report.calls = sum(tally.last.values())
    report.reports = int(tally.reports.sum())
    report.instances = len(tally.last)
    report.replaced = int(tally.changes.sum())
    report.steps_lost, report.steps_doubled = tally.steps_lost, tally.steps_doubled
    report.recoveries, report.resumed = watch.begun, watch.resumed
    report.faults, report.skipped_faults = injector.faults, injector.skipped
    report.sent_as_lists = trainer.sent_as_lists
    for fault in injector.faults:
        after = bisect.bisect_right(trainer.done_at, fault.began)
        if after < len(trainer.done_at):
            report.recovery_s.append(trainer.done_at[after] - fault.began)
            if fault.hit:
                report.hit_recovery_s.append(trainer.done_at[after] - fault.began)
    if tally.problems:
        return  # the rollout failed: the counts below would not add up
    if tally.results != trainer.asked:
        tally.problem(f"{tally.results} env results for {trainer.asked} asked")
    if report.calls + tally.reports_only != tally.results:
        tally.problem(
            f"{report.calls} calls + {tally.reports_only} reports alone != {tally.results} results"
        )
    if watch.begun != watch.resumed + watch.remakes:
        tally.problem(
            f"{watch.begun} recoveries began, {watch.resumed} resumed + {watch.remakes} re-made"
        )
    if watch.remakes != report.host_restarts:
        tally.problem(f"{watch.remakes} re-makes logged, host_restarts {report.host_restarts}")
    remade = np.array([watch.remade[i] for i in range(report.num_envs)])
    if trainer.first_ready:  # an env re-made twice before its next step reports once
        wrong = np.flatnonzero((tally.reports > remade) | (tally.reports < tally.changes))
    else:
        wrong = np.flatnonzero(tally.reports != remade)
    for env in wrong:
        tally.problem(
            f"env {env}: {tally.reports[env]} loss reports, its host re-made "
            f"{remade[env]} times, its instance replaced {tally.changes[env]} times"
        )
    if not trainer.first_ready and report.reports != report.host_restarts * config.envs_per_host:
        tally.problem(f"{report.reports} loss reports for {report.host_restarts} host re-makes")


def _compare_ledger(
    report: PhaseReport,
    tally: Tally,
    ran: dict[str, tuple[int, int]],
    cluster: Cluster,
    final_pids: list[int | None],
    config: ChaosConfig,
    envs_per_host: int | None = None,
) -> None:
    """Checks what the hosts ran (the ledger) against what the trainer saw."""
    envs_per_host = envs_per_host or config.envs_per_host
    for instance, seen in tally.last.items():
        if instance not in ran:
            tally.problem(f"instance {instance} was seen but no host made it")
            continue
        pid, calls = ran[instance]
        env = tally.env_of[instance]
        if instance in tally.retired:  # lost: its last step may have been lost with it
            if not seen <= calls <= seen + 1:
                tally.steps_lost += max(0, calls - seen - 1)
                tally.problem(f"env {env}: lost instance {instance} ran {calls}, seen {seen}")
            continue
        if calls != seen:
            tally.steps_lost += max(0, calls - seen)
            tally.problem(f"env {env}: instance {instance} ran {calls} calls, seen {seen}")
        if pid in cluster.killed_pids:
            tally.problem(f"env {env}: instance {instance} lives on killed host process {pid}")
        expected_pid = final_pids[env // envs_per_host]
        if pid != expected_pid:
            tally.problem(
                f"env {env}: instance {instance} on pid {pid}, its host is {expected_pid}"
            )
    unseen = [calls for instance, (_, calls) in ran.items() if instance not in tally.last]
    report.never_seen += len(unseen)
    beyond = [calls for calls in unseen if calls > 1]
    if beyond:
        tally.problem(f"instances never seen ran more than their first reset: {beyond}")


def run(
    directory: Path,
    config: ChaosConfig,
    plans: Callable[[random.Random, bool], Sequence[Iterable[Act]]],
    seconds_per_phase: float,
) -> RunReport:
    """The soak: a lockstep phase, then a first-ready one, on one cluster; then the sessions.

    Args:
        directory: Where logs and ledgers go.
        config: How it runs.
        plans: The fault plans of the two phases, from the random generator and whether
            there are namespaced hosts (links to cut).
        seconds_per_phase: How long each rollout lasts at most.
    """
    rng = random.Random(config.seed)
    with chaos_cluster(directory, config) as (cluster, unavailable):
        report = RunReport(config.seed, unavailable or f"{config.namespaces} hosts in namespaces")
        lockstep_plan, first_ready_plan = plans(rng, not unavailable)
        for first_ready, plan in ((False, lockstep_plan), (True, first_ready_plan)):
            ledger = directory / f"ledger-{'first-ready' if first_ready else 'lockstep'}"
            phase = run_phase(cluster, config, first_ready, plan, rng, seconds_per_phase, ledger)
            report.phases.append(phase)
        report.sessions_left = cluster.wait_idle(3 * config.session_lease_s + 30)
    return report


@contextlib.contextmanager
def chaos_cluster(directory: Path, config: ChaosConfig) -> Iterator[tuple[Cluster, str | None]]:
    """The soak's hosts, started (some in network namespaces, where those work), and stopped.

    Yields:
        The cluster, and why no host runs in a namespace (None if some do).
    """
    unavailable = netns_unavailable() if config.namespaces else "not asked for"
    with contextlib.ExitStack() as stack:
        spaces = (
            []
            if unavailable
            else stack.enter_context(
                namespaces(config.namespaces, "esc", 214 + (os.getpid() >> 8) % 32)
            )
        )
        serve_args = ["--import", "chaos_envs", "--session-lease", f"{config.session_lease_s:g}"]
        cluster = Cluster(directory, config.hosts, config.spares, serve_args, spaces)
        stack.callback(cluster.close)
        cluster.start()
        yield cluster, unavailable


def main(argv: list[str] | None = None) -> int:
    """Runs the soak and prints its report; 1 if it found a problem."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="the whole rollout time")
    parser.add_argument("--hosts", type=int, default=6, help="hosts, spares included (>= 5)")
    parser.add_argument("--spares", type=int, default=2)
    parser.add_argument("--envs-per-host", type=int, default=4)
    parser.add_argument("--host-timeout", type=float, default=1.0, help="host_timeout_s")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--no-netns", action="store_true", help="no link cuts")
    parser.add_argument("--keep", action="store_true", help="keep the logs and ledgers")
    options = parser.parse_args(argv)
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(10**6)
    config = ChaosConfig(
        hosts=options.hosts,
        spares=options.spares,
        envs_per_host=options.envs_per_host,
        host_timeout_s=options.host_timeout,
        namespaces=0 if options.no_netns else 2,
        seed=seed,
    )
    print(f"chaos soak: seed {seed} (rerun with --seed {seed})", flush=True)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("envserver.client").propagate = False  # the Watch keeps its lines
    directory = Path(tempfile.mkdtemp(prefix="envserver-chaos-"))

    def plans(rng: random.Random, netns: bool) -> list[Iterator[Act]]:
        kinds = list(Kind) if netns else [k for k in Kind if k != Kind.CUT]
        return [random_plan(rng, kinds), random_plan(rng, kinds)]

    report = run(directory, config, plans, options.minutes * 60 / 2)
    print(report.text())
    if report.problems or options.keep:
        print(f"logs and ledgers: {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
