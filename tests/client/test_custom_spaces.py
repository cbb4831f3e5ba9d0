"""User-defined spaces (subclasses of ``gymnasium.Space`` that Gymnasium does not know).

Gymnasium batches such a space as a tuple with one value per env; so does RemoteVectorEnv, end
to end. The space itself can only travel pickled, so it needs a host started with
``--allow-pickle`` and a client that allows pickle; otherwise construction fails and says why.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same
from test_differential import MODES, run_side_by_side

from envserver import client
from envserver.errors import UnsupportedSpaceError
from envserver.testing import RingEnv, RingSpace

RING_ID = "envserver.testing:envserver/Ring-v0"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("nested", [False, True], ids=["space", "in-dict"])
def test_custom_spaces_match_sync_vector_env(pickle_hosts, mode, nested):
    remote = client.make_vec(
        RING_ID,
        num_envs=5,
        hosts=pickle_hosts[:2],
        vector_kwargs={"autoreset_mode": mode, "allow_pickle": True},
        nested=nested,
    )
    oracle = SyncVectorEnv([functools.partial(RingEnv, nested=nested)] * 5, autoreset_mode=mode)
    try:
        assert remote.single_action_space == RingSpace(6)
        assert isinstance(remote.action_space, gym.spaces.Tuple)
        assert run_side_by_side(remote, oracle, steps=60, seed=11) >= 5
    finally:
        remote.close()
        oracle.close()


def test_custom_spaces_on_local_hosts_and_in_first_ready_batches():
    remote = client.RemoteVectorEnv([RingEnv] * 4, batch_size=2)
    oracle = SyncVectorEnv([RingEnv] * 4)
    try:
        observations, _ = remote.reset(seed=3)
        assert_same(observations, oracle.reset(seed=3)[0])
        actions = (1, 2, 3, 4)
        expected, *_ = oracle.step(actions)
        remote.send(actions)
        seen = {}
        for _ in range(2):
            obs, _, _, _, infos = remote.recv()
            assert isinstance(obs, tuple) and len(obs) == 2
            seen.update(zip(infos["env_id"].tolist(), obs))
        assert_same(tuple(seen[i] for i in range(4)), expected)
    finally:
        remote.close()
        oracle.close()


@pytest.mark.parametrize(
    ("which", "fix"),
    [
        ("plain", "start the host with --allow-pickle and give the client allow_pickle=True"),
        ("pickle", "give the client allow_pickle=True"),
    ],
)
def test_without_pickle_a_custom_space_fails_at_construction(pickle_hosts, plain_hosts, which, fix):
    hosts = pickle_hosts if which == "pickle" else plain_hosts
    with pytest.raises(UnsupportedSpaceError, match="RingSpace") as caught:
        client.make_vec(RING_ID, num_envs=2, hosts=hosts[:1])
    assert "user-defined space travels only pickled" in str(caught.value)
    assert fix in str(caught.value)


def test_same_step_final_obs_of_custom_spaces(pickle_hosts):
    mode = AutoresetMode.SAME_STEP
    remote = client.make_vec(
        RING_ID,
        num_envs=3,
        hosts=pickle_hosts[:3],
        vector_kwargs={"autoreset_mode": mode, "allow_pickle": True},
    )
    oracle = SyncVectorEnv([RingEnv] * 3, autoreset_mode=mode)
    try:
        assert_same(remote.reset(seed=2), oracle.reset(seed=2))
        finals = 0
        for t in range(40):
            actions = (t % 6, (t * 5) % 6, 3)
            expected = oracle.step(actions)
            assert_same(remote.step(actions), expected, f"step {t}")
            finals += int("final_obs" in expected[4])
        assert finals > 0
    finally:
        remote.close()
        oracle.close()
