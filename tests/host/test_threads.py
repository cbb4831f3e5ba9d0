"""In-host concurrency (``env_threads``): envs stepped on threads give SyncVectorEnv's results.

The block's pool is checked in-process (envs that only get through a step when all of them are
inside it at once prove the concurrency without timing anything); RemoteVectorEnv with
``env_threads`` is compared step by step with SyncVectorEnv on real hosts, in every autoreset
mode; an env raising in a thread is named, the others step; the pool ends with the session.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import zmq
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same, running_hosts

from envserver import client
from envserver.host.worker import THREAD_NAME_PREFIX, EnvBlock, EnvCallError
from envserver.wire.messages import Command, Status, decode_reply, encode_request

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
FAILING = "envserver.testing:envserver/Failing-v0"
TIMEOUT_S = 60.0


class MeetingEnv(gym.Env):
    """Every reset and step waits until ``party`` envs of this process are inside one at once.

    Only envs stepped concurrently get through (one after another, the first would wait in
    vain and raise ``BrokenBarrierError``). Each step reports the thread that ran it.
    """

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    _barriers: dict[int, threading.Barrier] = {}
    _lock = threading.Lock()

    def __init__(self, party: int) -> None:
        with self._lock:
            self.barrier = self._barriers.setdefault(party, threading.Barrier(party))

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.barrier.wait(TIMEOUT_S)
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action: Any) -> tuple:
        self.barrier.wait(TIMEOUT_S)
        obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return obs, float(action), False, False, {"thread": threading.current_thread().name}

    def thread(self) -> str:
        return threading.current_thread().name


def sleepy_episodic(delay_s: float) -> gym.Env:
    """Episodic-v0 with a step that sleeps: envs of one host finish in a scrambled order."""
    return gym.make(
        "envserver/Episodic-v0", terminate_prob=0.08, max_steps=12, step_delay_s=delay_s
    )


def block_outputs(block: EnvBlock, steps: int, seed: int) -> list[Any]:
    """Everything a block returns over a run with fixed seeds, actions and env subsets."""
    rng = np.random.default_rng(seed)
    outputs = [block.reset([seed + i for i in range(block.num_envs)], None)]
    ended: set[int] = set()
    for t in range(steps):
        ids = None if t % 3 else sorted(rng.choice(block.num_envs, 3, replace=False).tolist())
        ids_or_all = range(block.num_envs) if ids is None else ids
        outputs.append(block.step(rng.integers(0, 3, len(ids_or_all)), ids))
        _, _, terminations, truncations, _ = outputs[-1]
        ended.update(i for i, done in zip(ids_or_all, terminations | truncations) if done)
        if block.autoreset_mode == AutoresetMode.DISABLED and ended:
            outputs.append(block.reset([None] * len(ended), {"offset": 1.0}, sorted(ended)))
            ended.clear()
    return outputs


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("env_threads", [2, 3, 7])
def test_a_threaded_block_returns_what_the_sequential_one_returns(mode, env_threads):
    delays = [0.0005 * (i % 3) for i in range(7)]
    sequential = EnvBlock([sleepy_episodic(d) for d in delays], mode)
    threaded = EnvBlock([sleepy_episodic(d) for d in delays], mode, env_threads=env_threads)
    try:
        assert threaded.env_threads == env_threads
        assert_same(block_outputs(threaded, 60, 3), block_outputs(sequential, 60, 3))
    finally:
        sequential.close()
        threaded.close()


def test_a_threaded_block_steps_and_resets_its_envs_at_once():
    block = EnvBlock([MeetingEnv(4) for _ in range(8)], AutoresetMode.NEXT_STEP, env_threads=4)
    try:
        block.reset(list(range(8)), None)  # two envs per thread: they meet in two rounds
        *_, entries = block.step(np.zeros(8, dtype=np.int64))
        threads = [info["thread"] for _, info in entries]
        assert [i for i, _ in entries] == list(range(8))
        assert all(name.startswith(THREAD_NAME_PREFIX) for name in threads)
        assert len(set(threads)) == 4
        assert (
            block.call("thread", [], {}) == ["MainThread"] * 8
        )  # calls run on the caller's thread
    finally:
        block.close()


def test_threads_are_capped_by_the_env_count_and_one_means_no_pool():
    capped = EnvBlock([sleepy_episodic(0.0) for _ in range(3)], AutoresetMode.NEXT_STEP, 16)
    single = EnvBlock([sleepy_episodic(0.0) for _ in range(3)], AutoresetMode.NEXT_STEP, 1)
    assert capped.env_threads == 3
    assert single.env_threads == 1 and single._pool is None
    capped.close()
    single.close()


def test_an_env_raising_in_a_thread_is_named_and_the_others_still_step():
    envs = [gym.make(FAILING, step_error_at=at) for at in (None, 2, None, 2, None)]
    block = EnvBlock(envs, AutoresetMode.NEXT_STEP, env_threads=5)
    try:
        block.reset(list(range(5)), None)
        block.step(np.zeros(5, dtype=np.int64))
        with pytest.raises(EnvCallError) as caught:
            block.step(np.zeros(5, dtype=np.int64))
        assert caught.value.index == 1  # the first of the two that raised
        assert "simulated failure in step" in str(caught.value.error)
        assert caught.value.__cause__ is caught.value.error
        assert block.call("_t", [], {}) == [2, 2, 2, 2, 2]  # every env took its second step
        obs, rewards, *_ = block.step(np.zeros(5, dtype=np.int64))
        assert rewards.tolist() == [1.0] * 5 and obs.shape == (5, 2)
    finally:
        block.close()


def test_a_threaded_reset_goes_on_past_an_env_that_raises():
    envs = [gym.make(FAILING, reset_error_at=at) for at in (None, 1, 1, None)]
    block = EnvBlock(envs, AutoresetMode.NEXT_STEP, env_threads=4)
    try:
        with pytest.raises(EnvCallError) as caught:
            block.reset([0, 1, 2, 3], None)
        assert caught.value.index == 1
        assert block.call("resets", [], {}) == [1, 1, 1, 1]
        obs, _ = block.reset([0, 1, 2, 3], None)
        assert obs.shape == (4, 2)
    finally:
        block.close()


def test_closing_a_block_ends_its_threads():
    block = EnvBlock([MeetingEnv(3) for _ in range(3)], AutoresetMode.NEXT_STEP, env_threads=3)
    block.reset([0, 1, 2], None)
    block.step(np.zeros(3, dtype=np.int64))
    pool_threads = [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]
    assert len(pool_threads) >= 3
    block.close()
    assert not any(t.is_alive() for t in pool_threads)


# ------------------------------------------------------------------ over the wire


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_remote_envs_on_threads_match_sync_vector_env(mode):
    fns = [functools.partial(sleepy_episodic, 0.0005 * (i % 3)) for i in range(7)]
    remote = client.RemoteVectorEnv(
        fns, num_local_hosts=2, env_threads=3, autoreset_mode=mode, info_format="dict"
    )
    oracle = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        assert_same(remote.reset(seed=11), oracle.reset(seed=11), "reset")
        oracle.action_space.seed(11)
        for t in range(80):
            actions = oracle.action_space.sample()
            expected = oracle.step(actions)
            assert_same(remote.step(actions), expected, f"step {t}")
            done = expected[2] | expected[3]
            if mode == AutoresetMode.DISABLED and done.any():
                mask = {"reset_mask": done.copy()}
                assert_same(remote.reset(options=mask), oracle.reset(options=mask), f"reset {t}")
        # call, get_attr and set_attr are not affected.
        assert_same(remote.call("render"), oracle.call("render"))
        assert_same(remote.get_attr("max_steps"), oracle.get_attr("max_steps"))
        remote.set_attr("max_steps", [3, 4, 5, 6, 7, 8, 9])
        oracle.set_attr("max_steps", [3, 4, 5, 6, 7, 8, 9])
        assert_same(remote.get_attr("max_steps"), oracle.get_attr("max_steps"))
    finally:
        remote.close()
        oracle.close()


def test_remote_envs_step_at_once_on_their_host():
    envs = client.RemoteVectorEnv([functools.partial(MeetingEnv, 3)] * 6, num_local_hosts=2,
                                  env_threads=3)  # fmt: skip
    try:
        envs.reset(seed=0)
        *_, infos = envs.step(np.zeros(6, dtype=np.int64))
        assert all(name.startswith(THREAD_NAME_PREFIX) for name in infos["thread"])
    finally:
        envs.close()


def test_a_remote_env_raising_in_a_thread_is_named_and_the_others_step(plain_hosts):
    envs = client.RemoteVectorEnv(env_id=FAILING, num_envs=4, hosts=plain_hosts[:1], env_threads=4)
    try:
        envs.set_attr("step_error_at", [None, 2, None, 2])
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(ValueError, match=r"env 1: simulated failure in step") as caught:
            envs.step(np.zeros(4, dtype=np.int64))
        assert plain_hosts[0] in str(caught.value)
        assert envs.get_attr("_t") == (2, 2, 2, 2)  # every env took its second step
        envs.set_attr("step_error_at", None)
        oracle = SyncVectorEnv([functools.partial(gym.make, FAILING)] * 4)
        assert_same(envs.reset(seed=5), oracle.reset(seed=5))
        for _ in range(3):
            actions = np.ones(4, dtype=np.int64)
            assert_same(envs.step(actions), oracle.step(actions))
        oracle.close()
    finally:
        envs.close()


def test_env_threads_must_be_a_positive_integer():
    for bad in (0, -1, 2.0, True, "4"):
        with pytest.raises(ValueError, match="env_threads"):
            client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=2, hosts=[], env_threads=bad)


class RawSession:
    """A bare DEALER socket with a session on one host: MAKE bodies as the client cannot send."""

    def __init__(self, endpoint: str) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.ids = iter(range(1, 1000))
        self.session = self.ask(Command.HELLO, {"client": "test"}, None).body["session"]

    def ask(self, command: Command, body: Any, session: bytes | None = b"") -> Any:
        session = self.session if session == b"" else session
        self.socket.send_multipart(
            encode_request(next(self.ids), command, session, body, allow_pickle=False)
        )
        assert self.socket.poll(int(TIMEOUT_S * 1000)), "the host did not answer"
        return decode_reply(self.socket.recv_multipart(), allow_pickle=False)

    def close(self) -> None:
        self.socket.close()
        self.context.term()


def _threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_the_host_caps_env_threads_and_ends_the_pool_with_the_session(tmp_path):
    with running_hosts(tmp_path, 1, "--max-env-threads", "3") as (host,):
        raw = RawSession(host.endpoint)
        try:
            make = {"env_id": "CartPole-v1", "num_envs": 5}
            for bad in (0, -2, 1.5, True, "3"):
                reply = raw.ask(Command.MAKE, {**make, "env_threads": bad})
                assert reply.status == Status.ERROR
                assert "env_threads must be a positive integer" in reply.body["message"]
            before = _threads_of(host.process.pid)
            reply = raw.ask(Command.MAKE, {**make, "env_threads": 8})
            assert reply.status == Status.OK and reply.body["env_threads"] == 3
            assert raw.ask(Command.RESET, {"seeds": [0] * 5, "options": None}).status == Status.OK
            assert raw.ask(Command.STEP, {"actions": np.zeros(5, np.int64)}).status == Status.OK
            assert before < _threads_of(host.process.pid) <= before + 3  # started as needed
            assert raw.ask(Command.CLOSE, None).status == Status.OK
            _wait_for(lambda: _threads_of(host.process.pid) == before, "pool threads left")
            second = RawSession(host.endpoint)  # without env_threads: automatic, in turn first
            reply = second.ask(Command.MAKE, make)
            assert reply.status == Status.OK and reply.body["env_threads"] == 1
            assert reply.body["env_threads_auto"] is True
            second.close()
        finally:
            raw.close()
