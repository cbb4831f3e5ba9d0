"""The lean lockstep step and its hand-overs to the general wait, against SyncVectorEnv.

A step goes to every host as STEP_RAW and each reply is written straight into the batches while
the replies come soon; a host slower than that, a late reply to an abandoned step, or a reply of
another kind is left to the general wait, on the same requests. Whichever way each host's reply
went, the results are exactly SyncVectorEnv's.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from helpers import assert_same

from envserver import client
from envserver.errors import WaitTimeoutError

EPISODIC = "envserver.testing:envserver/Episodic-v0"


def test_a_slow_host_hands_over_and_every_step_is_exact(pickle_hosts, lean_sends) -> None:
    """Host 1's envs take longer than the lean receive waits: its replies come the general way."""
    delays = [0.0, 0.0, 0.12, 0.12]
    fns = [functools.partial(gym.make, EPISODIC, step_delay_s=d, max_steps=3) for d in delays]
    oracle = SyncVectorEnv(fns)
    envs = client.RemoteVectorEnv(fns, hosts=pickle_hosts[:2], allow_pickle=True)
    try:
        assert_same(envs.reset(seed=5), oracle.reset(seed=5))
        for step in range(8):  # episodes of 3 steps: autoresets too
            actions = np.array([step % 3, 1, 2, 0])
            assert_same(envs.step(actions), oracle.step(actions))
        assert lean_sends == [True] * 8
    finally:
        envs.close()
        oracle.close()


def test_a_late_reply_is_dropped_by_the_next_lean_step(pickle_hosts, lean_sends) -> None:
    """A step abandoned at its timeout is answered late; the next step reads past that answer."""
    fns = [functools.partial(gym.make, EPISODIC, step_delay_s=0.3, terminate_prob=0.0)] * 2
    envs = client.RemoteVectorEnv(fns, hosts=pickle_hosts[:1], allow_pickle=True)
    try:
        envs.reset(seed=0)
        envs.step_async(np.array([0, 1]))
        with pytest.raises(WaitTimeoutError):
            envs.step_wait(timeout=0.01)
        # The hosts ran the abandoned step (t=1) and answer it late; this one is t=2.
        _, _, _, _, infos = envs.step(np.array([1, 1]))
        assert infos["stats"]["t"].tolist() == [2, 2]
        _, _, _, _, infos = envs.step(np.array([1, 1]))
        assert infos["stats"]["t"].tolist() == [3, 3]
        assert lean_sends == [True] * 3
    finally:
        envs.close()


def test_actions_that_do_not_fit_exactly_take_the_general_way(pickle_hosts, lean_sends) -> None:
    """A list of actions, or actions of another dtype, go as STEP: nothing is cast on the way."""
    fns = [functools.partial(gym.make, EPISODIC)] * 2
    oracle = SyncVectorEnv(fns)
    envs = client.RemoteVectorEnv(fns, hosts=pickle_hosts[:1], allow_pickle=True)
    try:
        assert_same(envs.reset(seed=1), oracle.reset(seed=1))
        for actions in ([1, 2], np.array([2, 0], np.int32), np.array([0, 1])):
            assert_same(envs.step(actions), oracle.step(actions))
        assert lean_sends == [False, False, True]
    finally:
        envs.close()
        oracle.close()
