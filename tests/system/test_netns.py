"""Hosts on their own addresses, in network namespaces this test makes: a rollout across them,
and a cut link detected and reported. Traffic goes only to these namespaces."""

from __future__ import annotations

import logging
import threading

import gymnasium as gym
import numpy as np
import pytest
from helpers import assert_same

from envserver import client
from envserver.errors import HostUnavailableError
from envserver.testing import namespaces, netns_unavailable, start_host

SKIP_REASON = netns_unavailable()
pytestmark = [
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
    pytest.mark.xdist_group("netns"),  # one namespace fixture at a time (make test's workers)
]


@pytest.fixture
def spaces():
    """Two namespaces, each joined to this one by a veth pair on its own /30 subnet."""
    with namespaces(2, "es", 213) as made:
        yield made


def test_rollout_across_namespaces_and_a_cut_link(spaces, tmp_path):
    hosts = [
        start_host(tmp_path, bind=f"tcp://{space.address}:5555", prefix=space.prefix())
        for space in spaces
    ]
    endpoints = [h.endpoint for h in hosts]
    envs = client.make_vec(
        "CartPole-v1", num_envs=4, hosts=endpoints, vector_kwargs={"host_timeout_s": 2.0}
    )
    oracle = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    try:
        assert_same(envs.reset(seed=9), oracle.reset(seed=9))
        for t in range(50):
            actions = np.full(4, t % 2)
            assert_same(envs.step(actions), oracle.step(actions))
        spaces[1].cut()  # unplug the second machine
        with pytest.raises(HostUnavailableError) as caught:
            for _ in range(1000):  # until the loss is seen (a step may still be under way)
                envs.step(np.zeros(4, dtype=np.int64))
        assert endpoints[1] in str(caught.value) and "envs 2-3" in str(caught.value)
    finally:
        envs.close()
        oracle.close()
        for host in hosts:
            host.stop()


def test_link_flap_resumes_the_session_exactly_once(spaces, tmp_path):
    """The link drops mid-step and comes back: the client resumes its session and resends the
    step under the same request id, so the host, which may already have run it, answers from its
    cache. No env is re-made, none is stepped twice: still SyncVectorEnv, step for step."""
    space = spaces[0]
    host = start_host(tmp_path, bind=f"tcp://{space.address}:5555", prefix=space.prefix())
    envs = client.make_vec(
        "CartPole-v1",
        num_envs=2,
        hosts=[host.endpoint],
        vector_kwargs={"on_host_failure": "restart", "host_timeout_s": 1.0},
    )
    oracle = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    recovering = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record):
            if "recovering" in record.getMessage():
                recovering.set()

    watch = Watch()
    logging.getLogger("envserver.client").addHandler(watch)

    def restore_link():
        recovering.wait(60)  # once the client has seen the loss and is retrying
        space.restore()

    try:
        assert_same(envs.reset(seed=4), oracle.reset(seed=4))
        for t in range(5):
            actions = np.full(2, t % 2)
            assert_same(envs.step(actions), oracle.step(actions))
        space.cut()
        restorer = threading.Thread(target=restore_link, daemon=True)
        restorer.start()
        actions = np.ones(2, dtype=np.int64)
        assert_same(envs.step(actions), oracle.step(actions))
        assert recovering.is_set() and envs.host_restarts == 0
        for t in range(5):
            actions = np.full(2, t % 2)
            assert_same(envs.step(actions), oracle.step(actions))
        restorer.join(60)
    finally:
        logging.getLogger("envserver.client").removeHandler(watch)
        space.restore()
        envs.close()
        oracle.close()
        host.stop()
