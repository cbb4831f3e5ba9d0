"""Where a draining host's envs go: every host of a ``dns://`` spec draining at once, and a spare
named by a spec. Each move tries a candidate for a bounded time (a host of the spec that
already stopped is not waited on for the whole ``restart_timeout_s``), and a ``dns://`` spare is
resolved to its addresses. Every env moves, the rollout equal to SyncVectorEnv's throughout.
"""

from __future__ import annotations

import functools
import itertools
import signal
import time

import gymnasium as gym
from gymnasium.vector import SyncVectorEnv
from helpers import assert_same, wait_for
from ports import free_ports

from envserver import client
from envserver.testing import start_host

DRAINING = ("--drain-grace", "60", "--session-lease", "3")  # heartbeats every second


def test_every_host_of_a_spec_drains_at_once_and_all_envs_move_to_a_spare_spec(tmp_path) -> None:
    first, spare_port = free_ports(4), free_ports()
    hosts = [start_host(tmp_path, *DRAINING, bind=f"tcp://127.0.0.1:{first + i}") for i in range(4)]
    spare = start_host(tmp_path, *DRAINING, bind=f"tcp://127.0.0.1:{spare_port}")
    make = functools.partial(gym.make, "CartPole-v1", max_episode_steps=30)
    envs = client.RemoteVectorEnv(
        env_id="CartPole-v1", env_kwargs={"max_episode_steps": 30}, num_envs=8,
        hosts=f"dns://localhost:{first}-{first + 3}", spare_hosts=[f"dns://localhost:{spare_port}"],
        on_host_failure="restore", host_timeout_s=1.0, restart_timeout_s=60.0,
    )  # fmt: skip
    oracle = SyncVectorEnv([make] * 8)
    try:
        assert_same(envs.reset(seed=1), oracle.reset(seed=1))
        envs.action_space.seed(2)
        for host in hosts:
            host.process.send_signal(signal.SIGTERM)
        steps_after, deadline = 0, time.monotonic() + 120
        for t in itertools.count():  # until every env moved, and 10 steps more
            assert time.monotonic() < deadline, f"only {envs.envs_moved} envs moved"
            actions = envs.action_space.sample()
            got = envs.step(actions)
            assert "host_failure" not in got[4]
            assert_same(got, oracle.step(actions), f"step {t}")
            steps_after += envs.envs_moved == 8
            if steps_after > 10:
                break
        assert envs.host_restarts == 0  # moved, none recovered
        assert set(envs.hosts) == {f"tcp://127.0.0.1:{spare_port}"}
        for host in hosts:
            wait_for(lambda host=host: host.process.poll() is not None, "a drained host stopped")
            assert host.process.returncode == 0
    finally:
        envs.close()
        oracle.close()
        for host in (*hosts, spare):
            host.stop()
