"""First-ready batches: send(actions, env_ids) / recv() return the first envs to finish, each env
keeping exactly the autoreset semantics of the chosen mode; hosts answer sub-batches early."""

from __future__ import annotations

import functools
import multiprocessing
import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same, channels_messages

from envserver import client
from envserver.wire.slab import SLAB_DIRECTORY

EPISODIC = "envserver.testing:envserver/Episodic-v0"
KWARGS = {"terminate_prob": 0.1, "max_steps": 8}


def single_oracles(count: int, mode: AutoresetMode, seed: int) -> list[SyncVectorEnv]:
    """One 1-env SyncVectorEnv per env id, seeded as env ``i`` of a seeded vector env is."""
    oracles = []
    for i in range(count):
        oracle = SyncVectorEnv(
            [functools.partial(gym.make, "envserver/Episodic-v0", **KWARGS)], autoreset_mode=mode
        )
        oracle.reset(seed=seed + i)
        oracles.append(oracle)
    return oracles


def action_for(env_id: int, t: int) -> int:
    return (env_id * 7 + t * 3) % 3


@pytest.mark.parametrize("where", ["remote", "local"])
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_each_env_matches_its_own_oracle(pickle_hosts, mode, where):
    # Local hosts: each of a host's sub-batches under way in a channel of its own.
    num_envs, seed = 6, 40
    hosts = {"hosts": pickle_hosts} if where == "remote" else {"num_local_hosts": 2}
    envs = client.make_vec(
        EPISODIC,
        num_envs=num_envs,
        vector_kwargs={"autoreset_mode": mode, "batch_size": 2, "sub_batch_size": 1, **hosts},
        **KWARGS,
    )
    # Different step times per env, so envs come back out of order.
    envs.set_attr("step_delay_s", [0.0, 0.004, 0.0, 0.002, 0.006, 0.0])
    oracles = single_oracles(num_envs, mode, seed)
    first_obs = [oracle.reset(seed=seed + i)[0][0] for i, oracle in enumerate(oracles)]
    steps = np.zeros(num_envs, dtype=int)
    episodes = 0
    try:
        envs.async_reset(seed=seed)
        for _ in range(90):
            obs, rewards, terminations, truncations, infos = envs.recv()
            ids = infos["env_id"]
            assert obs.shape == (2, 4) and ids.shape == (2,)
            to_reset = []
            for k, env_id in enumerate(ids):
                if steps[env_id] == 0:  # the reset result
                    np.testing.assert_array_equal(obs[k], first_obs[env_id])
                    assert rewards[k] == 0 and not terminations[k] and not truncations[k]
                else:
                    expected = oracles[env_id].last
                    np.testing.assert_array_equal(obs[k], expected[0][0])
                    assert rewards[k] == expected[1][0]
                    assert terminations[k] == expected[2][0]
                    assert truncations[k] == expected[3][0]
                    if mode == AutoresetMode.SAME_STEP and (terminations[k] or truncations[k]):
                        assert_same(infos["final_obs"][k], expected[4]["final_obs"][0])
                        assert infos["_final_obs"][k]
                    if terminations[k] or truncations[k]:
                        episodes += 1
                        if mode == AutoresetMode.DISABLED:
                            to_reset.append(int(env_id))
            stepped = [int(e) for e in ids if int(e) not in to_reset]
            if stepped:
                actions = np.array([action_for(e, steps[e]) for e in stepped])
                for e, a in zip(stepped, actions):
                    oracles[e].last = oracles[e].step(np.array([a]))
                    steps[e] += 1
                envs.send(actions, stepped)
            if to_reset:
                for e in to_reset:
                    first_obs[e] = oracles[e].reset(options={"reset_mask": np.array([True])})[0][0]
                    steps[e] = 0
                envs.async_reset(env_ids=to_reset)
        posted = channels_messages(envs)
    finally:
        envs.close()
        for oracle in oracles:
            oracle.close()
    assert episodes >= 5
    if where == "local" and os.path.isdir(SLAB_DIRECTORY):  # 3 envs, 3 sub-batches per host
        assert [len(host) for host in posted] == [3, 3]
        assert all(count > 0 for host in posted for count in host[1:]), posted


def test_first_ready_across_hosts(pickle_hosts, tmp_path):
    """Host 0's envs cannot finish until the gate opens: the first batch must be host 1's."""
    gate = tmp_path / "gate"
    envs = client.make_vec(
        EPISODIC,
        num_envs=4,
        hosts=pickle_hosts[:2],
        vector_kwargs={"batch_size": 2},
        terminate_prob=0.0,
    )
    try:
        envs.reset(seed=0)
        envs.set_attr("step_gate", [str(gate), str(gate), None, None])
        envs.send(np.zeros(4, dtype=np.int64))
        assert envs.recv(timeout=60)[4]["env_id"].tolist() == [2, 3]
        envs.send(np.ones(2, dtype=np.int64), [2, 3])
        assert envs.recv(timeout=60)[4]["env_id"].tolist() == [2, 3]
        gate.touch()
        assert envs.recv(timeout=60)[4]["env_id"].tolist() == [0, 1]
    finally:
        envs.close()


