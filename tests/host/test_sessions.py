"""Two clients on one host at once, interleaved, each seeing only its own envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from helpers import assert_same

from envserver import client


def test_two_clients_on_one_host_are_isolated(plain_hosts):
    host = plain_hosts[:1]
    first = client.make_vec("CartPole-v1", num_envs=3, hosts=host)
    second = client.make_vec(
        "CartPole-v1",
        num_envs=2,
        hosts=host,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
    )
    oracles = [
        gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync"),
        gym.make_vec(
            "CartPole-v1",
            num_envs=2,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        ),
    ]
    pairs = list(zip((first, second), oracles))
    try:
        for seed, (remote, oracle) in enumerate(pairs):
            assert_same(remote.reset(seed=seed), oracle.reset(seed=seed))
            oracle.action_space.seed(seed)
        for t in range(150):
            # Interleave: both clients' requests are in flight on the host at once.
            actions = [oracle.action_space.sample() for _, oracle in pairs]
            for (remote, _), action in zip(pairs, actions):
                remote.step_async(action)
            results = [remote.step_wait() for remote, _ in pairs]
            for (_, oracle), action, result in zip(pairs, actions, results):
                assert_same(result, oracle.step(action), f"step {t}")
        first.set_attr("gravity", 1.0)
        assert second.get_attr("gravity") == (9.8, 9.8)
    finally:
        for remote, oracle in pairs:
            remote.close()
            oracle.close()


def test_closing_one_client_leaves_the_other_running(plain_hosts):
    host = plain_hosts[2:3]  # the TCP host
    first = client.make_vec("CartPole-v1", num_envs=2, hosts=host)
    second = client.make_vec("CartPole-v1", num_envs=2, hosts=host)
    try:
        first.reset(seed=0)
        second.reset(seed=0)
        first.close()
        obs, *_ = second.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 4)
    finally:
        second.close()


def test_eight_clients_on_one_host(plain_hosts):
    host = plain_hosts[:1]
    pairs = [
        (
            client.make_vec("CartPole-v1", num_envs=2, hosts=host),
            gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"),
        )
        for _ in range(8)
    ]
    try:
        for seed, (remote, oracle) in enumerate(pairs):
            assert_same(remote.reset(seed=seed), oracle.reset(seed=seed))
        for t in range(60):
            for k, (remote, _) in enumerate(pairs):
                remote.step_async(np.full(2, (t + k) % 2))
            for k, (remote, oracle) in enumerate(pairs):
                actions = np.full(2, (t + k) % 2)
                assert_same(remote.step_wait(), oracle.step(actions), f"client {k} step {t}")
    finally:
        for remote, oracle in pairs:
            remote.close()
            oracle.close()


def test_requests_over_the_host_bound_are_refused_clearly(tmp_path):
    from envserver.errors import MessageTooLargeError
    from envserver.testing import start_host

    host = start_host(tmp_path, "--max-message-bytes", "2000")
    envs = client.make_vec("CartPole-v1", num_envs=1, hosts=[host.endpoint])
    try:
        envs.reset(seed=0)
        with pytest.raises(MessageTooLargeError, match="over its bound of 2000 bytes"):
            envs.call("get_wrapper_attr", "x" * 5000)
        assert envs.step(np.zeros(1, dtype=np.int64))[0].shape == (1, 4)
    finally:
        envs.close()
        host.stop()
