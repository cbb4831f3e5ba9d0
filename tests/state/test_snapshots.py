"""Snapshots of env stacks (envserver.state): exact restores, checked refusals, hostile bytes.

Every exactness test takes a snapshot after ``t`` steps, goes on ``k`` steps (episodes ending
and resetting on the way, without seeds: the generator goes on), then restores the snapshot into
a fresh stack and takes the same ``k`` steps: everything must be the same, bit for bit.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st
from restored import run

from envserver.errors import ProtocolError, StateMismatchError, UnsupportedStateError
from envserver.host.worker import EnvBlock, EnvCallError
from envserver.state import Episode, Snapshot, capture, restore

CLASSIC = ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0"]


def make(env_id: str, **kwargs: Any) -> gym.Env:
    """The env as gym.make gives it, under RecordEpisodeStatistics (a stateful wrapper)."""
    return gym.wrappers.RecordEpisodeStatistics(gym.make(env_id, **kwargs))


@pytest.mark.parametrize("taken_at", [0, 1, 17])
@pytest.mark.parametrize("env_id", CLASSIC)
def test_classic_control_is_restored_bit_for_bit(env_id: str, taken_at: int) -> None:
    """Taken after the reset, after the first step (Gymnasium's checker is mid-check), later."""
    env = make(env_id, max_episode_steps=40)
    env.action_space.seed(1)
    actions = [env.action_space.sample() for _ in range(150)]
    env.reset(seed=3)
    run(env, actions[:taken_at])
    taken = capture(env).to_bytes()
    expected = run(env, actions[taken_at:])
    fresh = make(env_id, max_episode_steps=40)
    restore(fresh, Snapshot.from_bytes(taken))
    got = run(fresh, actions[taken_at:])
    assert data_equivalence(got, expected, exact=True)
    assert sum(len(r) == 2 for r in expected) >= 2  # episodes ended and reset on the way
    assert fresh.episode_count == env.episode_count and list(fresh.return_queue) == list(
        env.return_queue
    )


class Counter(gym.Env):
    """An env with hooks: its state is a count and its generator."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.count = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.count = 0
        return np.array([self.np_random.random()], np.float32), {}

    def step(self, action: Any) -> tuple:
        self.count += int(action) + 1
        obs = np.array([self.count + self.np_random.random()], np.float32)
        return obs, float(self.count), self.count > 12, False, {"count": self.count}

    def get_state(self) -> dict:
        return {"count": self.count}

    def set_state(self, state: dict) -> None:
        self.count = state["count"]


def test_an_env_with_hooks_and_stateless_wrappers_is_restored() -> None:
    def stack() -> gym.Env:
        return gym.wrappers.ClipReward(gym.wrappers.TimeLimit(Counter(), 9), -100, 100)

    env = stack()
    env.reset(seed=5)
    run(env, [1, 0, 1])
    snapshot = capture(env)
    assert [mechanism for _, mechanism, _ in snapshot.layers] == [
        "stateless",
        "gymnasium wrapper",
        "hooks",
    ]
    expected = run(env, [0, 1, 1, 0, 0, 1, 1, 0])
    fresh = stack()
    restore(fresh, Snapshot.from_bytes(snapshot.to_bytes()))
    assert data_equivalence(run(fresh, [0, 1, 1, 0, 0, 1, 1, 0]), expected, exact=True)


class Remembering(gym.Wrapper):
    """A wrapper that keeps state between steps and says nothing of it."""

    def step(self, action: Any) -> tuple:
        self.last = action
        return super().step(action)


def test_a_layer_no_mechanism_covers_is_named_never_approximated() -> None:
    """A wrapper (an env nothing else covers has its reset replayed: test_replayed.py)."""
    env = Remembering(gym.make("CartPole-v1"))
    env.reset(seed=0)
    with pytest.raises(UnsupportedStateError, match=r"test_snapshots.Remembering keeps state"):
        capture(env)


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (lambda: make("Pendulum-v1"), "taken with env 'CartPole-v1'"),
        (lambda: make("CartPole-v1", max_episode_steps=7), "taken with kwargs"),
        (lambda: gym.make("CartPole-v1"), "the snapshot's layers are"),
    ],
    ids=["other-env", "other-kwargs", "other-stack"],
)
def test_a_snapshot_is_refused_by_another_env_or_stack(other: Any, message: str) -> None:
    env = make("CartPole-v1")
    env.reset(seed=0)
    snapshot = Snapshot.from_bytes(capture(env).to_bytes())
    with pytest.raises(StateMismatchError, match=message):
        restore(other(), snapshot)


def test_a_snapshot_of_another_machine_or_version_is_refused() -> None:
    env = make("CartPole-v1")
    env.reset(seed=0)
    snapshot = capture(env)
    for field, value in (("machine", "riscv64"), ("versions", {"numpy": "0.1"})):
        changed = Snapshot(
            type(snapshot.fingerprint)(**{**snapshot.fingerprint.to_data(), field: value}),
            snapshot.layers,
            snapshot.rng,
        )
        with pytest.raises(StateMismatchError, match=f"taken with {field}"):
            restore(make("CartPole-v1"), changed)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300) | st.builds(lambda b, n: b[:n], st.just(b""), st.integers()))
def test_bytes_that_are_not_a_snapshot_are_refused_clearly(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        Snapshot.from_bytes(data)


def test_a_damaged_snapshot_is_refused_clearly() -> None:
    env = make("CartPole-v1")
    env.reset(seed=0)
    good = capture(env).to_bytes()
    for cut in range(0, len(good), max(1, len(good) // 40)):
        with pytest.raises(ProtocolError):
            Snapshot.from_bytes(good[:cut])
    with pytest.raises(ProtocolError, match="format"):
        Snapshot.from_bytes(good.replace(b"\x01", b"\x02", 1))


def test_a_layer_nothing_else_covers_is_pickled_only_where_pickle_is_allowed() -> None:
    """A host started with --allow-pickle pickles such a layer's attributes; a restore that
    does not allow pickle refuses the snapshot before it reads a byte of the pickle."""

    def stack() -> gym.Env:
        return Remembering(gym.make("CartPole-v1", max_episode_steps=20))

    env = stack()
    env.reset(seed=4)
    run(env, [0, 1, 1])
    snapshot = Snapshot.from_bytes(capture(env, allow_pickle=True).to_bytes())
    assert snapshot.layers[0][1] == "pickle"
    expected = run(env, [1, 0] * 15)
    with pytest.raises(StateMismatchError, match="Remembering's state was taken by pickle, wh"):
        restore(stack(), snapshot)
    fresh = stack()
    restore(fresh, snapshot, allow_pickle=True)
    assert data_equivalence(run(fresh, [1, 0] * 15), expected, exact=True)
    assert fresh.last == env.last


class Ez(gym.Env, gym.utils.EzPickle):
    """An EzPickle env with state nothing covers: its pickle would make a fresh one."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        gym.utils.EzPickle.__init__(self)
        self.count = 0


class EzWrapper(gym.Wrapper, gym.utils.EzPickle):
    """An EzPickle wrapper nothing covers."""

    def __init__(self, env: gym.Env) -> None:
        gym.Wrapper.__init__(self, env)
        gym.utils.EzPickle.__init__(self, env)


def test_an_ezpickle_layer_is_never_pickled() -> None:
    """Where pickle is allowed: an EzPickle env has its reset replayed instead, an EzPickle
    wrapper is refused."""
    episode = Episode.of(Ez(), allow_pickle=True)
    assert episode is not None
    assert [mechanism for _, mechanism, _ in episode.capture().layers] == ["reset replayed"]
    with pytest.raises(UnsupportedStateError, match="EzPickle: its pickle makes a fresh one"):
        capture(EzWrapper(gym.make("CartPole-v1")), allow_pickle=True)


def test_a_snapshot_without_the_hosts_bookkeeping_is_refused_before_any_restore() -> None:
    block = EnvBlock([gym.make("CartPole-v1"), gym.make("CartPole-v1")], AutoresetMode.NEXT_STEP)
    block.reset([0, 1], None)
    states = block.get_states()
    snapshot = Snapshot.from_bytes(states[1])
    del snapshot.extra["obs"]
    block.step(np.array([1, 1]))
    before = block.get_states()
    with pytest.raises(EnvCallError, match="without its env's last observation") as refused:
        block.set_states([states[0], snapshot.to_bytes()])
    assert isinstance(refused.value.error, ProtocolError) and refused.value.index == 1
    assert block.get_states() == before  # none restored
    block.close()