def test_default_batch_is_lockstep(plain_hosts):
    envs = client.make_vec("CartPole-v1", num_envs=5, hosts=plain_hosts[:2])
    oracle = gym.make_vec("CartPole-v1", num_envs=5, vectorization_mode="sync")
    try:
        assert envs.batch_size == 5
        envs.async_reset(seed=3)
        obs, *_, infos = envs.recv()
        assert_same(obs, oracle.reset(seed=3)[0])
        assert infos["env_id"].tolist() == [0, 1, 2, 3, 4]
        for t in range(30):
            actions = np.full(5, t % 2)
            envs.send(actions)
            result = envs.recv()
            expected = oracle.step(actions)
            assert result[4]["env_id"].tolist() == [0, 1, 2, 3, 4]
            for got, want in zip(result[:4], expected[:4]):
                assert_same(got, want)
        # Back to lockstep once nothing is in flight.
        actions = np.zeros(5, dtype=np.int64)
        assert_same(envs.step(actions)[:4], oracle.step(actions)[:4])
    finally:
        envs.close()
        oracle.close()


def test_hosts_answer_sub_batches_early(pickle_hosts, tmp_path):
    """Env 3 cannot finish until the test opens its gate, after the first recv: so that recv can
    only return if the host answered envs 0 and 1 before stepping env 3."""
    gate = tmp_path / "gate"
    envs = client.make_vec(
        EPISODIC,
        num_envs=4,
        hosts=pickle_hosts[:1],
        vector_kwargs={"batch_size": 2, "sub_batch_size": 2},
        terminate_prob=0.0,
    )
    try:
        envs.reset(seed=0)
        envs.set_attr("step_gate", [None, None, None, str(gate)])
        envs.send(np.zeros(4, dtype=np.int64))
        first = envs.recv(timeout=60)
        assert first[4]["env_id"].tolist() == [0, 1]
        gate.touch()
        second = envs.recv(timeout=60)
        assert second[4]["env_id"].tolist() == [2, 3]
    finally:
        envs.close()


def test_misuse_is_refused(plain_hosts):
    envs = client.make_vec(
        "CartPole-v1",
        num_envs=4,
        hosts=plain_hosts[:2],
        vector_kwargs={"batch_size": 2},
    )
    try:
        assert envs.sub_batch_size == 1
        envs.reset(seed=0)
        with pytest.raises(RuntimeError, match="send more"):
            envs.recv()
        with pytest.raises(ValueError, match="actions"):
            envs.send(np.zeros(3, dtype=np.int64), [0, 1])
        for bad in ([0, 0], [4], [-1], [[0, 1]], []):
            with pytest.raises(ValueError, match="env_ids"):
                envs.send(np.zeros(len(bad), dtype=np.int64), bad)
        envs.send(np.zeros(2, dtype=np.int64), [1, 3])
        with pytest.raises(ValueError, match="already in flight"):
            envs.send(np.zeros(1, dtype=np.int64), [3])
        with pytest.raises(AlreadyPendingCallError):
            envs.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(AlreadyPendingCallError):
            envs.reset()
        with pytest.raises(AlreadyPendingCallError):
            envs.get_attr("gravity")
        assert sorted(envs.recv()[4]["env_id"].tolist()) == [1, 3]
        envs.step_async(np.zeros(4, dtype=np.int64))
        with pytest.raises(AlreadyPendingCallError):
            envs.send(np.zeros(4, dtype=np.int64))
        envs.step_wait()
        envs.send(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()  # with envs in flight
    assert envs.closed


def test_envs_received_and_not_handed_out_keep_lockstep_calls_waiting(plain_hosts):
    """Four envs sent, a batch of two received: the other two wait to be handed out, so a
    lockstep step is refused until they are; then it runs."""
    envs = client.make_vec(
        "CartPole-v1", num_envs=4, hosts=plain_hosts[:2], vector_kwargs={"batch_size": 2}
    )
    try:
        envs.reset(seed=0)
        envs.send(np.zeros(4, dtype=np.int64))
        first = envs.recv()[4]["env_id"].tolist()
        with pytest.raises(AlreadyPendingCallError):
            envs.step(np.zeros(4, dtype=np.int64))
        second = envs.recv()[4]["env_id"].tolist()
        assert sorted(first + second) == [0, 1, 2, 3]
        obs, *_ = envs.step(np.zeros(4, dtype=np.int64))
        assert obs.shape == (4, 4)
    finally:
        envs.close()


def test_recv_timeout_keeps_envs_in_flight(pickle_hosts):
    envs = client.make_vec(
        EPISODIC,
        num_envs=2,
        hosts=pickle_hosts[:1],
        vector_kwargs={"batch_size": 2},
        step_delay_s=1.0,
        terminate_prob=0.0,
    )
    try:
        envs.reset(seed=0)
        envs.send(np.zeros(2, dtype=np.int64))
        with pytest.raises(multiprocessing.TimeoutError):
            envs.recv(timeout=0.01)
        assert sorted(envs.recv(timeout=60)[4]["env_id"].tolist()) == [0, 1]
    finally:
        envs.close()


def test_env_error_in_a_sub_batch(plain_hosts):
    envs = client.RemoteVectorEnv(
        env_id="envserver.testing:envserver/Failing-v0",
        num_envs=4,
        hosts=plain_hosts[:2],
        batch_size=2,
    )
    try:
        envs.set_attr("step_error_at", [None, None, 1, None])
        envs.reset(seed=0)
        envs.send(np.zeros(4, dtype=np.int64))
        with pytest.raises(ValueError, match=r"env 2: simulated failure in step"):
            for _ in range(2):
                envs.recv(timeout=60)
    finally:
        envs.close()
