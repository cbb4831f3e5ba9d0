"""Automatic env threads: a host steps envs that wait on threads and envs that compute in turn,
without being told, switches as the envs change, and returns exactly what SyncVectorEnv does.

The decisions are asserted, never timings: an env that sleeps is blocked nearly all of its
step, one that burns CPU (counted in CPU time, so that a busy machine only slows it) nearly
none of it.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same, metrics_url, scrape, wait_for_text

from envserver import client
from envserver.host import concurrency
from envserver.host.concurrency import Concurrency, StepTimer
from envserver.host.worker import EnvBlock
from envserver.testing import start_host

EPISODIC = "envserver.testing:envserver/Episodic-v0"


@pytest.fixture(autouse=True)
def frequent_probes(monkeypatch):
    """Probes every 16 steps rather than every 128, so that switching back takes fewer steps."""
    monkeypatch.setattr(concurrency, "PROBE_EVERY", 16)


MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
TIMEOUT_S = 60.0


def burn_cpu(seconds: float) -> None:
    """Spends ``seconds`` of this thread's CPU time, however long that takes on the wall."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class PhasedEnv(gym.Env):
    """Waits (sleeps) in its first ``wait_steps`` steps, then computes (burns CPU) in each."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, wait_steps: int, step_s: float = 0.001) -> None:
        self.wait_steps = wait_steps
        self.step_s = step_s
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action: Any) -> tuple:
        self.steps += 1
        if self.steps <= self.wait_steps:
            time.sleep(self.step_s)
        else:
            burn_cpu(self.step_s)
        obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        info = {"step": self.steps} if self.steps % 3 == 0 else {}
        return obs, float(action), bool(self.np_random.random() < 0.05), False, info


def sleepy(delay_s: float = 0.001) -> gym.Env:
    return gym.make(
        "envserver/Episodic-v0", terminate_prob=0.08, max_steps=12, step_delay_s=delay_s
    )


def run_block(block: EnvBlock, steps: int) -> list[int]:
    """Steps ``block`` with fixed actions; returns how many envs it stepped at once each step."""
    used = []
    block.reset(list(range(block.num_envs)), None)
    for t in range(steps):
        block.step(np.full(block.num_envs, t % 2, dtype=np.int64))
        used.append(block.env_threads)
    return used


def test_a_block_of_envs_that_wait_steps_them_all_at_once_unasked():
    block = EnvBlock([sleepy() for _ in range(6)], AutoresetMode.NEXT_STEP, None, 4)
    try:
        assert block.concurrency.auto and block.env_threads == 1  # in turn until measured
        first = concurrency.MIN_SAMPLES  # the step that decides: the first ones are all measured
        used = run_block(block, first + 5)
        assert used[-1] == 4  # capped by max_env_threads
        assert used.index(4) == first - 1  # as soon as it knew
    finally:
        block.close()


def test_a_block_of_envs_that_compute_steps_them_in_turn():
    block = EnvBlock([PhasedEnv(0) for _ in range(4)], AutoresetMode.NEXT_STEP, None, 64)
    try:
        assert set(run_block(block, 60)) == {1}
    finally:
        block.close()


def test_a_block_follows_its_envs_from_waiting_to_computing():
    wait_steps = concurrency.DWELL_STEPS + 10
    block = EnvBlock([PhasedEnv(wait_steps) for _ in range(4)], AutoresetMode.NEXT_STEP, None, 64)
    try:
        used = run_block(block, wait_steps + concurrency.PROBE_EVERY * (concurrency.WINDOW + 2))
        assert used[wait_steps - 1] == 4  # waiting: all at once
        assert used[-1] == 1  # computing: back to one after another
        switches = sum(a != b for a, b in itertools.pairwise(used))
        assert switches == 2, f"flapped: {used}"
    finally:
        block.close()


def test_a_fixed_env_threads_is_kept_and_not_measured():
    for fixed in (1, 3):
        block = EnvBlock([sleepy() for _ in range(3)], AutoresetMode.NEXT_STEP, fixed, 64)
        try:
            assert not block.concurrency.measuring
            assert set(run_block(block, 12)) == {fixed}
        finally:
            block.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_results_across_switches_are_sync_vector_envs(mode):
    """Envs that wait, then compute: the block switches twice (probing each env in turn while
    on threads) and returns what SyncVectorEnv returns, and the same info entries, in the same
    order, as a block that steps its envs one after another."""
    num_envs, wait_steps = 5, concurrency.DWELL_STEPS + 10
    steps = wait_steps + concurrency.PROBE_EVERY * (concurrency.WINDOW + 2)

    def envs() -> list[gym.Env]:
        return [PhasedEnv(wait_steps, 0.0005) for _ in range(num_envs)]

    block = EnvBlock(envs(), mode, None, 64)
    in_turn = EnvBlock(envs(), mode, 1, 64)
    oracle = SyncVectorEnv([lambda env=env: env for env in envs()], autoreset_mode=mode)
    try:
        seeds = list(range(num_envs))
        assert_same(block.reset(seeds, None), in_turn.reset(seeds, None))
        assert_same(block.reset(seeds, None)[0], oracle.reset(seed=seeds)[0])
        in_turn.reset(seeds, None)
        used = set()
        for t in range(steps):
            actions = np.full(num_envs, t % 2, dtype=np.int64)
            result = block.step(actions)
            assert_same(result, in_turn.step(actions))  # infos included
            assert_same(result[:4], oracle.step(actions)[:4])
            used.add(block.env_threads)
            done = result[2] | result[3]
            if mode == AutoresetMode.DISABLED and done.any():
                ids = np.flatnonzero(done).tolist()
                reset = block.reset([None] * len(ids), None, ids)
                assert_same(reset, in_turn.reset([None] * len(ids), None, ids))
                assert_same(reset[0], oracle.reset(options={"reset_mask": done})[0][done])
        assert used == {1, num_envs}
    finally:
        for closing in (block, in_turn, oracle):
            closing.close()


def measured(auto: Concurrency, share: float, wall_s: float = 1.0, envs: int = 8) -> bool:
    """One step, measured: the share of ``wall_s`` its ``envs`` were blocked."""
    auto.sample_due() if auto.threads == 1 else auto.probe(envs)
    return auto.record(wall_s, share * wall_s, envs=envs)


def test_decisions_use_the_median_and_a_gap_between_thresholds():
    auto = Concurrency(8, None, 64)
    for _ in range(concurrency.MIN_SAMPLES - 1):
        assert not measured(auto, 0.9)  # too few measures yet
    assert measured(auto, 0.9) and auto.threads == 8
    for _ in range(concurrency.DWELL_STEPS * 2):  # between the thresholds: stays
        assert not measured(auto, 0.35)
    for _ in range(concurrency.WINDOW):
        measured(auto, 0.01)
    assert auto.threads == 1
    after_dwell = [0.0] * concurrency.DWELL_STEPS + [0.9] + [0.0] * concurrency.WINDOW
    for share in after_dwell:  # one slow measure in a window does not decide
        measured(auto, share)
        assert auto.threads == 1, "an outlier switched it"
    short = Concurrency(8, None, 64)  # blocked most of the time, but too briefly to pay off
    for _ in range(concurrency.WINDOW):
        measured(short, 0.9, wall_s=20e-6 * 8)
    assert short.threads == 1
    assert Concurrency(1, None, 64).most == 1 and not Concurrency(1, None, 64).measuring


def test_the_step_timer_tells_waiting_from_computing():
    timer = StepTimer()
    try:
        mark = timer.start()
        time.sleep(0.02)
        wall, blocked = timer.blocked_since(mark)
        assert blocked > 0.5 * wall
        mark = timer.start()
        burn_cpu(0.02)
        wall, blocked = timer.blocked_since(mark)
        assert blocked < 0.5 * wall
    finally:
        timer.close()


def test_remote_hosts_choose_and_say_what_they_chose(tmp_path):
    """By default, local hosts step sleepy envs at once and CartPole in turn; a metric and a
    log line say so."""
    waiting = client.make_vec(EPISODIC, 6, vector_kwargs={"num_local_hosts": 2}, step_delay_s=0.002)
    computing = client.make_vec("CartPole-v1", 6, vector_kwargs={"num_local_hosts": 2})
    try:
        assert waiting.env_threads is None and waiting.env_threads_in_use() == (1, 1)
        for envs in (waiting, computing):
            envs.reset(seed=0)
            for _ in range(concurrency.MIN_SAMPLES + 2):
                envs.step(np.zeros(6, dtype=np.int64))
        # On a busy machine a measure may be off: the median of the next ones decides.
        for _ in range(20 * concurrency.WINDOW):
            if waiting.env_threads_in_use() == (3, 3):
                break
            waiting.step(np.zeros(6, dtype=np.int64))
        assert waiting.env_threads_in_use() == (3, 3)
        assert computing.env_threads_in_use() == (1, 1)
    finally:
        waiting.close()
        computing.close()
    host = start_host(tmp_path, "--metrics-port", "0", bind="tcp://127.0.0.1:*")
    try:
        url = metrics_url(host)
        envs = client.make_vec(EPISODIC, 4, hosts=[host.endpoint], step_delay_s=0.002)
        envs.reset(seed=0)
        for _ in range(concurrency.MIN_SAMPLES + 2):
            envs.step(np.zeros(4, dtype=np.int64))
        samples = scrape(url)
        assert samples[("envserver_envs_on_threads", ())] == 4
        assert samples[("envserver_env_threads_switches_total", ())] == 1
        envs.close()
        assert scrape(url)[("envserver_envs_on_threads", ())] == 0
        wait_for_text(host.log_text, "its 4 envs wait: now stepped 4 at once on threads")
    finally:
        host.stop()
