"""Snapshots of real simulators and of Gymnasium's stateful wrappers, restored bit for bit.

As in test_snapshots.py: a snapshot after ``t`` steps, ``k`` steps more (episodes ending and
resetting on the way), then the snapshot restored into a fresh stack and the same ``k`` steps:
observations, rewards, flags and infos must be the same, bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode
from restored import run

from envserver.errors import StateMismatchError, UnsupportedStateError
from envserver.host.worker import EnvBlock
from envserver.state import Episode, Snapshot, capture, restore

ale_py = pytest.importorskip("ale_py")
pytest.importorskip("mujoco")
gym.register_envs(ale_py)


def same_after_restore(
    stack: Callable[[], gym.Env],
    actions: list[Any],
    taken_at: int,
    seed: int = 3,
    when_taken: Callable[[gym.Env], Any] = lambda env: None,
) -> tuple[gym.Env, gym.Env]:
    """Checks the restore of a snapshot taken after ``taken_at`` of ``actions``.

    ``when_taken`` is called with the stack at the snapshot's moment (to check what it is).

    Returns:
        The stack the snapshot was taken of, and the one it was restored into (both stepped
        through every action).
    """
    env = stack()
    env.reset(seed=seed)
    run(env, actions[:taken_at])
    when_taken(env)
    taken = capture(env).to_bytes()
    expected = run(env, actions[taken_at:])
    fresh = stack()
    fresh.reset(seed=seed + 100)  # elsewhere in another episode: all of it is overwritten
    restore(fresh, Snapshot.from_bytes(taken))
    assert data_equivalence(run(fresh, actions[taken_at:]), expected, exact=True)
    assert any(len(r) == 2 for r in expected)  # an episode ended and reset on the way
    return env, fresh


def sampled(space: gym.Space, count: int, seed: int = 1) -> list[Any]:
    space.seed(seed)
    return [space.sample() for _ in range(count)]


@pytest.mark.parametrize(
    ("env_id", "taken_at"), [("Hopper-v5", 25), ("Ant-v5", 26), ("Humanoid-v5", 34)]
)
def test_mujoco_is_restored_bit_for_bit_rewards_included(env_id: str, taken_at: int) -> None:
    """Mid-episode, in contact with the floor: Ant's reward reads positions that lag a
    substep, Humanoid's observations contact forces."""

    def stack() -> gym.Env:
        return gym.wrappers.RecordEpisodeStatistics(gym.make(env_id, max_episode_steps=40))

    def in_contact(env: gym.Env) -> None:
        assert env.unwrapped.data.ncon > 0

    actions = sampled(stack().action_space, 90)
    same_after_restore(stack, actions, taken_at, when_taken=in_contact)


def test_qpos_and_qvel_alone_would_not_be_exact() -> None:
    """Why the adapter carries all of MjData: MujocoEnv.set_state diverges at once on Ant."""
    env = gym.make("Ant-v5")
    env.reset(seed=0)
    actions = sampled(env.action_space, 30)
    for action in actions[:20]:
        env.step(action)
    qpos, qvel = env.unwrapped.data.qpos.copy(), env.unwrapped.data.qvel.copy()
    expected = env.step(actions[20])
    fresh = gym.make("Ant-v5")
    fresh.reset(seed=0)
    fresh.unwrapped.set_state(qpos, qvel)
    assert not data_equivalence(fresh.step(actions[20]), expected, exact=True)


def test_a_mujoco_state_of_another_version_or_shape_is_refused() -> None:
    env = gym.make("Hopper-v5")
    env.reset(seed=0)
    snapshot = capture(env)
    state = snapshot.layers[-1][2]
    for changed, message in (
        ({**state, "mujoco": "1.0.0"}, "taken with MuJoCo '1.0.0'"),
        ({**state, "arrays": {**state["arrays"], "qpos": np.zeros(3)}}, r"MjData.qpos is not"),
    ):
        layers = [*snapshot.layers[:-1], [*snapshot.layers[-1][:2], changed]]
        damaged = Snapshot(snapshot.fingerprint, layers, snapshot.rng)
        target = gym.make("Hopper-v5")
        target.reset(seed=9)
        before = target.unwrapped.data.qpos.copy()
        with pytest.raises(StateMismatchError, match=message):
            restore(target, Snapshot.from_bytes(damaged.to_bytes()))
        assert np.array_equal(target.unwrapped.data.qpos, before)  # nothing changed


def pong(**kwargs: Any) -> Callable[[], gym.Env]:
    return lambda: gym.make("ALE/Pong-v5", max_episode_steps=120, **kwargs)


def test_atari_without_sticky_actions_is_restored_mid_episode() -> None:
    stack = pong(repeat_action_probability=0.0)
    same_after_restore(stack, sampled(stack().action_space, 200), taken_at=60)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_atari_with_sticky_actions_is_replayed_from_the_episode_start(seed: int) -> None:
    """Sticky actions (ALE v5's default): the state at the episode's start and the actions
    since, replayed and checked; a plain capture mid-episode is refused."""
    stack = pong()
    actions = sampled(stack().action_space, 200, seed)
    env = stack()
    episode = Episode.of(env)
    assert episode is not None
    episode.reset(seed, None)
    for action in actions[:70]:
        obs = env.step(action)[0]
        episode.acted(action, obs)
    with pytest.raises(UnsupportedStateError, match="exact only at an episode's start"):
        capture(env)
    taken = episode.capture().to_bytes()
    expected = run(env, actions[70:])
    fresh = stack()
    fresh.reset(seed=seed + 100)
    for target in (fresh, env):  # a fresh env, and the one that went on (another last action)
        restore(target, Snapshot.from_bytes(taken))
        assert data_equivalence(run(target, actions[70:]), expected, exact=True)


