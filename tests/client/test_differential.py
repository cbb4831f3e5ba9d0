"""RemoteVectorEnv against gymnasium.vector.SyncVectorEnv: same seeds, same actions, same outputs.

Every output is compared exactly (observations, rewards, flags, infos with their masks,
``final_obs``/``final_info``), in every autoreset mode, over 1, 2 and 3 hosts with uneven
env counts, for long enough that many episodes end.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same, channel_messages

from envserver import client

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
ENVS = {
    "CartPole-v1": {},
    "envserver/DictTuple-v0": {},
    "envserver/Episodic-v0": {"terminate_prob": 0.08, "max_steps": 12},
}
LAYOUTS = {1: [5], 2: [3, 4], 3: [1, 4, 2]}


def run_side_by_side(
    remote: gym.vector.VectorEnv, oracle: gym.vector.VectorEnv, steps: int, seed: int
) -> int:
    """Drives both vector envs with the same seeds and actions; returns the episodes ended."""
    assert remote.single_observation_space == oracle.single_observation_space
    assert remote.single_action_space == oracle.single_action_space
    assert remote.action_space == oracle.action_space
    assert remote.observation_space == oracle.observation_space
    assert remote.metadata["autoreset_mode"] == oracle.metadata["autoreset_mode"]
    assert_same(remote.reset(seed=seed), oracle.reset(seed=seed), "reset")
    oracle.action_space.seed(seed)
    disabled = oracle.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    episodes = 0
    for t in range(steps):
        actions = oracle.action_space.sample()
        expected = oracle.step(actions)
        actual = remote.step(actions)
        assert_same(actual, expected, f"step {t}")
        done = expected[2] | expected[3]
        episodes += int(done.sum())
        if disabled and done.any():
            assert_same(
                remote.reset(options={"reset_mask": done.copy()}),
                oracle.reset(options={"reset_mask": done.copy()}),
                f"partial reset after step {t}",
            )
    return episodes


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("num_hosts", [1, 2, 3])
@pytest.mark.parametrize("env_id", list(ENVS))
@pytest.mark.parametrize("link", ["zeromq", "channel"])
def test_matches_sync_vector_env(pickle_hosts, plain_hosts, env_id, num_hosts, mode, link):
    kwargs = ENVS[env_id]
    counts = LAYOUTS[num_hosts]
    # Registered ids travel pickle-free; the package's own test envs by their module:id form.
    full_id = env_id if env_id == "CartPole-v1" else f"envserver.testing:{env_id}"
    remote = client.make_vec(  # hosts of its own on this machine: steps in their channels
        full_id,
        num_envs=sum(counts),
        hosts=plain_hosts[:num_hosts] if link == "zeromq" else None,
        vector_kwargs={"autoreset_mode": mode, "envs_per_host": counts},
        **kwargs,
    )
    oracle = SyncVectorEnv(
        [functools.partial(gym.make, env_id, **kwargs)] * sum(counts), autoreset_mode=mode
    )
    try:
        episodes = run_side_by_side(remote, oracle, steps=120, seed=7 + num_hosts)
        posted = channel_messages(remote)
    finally:
        remote.close()
        oracle.close()
    assert episodes >= 10, "too few episodes ended for the comparison to mean much"
    if link == "zeromq":
        assert posted == [-1] * num_hosts
    else:  # every step and reset but the first reset (sent with the MAKE's replies pending)
        assert all(count >= 120 for count in posted), posted


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_pickled_factories_match_sync_vector_env(pickle_hosts, mode):
    fns = [
        functools.partial(
            gym.make, "envserver.testing:envserver/Episodic-v0", terminate_prob=0.1, max_steps=p
        )
        for p in (5, 9, 13, 7, 11)
    ]
    remote = client.RemoteVectorEnv(fns, hosts=pickle_hosts, autoreset_mode=mode)
    oracle = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        assert remote.envs_per_host == (2, 2, 1)
        assert run_side_by_side(remote, oracle, steps=80, seed=3) >= 10
    finally:
        remote.close()
        oracle.close()


def test_copy_false_returns_the_internal_buffer(plain_hosts):
    remote = client.make_vec(
        "CartPole-v1", num_envs=3, hosts=plain_hosts[:2], vector_kwargs={"copy": False}
    )
    oracle = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    try:
        first, _ = remote.reset(seed=1)
        second, *_ = remote.step(np.ones(3, dtype=np.int64))
        assert first is second
        oracle.reset(seed=1)
        np.testing.assert_array_equal(second, oracle.step(np.ones(3, dtype=np.int64))[0])
    finally:
        remote.close()
        oracle.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_many_envs_per_host_match_sync_vector_env(plain_hosts, mode):
    # Over 64 envs on a host: rewards and flags travel as arrays, not as lists (COLUMN_LIST_MAX).
    counts = [70, 3]
    kwargs = {"terminate_prob": 0.1, "max_steps": 9}
    remote = client.make_vec(
        "envserver.testing:envserver/Episodic-v0",
        num_envs=sum(counts),
        hosts=plain_hosts[:2],
        vector_kwargs={"autoreset_mode": mode, "envs_per_host": counts},
        **kwargs,
    )
    oracle = SyncVectorEnv(
        [functools.partial(gym.make, "envserver/Episodic-v0", **kwargs)] * sum(counts),
        autoreset_mode=mode,
    )
    try:
        assert run_side_by_side(remote, oracle, steps=25, seed=5) >= 100
    finally:
        remote.close()
        oracle.close()
