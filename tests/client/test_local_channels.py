"""Local hosts' channels: replies too large for them, and machines without them, exactly.

Steps and resets against SyncVectorEnv in channels are in ``test_differential.py``; the
interruptions of a post or a wait in ``test_replies.py``; what is left in ``/dev/shm`` after a
trainer or a host is killed in ``test_slab.py``; the messages themselves in
``tests/wire/test_channel.py``.
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from helpers import assert_same, channel_messages

from envserver import client
from envserver.client._transport import local
from envserver.host.commands import CHANNEL_SPARE_BYTES
from envserver.wire import channel, slab
from envserver.wire.slab import SLAB_DIRECTORY

pytestmark = pytest.mark.skipif(not os.path.isdir(SLAB_DIRECTORY), reason="no /dev/shm")


class LargeInfoEnv(gym.Env):
    """An env whose resets (every third step) say more than a channel's reply area holds."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        blob = self.np_random.bytes(CHANNEL_SPARE_BYTES + 1024)  # past the spare room
        return self.np_random.random(3, np.float32), {"blob": np.frombuffer(blob, np.uint8)}

    def step(self, action):
        self.t += 1
        info = {"t": self.t} if self.t % 2 else {}
        return self.np_random.random(3, np.float32), float(action), self.t == 3, False, info


def test_a_reply_too_large_for_the_channel_comes_on_the_socket_exactly():
    envs = client.RemoteVectorEnv([LargeInfoEnv] * 2, num_local_hosts=1)
    oracle = SyncVectorEnv([LargeInfoEnv] * 2)
    try:
        assert channel_messages(envs) == [0]
        assert_same(envs.reset(seed=5), oracle.reset(seed=5), "reset")
        for t in range(9):  # autoresets every third step: their replies too go on the socket
            actions = np.array([t % 2, 1])
            assert_same(envs.step(actions), oracle.step(actions), f"step {t}")
        (posted,) = channel_messages(envs)
        assert posted == 10  # every reply: the large ones as empty messages, asked again
    finally:
        envs.close()
        oracle.close()


def test_without_a_shared_memory_directory_steps_go_on_the_socket(monkeypatch, tmp_path):
    """Where /dev/shm is missing (or cannot be written), no slab or channel is offered."""
    missing = str(tmp_path / "no-shm")
    monkeypatch.setattr(slab, "SLAB_DIRECTORY", missing)
    monkeypatch.setattr(channel, "SLAB_DIRECTORY", missing)
    envs = client.make_vec("CartPole-v1", num_envs=3, vector_kwargs={"num_local_hosts": 1})
    oracle = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    try:
        assert channel_messages(envs) == [-1]
        assert_same(envs.reset(seed=2), oracle.reset(seed=2))
        for t in range(5):
            actions = np.array([t % 2, 1, 0])
            assert_same(envs.step(actions), oracle.step(actions), f"step {t}")
    finally:
        envs.close()
        oracle.close()


@pytest.mark.parametrize("cores", [1, 4], ids=["a-core-short", "a-core-each"])
def test_channels_spin_only_where_each_local_process_has_a_core(monkeypatch, cores):
    """A host and its trainer spin before their waits block when each has a core, exactly
    (the trainer longer: it waits for a step, a host for what the trainer does between)."""
    monkeypatch.setattr(local, "usable_cores", lambda: cores)
    remote = client.make_vec("CartPole-v1", num_envs=3, vector_kwargs={"num_local_hosts": 1})
    oracle = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    try:
        (connection,) = remote._hosts.pool.connections
        spin_ns = connection.requests.channels[0].spin.spin_ns  # the trainer's, for replies
        assert spin_ns == (int(local.REPLY_SPIN_S * 1e9) if cores == 4 else 0)
        assert remote._hosts.local.channel_spin_s == (local.CHANNEL_SPIN_S if cores == 4 else 0)
        assert_same(remote.reset(seed=5), oracle.reset(seed=5))
        oracle.action_space.seed(5)
        for _ in range(200):
            actions = oracle.action_space.sample()
            assert_same(remote.step(actions), oracle.step(actions))
        assert channel_messages(remote) == [201]
    finally:
        remote.close()
        oracle.close()
