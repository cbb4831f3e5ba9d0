"""Envs of different ids or kwargs in one vector env, made from ids alone (no pickle).

``env_id`` and ``env_kwargs`` take one value per env: the results are those of
``SyncVectorEnv`` over the same list, on hosts that refuse pickle, in every autoreset mode; a
host lost is re-made with each env's own id and kwargs.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from helpers import assert_same

from envserver import client
from envserver.testing import start_host

#: Three CartPoles that differ: time limits, an id, a reward.
IDS = ["CartPole-v1", "CartPole-v0", "CartPole-v1"]
KWARGS = [{"max_episode_steps": 4}, {"max_episode_steps": 7}, {"sutton_barto_reward": True}]


def run_beside(remote, oracle, mode, steps=24):
    """Same seeds and actions; the ended envs reset by mask in DISABLED mode."""
    try:
        assert_same(remote.reset(seed=7), oracle.reset(seed=7))
        rng = np.random.default_rng(1)
        for _ in range(steps):
            action = rng.integers(0, 2, size=remote.num_envs)
            result = remote.step(action)
            assert_same(result, oracle.step(action))
            ended = result[2] | result[3]
            if mode == AutoresetMode.DISABLED and ended.any():
                mask = {"reset_mask": ended}
                assert_same(remote.reset(options=mask), oracle.reset(options=mask))
    finally:
        remote.close()
        oracle.close()


@pytest.mark.filterwarnings("ignore:.*CartPole-v0 is out of date")
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_each_env_its_own_id_and_kwargs_as_sync_vector_env(plain_hosts, mode):
    remote = client.RemoteVectorEnv(
        env_id=IDS, env_kwargs=KWARGS, hosts=plain_hosts[:2], autoreset_mode=mode
    )
    fns = [functools.partial(gym.make, i, **k) for i, k in zip(IDS, KWARGS)]
    assert remote.get_attr("_max_episode_steps") == (4, 7, 500)
    run_beside(remote, gym.vector.SyncVectorEnv(fns, autoreset_mode=mode), mode)


def test_one_id_with_kwargs_per_env_and_spaces_that_differ(plain_hosts):
    maps = [{"map_name": "4x4"}, {"map_name": "8x8"}]
    remote = client.RemoteVectorEnv(
        env_id="FrozenLake-v1", env_kwargs=maps, hosts=plain_hosts[:1], observation_mode="different"
    )
    fns = [functools.partial(gym.make, "FrozenLake-v1", **k) for k in maps]
    oracle = gym.vector.SyncVectorEnv(fns, observation_mode="different")
    assert remote.single_observation_space == oracle.single_observation_space
    assert remote.observation_space == oracle.observation_space
    run_beside(remote, oracle, AutoresetMode.NEXT_STEP)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"env_id": IDS, "num_envs": 2}, ValueError, "num_envs=2 but env_id lists 3 envs"),
        (
            {"env_id": IDS, "env_kwargs": KWARGS[:2]},
            ValueError,
            "num_envs=3 but env_kwargs lists 2 envs",
        ),
        ({"env_id": []}, ValueError, "env_id is an empty list"),
        ({"env_id": ["CartPole-v1", 1]}, TypeError, "env_id must be a string or a list"),
        ({"env_id": "CartPole-v1", "env_kwargs": [1]}, TypeError, "env_kwargs must be a dict"),
    ],
)
def test_lists_that_disagree_are_refused_before_any_host(arguments, error, message):
    with pytest.raises(error, match=message):
        client.RemoteVectorEnv(**arguments, hosts=["tcp://127.0.0.1:1"], connect_timeout_s=0.1)


def test_a_lost_host_is_remade_with_each_envs_own_kwargs(tmp_path):
    host, other, spare = (start_host(tmp_path, bind="tcp://127.0.0.1:*") for _ in range(3))
    gravities = [{"g": 9.0}, {"g": 10.0}, {"g": 11.0}, {"g": 12.0}]
    envs = client.RemoteVectorEnv(
        env_id="Pendulum-v1",
        env_kwargs=gravities,
        hosts=[other.endpoint, host.endpoint],
        on_host_failure="restart",
        spare_hosts=[spare.endpoint],
        host_timeout_s=3.0,
    )
    try:
        envs.reset(seed=0)
        host.process.kill()
        result = envs.step(np.zeros((4, 1), dtype=np.float32))
        assert result[3].tolist() == [False, False, True, True]  # envs 2 and 3: re-made
        assert envs.hosts == (other.endpoint, spare.endpoint)
        assert envs.get_attr("g") == (9.0, 10.0, 11.0, 12.0)
    finally:
        envs.close()
        for process in (host, other, spare):
            process.stop()
