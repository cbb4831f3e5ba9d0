"""on_host_failure="restore": envs lost with their host come back in the state they were in.

A host killed (or frozen) mid-rollout: its envs are made anew elsewhere, restored from the last
snapshots the vector env kept and stepped again through the steps since, checked; the rollout
equals SyncVectorEnv's with the same seeds and actions, step for step, with no truncation and no
``host_failure``. Where the steps taken again do not give what the trainer was given, the envs
are reported lost as with "restart".
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from first_ready_oracles import PerEnvOracles
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same
from ports import free_ports

from envserver import client
from envserver.testing import start_host


def restoring(env_id: str, mode: AutoresetMode, **kwargs) -> client.RemoteVectorEnv:
    """Four envs on two local hosts (envs 0-1 and 2-3), snapshots every 7 steps."""
    return client.RemoteVectorEnv(
        [functools.partial(gym.make, env_id, max_episode_steps=30)] * 4,
        num_local_hosts=2,
        on_host_failure="restore",
        snapshot_every=7,
        host_timeout_s=2.0,
        autoreset_mode=mode,
        **kwargs,
    )


def oracle_for(env_id: str, mode: AutoresetMode) -> SyncVectorEnv:
    return SyncVectorEnv(
        [functools.partial(gym.make, env_id, max_episode_steps=30)] * 4, autoreset_mode=mode
    )


def rollout_against_the_oracle(envs, oracle, fault_at: dict[int, str], steps: int = 60) -> None:
    """Steps both with the same actions, a fault of the kind named at each step listed."""
    assert_same(envs.reset(seed=3), oracle.reset(seed=3))
    envs.action_space.seed(5)
    for t in range(steps):
        actions = envs.action_space.sample()
        fault = fault_at.get(t)
        pid = envs._hosts.local.processes[1].pid
        if fault == "kill-between":
            os.kill(pid, signal.SIGKILL)
            got = envs.step(actions)
        elif fault == "kill-mid-step":
            envs.step_async(actions)
            os.kill(pid, signal.SIGKILL)
            got = envs.step_wait()
        elif fault == "freeze":
            os.kill(pid, signal.SIGSTOP)
            got = envs.step(actions)
        else:
            got = envs.step(actions)
        expected = oracle.step(actions)
        assert "host_failure" not in got[4], f"step {t}"
        assert_same(got, expected, f"step {t}")
        ended = expected[2] | expected[3]
        if envs.autoreset_mode == AutoresetMode.DISABLED and ended.any():  # the trainer resets
            options = {"reset_mask": ended}
            assert_same(envs.reset(options=options), oracle.reset(options=options))


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_killed_hosts_envs_go_on_as_if_nothing_happened(mode: AutoresetMode) -> None:
    """Killed between steps and mid-step, twice, between snapshots and right after one (in
    DISABLED mode, resets of the envs that ended take snapshots anew too)."""
    envs, oracle = restoring("CartPole-v1", mode), oracle_for("CartPole-v1", mode)
    try:
        rollout_against_the_oracle(envs, oracle, {17: "kill-between", 28: "kill-mid-step"})
        assert envs.host_restarts == 2
    finally:
        envs.close()
        oracle.close()


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "Hopper-v5"])
def test_a_frozen_host_is_replaced_and_its_envs_restored(env_id: str) -> None:
    if env_id == "Hopper-v5":
        pytest.importorskip("mujoco")
    envs = restoring(env_id, AutoresetMode.NEXT_STEP)
    oracle = oracle_for(env_id, AutoresetMode.NEXT_STEP)
    try:
        rollout_against_the_oracle(envs, oracle, {12: "freeze"}, steps=40)
        assert envs.host_restarts == 1
    finally:
        envs.close()
        oracle.close()


def test_envs_set_by_hand_are_restored_as_set() -> None:
    """A ``set_attr`` is where a recovery restores from (its envs' snapshots are taken anew):
    envs whose physics the trainer set by hand, killed with their host, go on as
    SyncVectorEnv's do. (An older snapshot and the steps since gave other observations: the
    envs were reported lost. A pickled attribute was undone.)"""
    envs = restoring("CartPole-v1", AutoresetMode.NEXT_STEP)
    oracle = oracle_for("CartPole-v1", AutoresetMode.NEXT_STEP)
    ones = np.ones(4, dtype=np.int64)
    try:
        assert_same(envs.reset(seed=0), oracle.reset(seed=0))
        assert_same(envs.step(ones), oracle.step(ones))
        for vector in (envs, oracle):
            vector.set_attr("state", [np.array([0.01, 0.0, 0.02, 0.0])] * 4)
        assert_same(envs.step(ones), oracle.step(ones))
        os.kill(envs._hosts.local.processes[1].pid, signal.SIGKILL)
        got = envs.step(ones)
        assert "host_failure" not in got[4]
        assert_same(got, oracle.step(ones))
        assert envs.host_restarts == 1
    finally:
        envs.close()
        oracle.close()


def test_envs_restored_by_the_trainer_are_kept_as_restored() -> None:
    """set_state is what a recovery restores from afterwards: envs 2-3, set to 0-1's state,
    killed with their host, go on as 0-1 do."""
    envs = restoring("CartPole-v1", AutoresetMode.NEXT_STEP)
    try:
        envs.reset(seed=0)
        envs.step(np.ones(4, dtype=np.int64))
        envs.set_state(envs.get_state(env_ids=[0, 1]), env_ids=[2, 3])
        actions = np.array([1, 0, 1, 0])
        for _ in range(3):
            obs, *_ = envs.step(actions)
        os.kill(envs._hosts.local.processes[1].pid, signal.SIGKILL)
        obs, _, _, truncations, infos = envs.step(actions)
        assert not truncations.any() and "host_failure" not in infos
        np.testing.assert_array_equal(obs[2:], obs[:2])
        assert envs.host_restarts == 1
    finally:
        envs.close()


def test_envs_a_replay_cannot_bring_back_are_reported_lost(tmp_path) -> None:
    """On hosts that do not allow pickle, the test env's snapshots are the replay of its reset;
    its reset info counts its resets, so once a snapshot is of a later episode, a replay into
    an env made anew (counting from 1) is refused and the envs are reported lost, as with
    "restart". Local hosts (which allow pickle) restore it from its attributes."""
    episodic = "envserver.testing:envserver/Episodic-v0"
    kwargs = {"max_steps": 2, "terminate_prob": 0.0}  # an episode every 2 steps
    first = free_ports(2)
    hosts = [start_host(tmp_path, bind=f"tcp://127.0.0.1:{first + i}") for i in range(2)]
    plain = client.make_vec(
        episodic, num_envs=2, **kwargs,
        vector_kwargs={
            "hosts": [hosts[0].endpoint], "spare_hosts": [hosts[1].endpoint],
            "on_host_failure": "restore", "snapshot_every": 4, "host_timeout_s": 2.0,
        },
    )  # fmt: skip
    local = client.make_vec(
        episodic, num_envs=2, **kwargs,
        vector_kwargs={"num_local_hosts": 1, "on_host_failure": "restore", "snapshot_every": 4},
    )  # fmt: skip
    try:
        for envs in (plain, local):
            envs.reset(seed=0)
            for _ in range(6):  # snapshots after the first reset, then in the third episode
                envs.step(np.zeros(2, dtype=np.int64))
        hosts[0].stop(signal.SIGKILL)
        _, _, _, truncations, infos = plain.step(np.zeros(2, dtype=np.int64))
        assert truncations.all() and infos["host_failure"].all()
        os.kill(local._hosts.local.processes[0].pid, signal.SIGKILL)
        _, _, _, truncations, infos = local.step(np.zeros(2, dtype=np.int64))
        assert not truncations.any() and "host_failure" not in infos
        assert plain.host_restarts == local.host_restarts == 1
    finally:
        plain.close()
        local.close()
        for host in hosts:
            host.stop()


@pytest.mark.parametrize("spare_allows_pickle", [True, False], ids=["to-pickle", "from-pickle"])
def test_a_replay_restores_on_a_spare_that_allows_pickle(tmp_path, spare_allows_pickle) -> None:
    """A custom env with no state API (not an EzPickle), its host killed: taken on a host that
    does not allow pickle (its reset replayed), its envs are restored on a spare that does, and
    go on as SyncVectorEnv's; taken on one that does (pickled), a spare that does not refuses
    them, and they are reported lost, as with "restart"."""
    jitter = "envserver.testing:envserver/Jitter-v0"
    kwargs = {"step_s": 0.0, "episode_steps": 9}
    first = free_ports(2)
    pickle = (["--allow-pickle"], []) if not spare_allows_pickle else ([], ["--allow-pickle"])
    hosts = [
        start_host(tmp_path, *pickle[i], bind=f"tcp://127.0.0.1:{first + i}") for i in range(2)
    ]
    envs = client.make_vec(
        jitter, num_envs=2, **kwargs,
        vector_kwargs={
            "hosts": [hosts[0].endpoint], "spare_hosts": [hosts[1].endpoint],
            "on_host_failure": "restore", "snapshot_every": 4, "host_timeout_s": 2.0,
        },
    )  # fmt: skip
    oracle = gym.make_vec(jitter, num_envs=2, vectorization_mode="sync", **kwargs)
    try:
        assert_same(envs.reset(seed=1), oracle.reset(seed=1))
        actions = [np.array([t % 2, 1]) for t in range(24)]
        for action in actions[:14]:  # snapshots in the second episode, steps since
            assert_same(envs.step(action), oracle.step(action))
        hosts[0].stop(signal.SIGKILL)
        got = envs.step(actions[14])
        if not spare_allows_pickle:
            assert got[3].all() and got[4]["host_failure"].all()
            return
        assert "host_failure" not in got[4] and envs.host_restarts == 1
        assert_same(got, oracle.step(actions[14]))
        for action in actions[15:]:
            assert_same(envs.step(action), oracle.step(action))
    finally:
        envs.close()
        oracle.close()
        for host in hosts:
            host.stop()


def first_ready_against_oracles(
    envs: client.RemoteVectorEnv, faults: dict[int, str], batches: int = 120, restarts: int = 1
) -> None:
    """Batches of the first envs to finish (of 4), each env's results equal to its own 1-env
    SyncVectorEnv's (same seed, same actions); a fault of the kind named before batch ``n``:
    host 1 killed or frozen while envs are in flight, or killed while they are all idle.

    At least ``batches``, and on until the vector env recovered ``restarts`` times (host 0 alone
    may fill batches of 2 until it notices that host 1 is gone)."""
    make = functools.partial(gym.make, "CartPole-v1", max_episode_steps=30)
    oracles = PerEnvOracles(make, 4, envs.autoreset_mode, seed=3)
    envs.async_reset(seed=3)
    deadline = time.monotonic() + 120
    try:
        for n in itertools.count():
            if n >= batches and envs.host_restarts >= restarts:
                break
            assert time.monotonic() < deadline, f"{envs.host_restarts} recoveries"
            fault = faults.get(n)
            if fault == "kill-idle":  # between a recv and a send that sends every env
                while envs._first_ready.busy:
                    oracles.check(envs.recv())
                os.kill(envs._hosts.local.processes[1].pid, signal.SIGKILL)
                oracles.send_next(envs, list(range(4)))
                continue
            if fault in ("kill", "freeze"):
                pid = envs._hosts.local.processes[1].pid
                os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            oracles.send_next(envs, oracles.check(envs.recv()))
    finally:
        oracles.close()
    assert oracles.steps.sum() > batches, "the envs took fewer steps than batches"


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_first_ready_envs_of_a_killed_host_go_on_as_if_nothing_happened(mode) -> None:
    """Killed while some of its envs are in flight and others in hand (received, not yet
    handed out, or with the trainer), and again while all of them are idle."""
    envs = restoring("CartPole-v1", mode, batch_size=2, sub_batch_size=1)
    try:
        first_ready_against_oracles(envs, {25: "kill", 70: "kill-idle"}, restarts=2)
        assert envs.host_restarts == 2
    finally:
        envs.close()


def test_first_ready_envs_of_a_frozen_host_are_restored_elsewhere() -> None:
    """Batches of 3: each needs an env of the frozen host, so the next one finds it silent."""
    envs = restoring("CartPole-v1", AutoresetMode.NEXT_STEP, batch_size=3, sub_batch_size=1)
    try:
        first_ready_against_oracles(envs, {40: "freeze"}, batches=80, restarts=1)
        assert envs.host_restarts == 1
    finally:
        envs.close()
