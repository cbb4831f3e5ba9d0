"""The chaos soak in short (tests/harness/chaos.py has the long one): a rollout on six hosts, in
lockstep and in first-ready batches, while hosts are killed, frozen for longer than the liveness
timeout, restarted on their port, and cut off (where network namespaces work), some of it at once
and during a recovery; every env step is accounted for exactly. The same faults under
on_host_failure="restore", where the rollout must equal SyncVectorEnv's (tests/harness/
chaos_restore.py). And a bug the soak found: a host restarted unnoticed was recovered once per
sub-batch under way in first-ready mode."""

from __future__ import annotations

import random
import re
import signal
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from chaos import ChaosConfig, run
from chaos_faults import Act, Aim, Kind
from chaos_hosts import free_port
from chaos_restore import run_restore
from helpers import wait_for

from envserver import client
from envserver.testing import netns_unavailable, start_host

#: Whole programs under test: `make test-long` (CI) runs them.
pytestmark = pytest.mark.long

NETNS_UNAVAILABLE = netns_unavailable()
CONFIG = ChaosConfig(hosts=6, spares=2, envs_per_host=2, host_timeout_s=1.0, seed=20211)
#: How long the faults of an act with several last, in host_timeout_s: the first is still under
#: way when the next begin.
LONG = (2.5, 3.0)


def plans(rng: random.Random, netns: bool) -> tuple[list[Act], list[Act]]:
    """Each phase's faults, one act after the last has healed and the rollout went on.

    In each phase, one act takes a host down and, once the trainer is recovering from that,
    takes down another one (two hosts down at once, and a fault during a recovery).
    """
    cut = [Act((Kind.CUT,), settle=True)] if netns else []
    lockstep = [
        *cut,
        Act((Kind.RESTART,), settle=True),
        # A freeze first: the trainer's recovery from it waits on the frozen host for a while,
        # long enough for the kill to land during it (a killed host is recovered in a few ms).
        Act((Kind.STOP, Kind.KILL), during_recovery=True, settle=True, lasts=LONG),
    ]
    first_ready = [
        *cut,
        Act((Kind.RESTART,), settle=True),
        Act((Kind.KILL,), settle=True, lasts=LONG),
        Act(
            (Kind.STOP, Kind.STOP, Kind.KILL),
            (Aim.HIT, Aim.HIT, Aim.IDLE),  # and a spare the recovery may be heading for
            during_recovery=True,
            settle=True,
            lasts=LONG,
        ),
    ]
    return lockstep, first_ready


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_step_is_served_once_and_every_lost_env_reported_once(tmp_path: Path) -> None:
    report = run(tmp_path, CONFIG, plans, seconds_per_phase=180.0)
    print(report.text())
    assert report.problems == []
    lockstep, first_ready = report.phases
    for phase in report.phases:
        assert phase.steps_lost == 0 and phase.steps_doubled == 0
        assert phase.reports > 0 and phase.host_restarts > 0  # envs were lost, and said so
        assert phase.skipped_faults == 0
        assert sum(f.overlapped and f.hit for f in phase.faults) >= 1  # two hosts down at once
        assert any(f.during_recovery and f.hit for f in phase.faults)
    hits = lockstep.kinds(hit_only=True)
    assert hits["kill"] == hits["stop"] == hits["restart"] == 1
    hits = first_ready.kinds(hit_only=True)
    assert hits["kill"] == 1 and hits["stop"] == 2 and hits["restart"] == 1
    if NETNS_UNAVAILABLE is None:
        assert lockstep.kinds()["cut"] == first_ready.kinds()["cut"] == 1
    assert all(count == 0 for count in report.sessions_left.values())


if NETNS_UNAVAILABLE is not None:  # said in the summary, rather than left out unsaid

    @pytest.mark.skip(reason=f"the chaos test cuts no link here: {NETNS_UNAVAILABLE}")
    def test_chaos_cuts_links() -> None:
        """Where network namespaces work, the chaos test cuts a host's link in each phase."""


def step_errors(metrics_port: int) -> int:
    """How many STEP requests a host answered with an error (from its metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
        text = page.read().decode()
    found = re.search(
        r'^envserver_requests_total\{command="step",status="error"\} (\S+)$', text, re.M
    )
    return 0 if found is None else int(float(found.group(1)))


def test_first_ready_recovers_a_host_restarted_unnoticed_once(tmp_path: Path) -> None:
    """A host restarted on its port while it owed the trainer nothing: the trainer's next
    sub-batches reach the new process, which answers each that the session is unknown. The
    envs are made anew once, and each reports the loss once."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    host = start_host(tmp_path, bind=endpoint)
    envs = client.RemoteVectorEnv(
        env_id="CartPole-v1",
        num_envs=4,
        hosts=[endpoint],
        on_host_failure="restart",
        batch_size=4,
        sub_batch_size=1,
    )
    try:
        envs.async_reset(seed=0)
        envs.recv(timeout=60)  # every env in the trainer's hands: the host owes nothing
        host.stop(signal.SIGKILL)
        metrics_port = free_port()
        host = start_host(tmp_path, "--metrics-port", str(metrics_port), bind=endpoint)
        envs.send(np.zeros(4, dtype=np.int64))  # four sub-batches, to the new process
        wait_for(  # all four answered before the trainer looks: its first poll reads them all
            lambda: step_errors(metrics_port) >= 4,
            "the new host did not answer the four sub-batches",
        )
        *_, infos = envs.recv(timeout=60)
        assert infos["_host_failure"].all()
        assert envs.host_restarts == 1
    finally:
        envs.close()
        host.stop()


def restore_plan(rng: random.Random, netns: bool) -> list[Act]:
    """The faults of the restore-mode soak: each kind once, then two at once during a recovery."""
    return [
        *([Act((Kind.CUT,), settle=True)] if netns else []),
        Act((Kind.RESTART,), settle=True),
        Act((Kind.KILL,), settle=True, lasts=LONG),
        Act((Kind.STOP, Kind.KILL), during_recovery=True, settle=True, lasts=LONG),
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_restore_mode_rollout_equals_sync_vector_env_under_faults(tmp_path: Path) -> None:
    """on_host_failure="restore": a lockstep rollout on hosts that fail equals SyncVectorEnv's
    with no failure, step for step, and no env is reported lost."""
    report = run_restore(tmp_path, CONFIG, restore_plan, seconds=180.0)
    print(report.text())
    assert report.problems == []
    assert report.steps > 20 and report.restored >= 3  # envs were brought back, restored
    assert any(f.hit and f.during_recovery for f in report.faults)
    assert report.sent_as_lists > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_restore_mode_first_ready_batches_equal_sync_vector_env_under_faults(
    tmp_path: Path,
) -> None:
    """As above, in first-ready batches of half the envs: each env's results equal its own
    SyncVectorEnv's, envs in flight, received or with the trainer when their host fails."""
    report = run_restore(tmp_path, CONFIG, restore_plan, seconds=180.0, first_ready=True)
    print(report.text())
    assert report.problems == []
    assert report.steps > 20 and report.restored >= 3
    assert any(f.hit and f.during_recovery for f in report.faults)
    assert report.sent_as_lists > 0