def test_a_replay_that_gives_another_observation_is_refused() -> None:
    env = pong()()
    episode = Episode.of(env)
    assert episode is not None
    episode.reset(0, None)
    for action in [2, 3, 2, 2]:
        obs = env.step(action)[0]
        episode.acted(action, obs)
    snapshot = episode.capture()
    assert snapshot.replay is not None
    damaged = dataclasses.replace(snapshot.replay, obs=snapshot.replay.obs + 1)
    with pytest.raises(StateMismatchError, match="replaying the 4 actions"):
        restore(pong()(), dataclasses.replace(snapshot, replay=damaged))


def test_an_atari_state_of_another_rom_is_refused() -> None:
    env = pong(repeat_action_probability=0.0)()
    env.reset(seed=0)
    snapshot = capture(env)
    state = {**snapshot.layers[-1][2], "rom": "0" * 64}
    layers = [*snapshot.layers[:-1], [*snapshot.layers[-1][:2], state]]
    with pytest.raises(StateMismatchError, match="another ROM than pong's"):
        restore(
            pong(repeat_action_probability=0.0)(),
            Snapshot(snapshot.fingerprint, layers, snapshot.rng),
        )


def atari_stack() -> gym.Env:
    """The DQN preprocessing: frame skip and max, 84x84 grey, frames stacked, sticky actions."""
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, max_episode_steps=400)
    env = gym.wrappers.StickyAction(env, repeat_action_probability=0.25)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=10, terminal_on_life_loss=True)
    return gym.wrappers.FrameStackObservation(env, 4)


def test_the_atari_preprocessing_stack_is_restored_mid_episode() -> None:
    """StickyAction as a wrapper keeps its last action: no replay needed."""
    same_after_restore(atari_stack, sampled(atari_stack().action_space, 240), taken_at=70)


def test_a_stack_of_stateful_wrappers_is_restored() -> None:
    """TimeLimit, RecordEpisodeStatistics, FrameStack, NormalizeObservation and -Reward, time
    awareness and delay, on Pendulum."""

    def stack() -> gym.Env:
        env = gym.make("Pendulum-v1", max_episode_steps=30)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.DelayObservation(env, 2)
        env = gym.wrappers.TimeAwareObservation(env)
        env = gym.wrappers.FrameStackObservation(env, 3, padding_type="reset")
        env = gym.wrappers.NormalizeObservation(env)
        return gym.wrappers.NormalizeReward(env)

    env, fresh = same_after_restore(stack, sampled(stack().action_space, 100), taken_at=45)
    assert np.array_equal(fresh.env.obs_rms.mean, env.env.obs_rms.mean)


def test_damaged_emulator_states_are_refused_or_harmless() -> None:
    """20 emulator states with bytes changed, cut or inserted: each is refused with one
    clear error, or restored; the process goes on and the env steps either way."""
    import random

    env = pong(repeat_action_probability=0.0)()
    env.reset(seed=1)
    snapshot = capture(env)
    good = snapshot.layers[-1][2]["emulator"]
    rng, refused = random.Random(0), 0
    for _ in range(20):
        data = bytearray(good)
        at = rng.randrange(len(data))
        kind = rng.randrange(3)
        if kind == 0:
            data[at] = rng.randrange(256)
        elif kind == 1:
            data = data[:at]
        else:
            data[at:at] = rng.randbytes(rng.randint(1, 40))
        state = {**snapshot.layers[-1][2], "emulator": bytes(data)}
        layers = [*snapshot.layers[:-1], [*snapshot.layers[-1][:2], state]]
        try:
            restore(env, Snapshot(snapshot.fingerprint, layers, snapshot.rng))
        except StateMismatchError:
            refused += 1
        env.step(rng.randrange(6))
    assert refused > 0


@pytest.mark.parametrize("taken_at", [0, 40])
def test_a_hosts_sticky_atari_snapshot_holds_its_last_frame_once(taken_at: int) -> None:
    """The frame the replay checks is the block's last observation: the snapshot holds it once
    (right after the reset, nothing is replayed: its bookkeeping holds it), and the block that
    restores it gives it back and goes on bit for bit."""
    actions = np.array(sampled(pong()().action_space, taken_at + 60, seed=2))[:, None]
    source = EnvBlock([pong()()], AutoresetMode.NEXT_STEP)
    obs, _ = source.reset([5], None)
    for action in actions[:taken_at]:
        obs = source.step(action)[0]
    (taken,) = source.get_states()
    copies = taken.count(obs[0].tobytes())
    assert copies == 1, f"{copies} copies of the last frame"
    assert len(taken) < obs[0].nbytes + 20_000
    expected = [source.step(action) for action in actions[taken_at:]]
    target = EnvBlock([pong()()], AutoresetMode.NEXT_STEP)
    target.reset([6], None)
    ((restored, _, ended),) = target.set_states([taken])
    assert data_equivalence(restored, obs[0], exact=True) and not ended
    assert data_equivalence([target.step(a) for a in actions[taken_at:]], expected, exact=True)
    source.close()
    target.close()
