"""The replay of a reset (envserver.state.replayed): an env no hook or adapter covers.

Box2D's LunarLander (no state API; an EzPickle, whose pickle makes a fresh env) is snapshotted
on one EnvBlock, which records its episodes, and restored into another, elsewhere in episodes
of its own; both then take the same steps: observations, rewards, flags and infos must be the
same, bit for bit. The envs a replay cannot re-create are refused at their restore.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode
from restored import with_an_action_changed

from envserver.errors import ProtocolError, StateMismatchError, UnsupportedStateError
from envserver.host.worker import EnvBlock, EnvCallError
from envserver.state import Episode, Replay, Reset, Snapshot, capture, restore

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def lander() -> gym.Env:
    """LunarLander behind wrappers that keep state across its episodes: TimeLimit (60 steps),
    RecordEpisodeStatistics and NormalizeObservation."""
    env = gym.make("LunarLander-v3", max_episode_steps=60)
    return gym.wrappers.NormalizeObservation(gym.wrappers.RecordEpisodeStatistics(env))


def actions(count: int, seed: int = 0) -> np.ndarray:
    """``count`` batches of two LunarLander actions."""
    return np.random.default_rng(seed).integers(0, 4, size=(count, 2))


def timeless(value: Any) -> Any:
    """``value`` without RecordEpisodeStatistics' wall times (``"t"``): they are the clock's."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k != "t"}
    if isinstance(value, (list, tuple)):
        return type(value)(timeless(v) for v in value)
    return value


def step(block: EnvBlock, action: np.ndarray) -> tuple:
    return timeless(block.step(action))


def elsewhere(mode: AutoresetMode) -> EnvBlock:
    """A block of two landers in episodes of their own, 30 steps into them."""
    block = EnvBlock([lander(), lander()], mode)
    block.reset([7, 8], None)
    for action in actions(30, seed=1):
        block.step(action)
    return block


@pytest.mark.parametrize("seeds", [[3, 4], [None, None]], ids=["seeded", "unseeded"])
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_lunar_lander_goes_on_exactly_on_another_block(mode: AutoresetMode, seeds: list) -> None:
    """Snapshots right after the block's reset (no action yet: the reset is checked), in the
    first episode (its reset seeded, or not) and in the third (an autoreset's, never seeded),
    each restored into a block elsewhere: the steps after them are the same."""
    source = EnvBlock([lander(), lander()], mode)
    plan = actions(260)
    source.reset(seeds, None)
    taken, results = {}, []
    for t, action in enumerate(plan):
        if t in (0, 25, 140):
            taken[t] = source.get_states()
        results.append(step(source, action))
    episodes = [Snapshot.from_bytes(states[0]).replay for states in taken.values()]
    assert [replay.reset.seed for replay in episodes] == [seeds[0], seeds[0], None]
    assert len(episodes[0].actions) == 0 and len(episodes[2].actions) > 0
    assert sum(bool(r[2].any() or r[3].any()) for r in results[140:]) >= 2  # ended, reset
    for t, states in taken.items():
        target = elsewhere(mode)
        target.set_states(states)
        assert data_equivalence([step(target, a) for a in plan[t:]], results[t:], exact=True)
        target.close()
    source.close()


def test_a_replay_that_goes_another_way_is_refused_and_the_block_goes_on() -> None:
    """An action changed: the restore of that env is refused with one clear line; its state is
    then not known (no snapshot of it) until its next reset; the block goes on."""
    source = EnvBlock([lander(), lander()], AutoresetMode.NEXT_STEP)
    source.reset([1, 2], None)
    for action in actions(20):
        source.step(action)
    good = source.get_states()
    expected = [step(source, a) for a in actions(40, seed=2)]
    damaged = with_an_action_changed(good[1], 10, actions=4)
    target = elsewhere(AutoresetMode.NEXT_STEP)
    with pytest.raises(EnvCallError) as refused:
        target.set_states([damaged], env_ids=[1])
    assert refused.value.index == 1 and isinstance(refused.value.error, StateMismatchError)
    assert "replaying the 20 actions since the episode's start gave another observation" in str(
        refused.value.error
    )
    with pytest.raises(EnvCallError, match="not known since a reset or a restore into it failed"):
        target.get_states(env_ids=[1])
    target.get_states(env_ids=[0])  # the other env's record is whole
    target.reset([None], None, env_ids=[1])
    target.get_states(env_ids=[1])  # known again
    target.set_states(good)
    assert data_equivalence([step(target, a) for a in actions(40, seed=2)], expected, exact=True)
    source.close()
    target.close()


class Superstitious(gym.Env):
    """An env that draws on more than its generator: Python's ``random`` in its reset, or the
    time in its steps (``outside``), or neither."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, outside: str) -> None:
        self.outside = outside
        self.x = 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.x = self.np_random.normal() + (random.random() if self.outside == "reset" else 0)
        return np.array([self.x]), {}

    def step(self, action: Any) -> tuple:
        self.x += (int(action) - 0.5) * self.np_random.random()
        self.x += time.perf_counter() % 1e-3 if self.outside == "step" else 0
        return np.array([self.x]), self.x, False, False, {}


@pytest.mark.parametrize(
    ("outside", "refusal"),
    [
        ("reset", "the reset replayed gave another observation"),
        ("step", "replaying the 5 actions"),
        ("nowhere", None),
    ],
)
def test_an_env_drawing_on_more_than_its_generator_is_refused_at_restore(
    outside: str, refusal: str | None
) -> None:
    """Refused rather than restored wrong; the same env drawing on its generator alone is
    restored, and goes on exactly."""
    env = Superstitious(outside)
    episode = Episode.of(env)
    assert episode is not None
    episode.reset(None, None)
    for action in [0, 1, 1, 0, 1]:
        episode.acted(action, env.step(action)[0])
    snapshot = Snapshot.from_bytes(episode.capture().to_bytes())
    fresh = Superstitious(outside)
    if refusal is not None:
        with pytest.raises(StateMismatchError, match=refusal):
            restore(fresh, snapshot)
        return
    restore(fresh, snapshot)
    assert data_equivalence(fresh.step(1), env.step(1), exact=True)


def test_state_an_env_keeps_across_episodes_that_its_reset_shows_is_refused() -> None:
    """The Episodic test env counts its resets in its reset's info: a replay into another env
    does not re-create the count, and the reset's info, checked, refuses the restore."""

    def episodic() -> EnvBlock:
        env = gym.make("envserver.testing:envserver/Episodic-v0", terminate_prob=0.2)
        return EnvBlock([env], AutoresetMode.NEXT_STEP)

    source, target = episodic(), episodic()
    source.reset([0], None)
    ended = 0
    for _ in range(40):
        ended += int(source.step(np.array([1]))[2][0] or 0)
    assert ended >= 2
    target.reset([0], None)
    with pytest.raises(EnvCallError, match="the reset replayed gave another info"):
        target.set_states(source.get_states())
    source.close()
    target.close()


def last_mechanism(env: gym.Env, allow_pickle: bool) -> str:
    """The mechanism that takes the state of ``env``'s own layer (under its wrappers)."""
    env.reset(seed=0)
    episode = Episode.of(env, allow_pickle)
    snapshot = capture(env, allow_pickle=allow_pickle) if episode is None else episode.capture()
    return snapshot.layers[-1][1]


def test_pickle_comes_before_the_replay_where_allowed_but_never_for_an_ezpickle() -> None:
    """Pickle takes what an env keeps across episodes too, at any moment: where it is allowed
    it comes first; an EzPickle (LunarLander) has its reset replayed everywhere."""
    episodic = "envserver.testing:envserver/Episodic-v0"
    assert last_mechanism(gym.make(episodic), allow_pickle=False) == "reset replayed"
    assert last_mechanism(gym.make(episodic), allow_pickle=True) == "pickle"
    for allow_pickle in (False, True):
        assert last_mechanism(gym.make("LunarLander-v3"), allow_pickle) == "reset replayed"


def test_a_plain_capture_is_refused_and_points_to_the_record() -> None:
    env = lander()
    env.reset(seed=0)
    with pytest.raises(UnsupportedStateError, match=r"exact only at an episode's start \(before"):
        capture(env)


@pytest.mark.parametrize(
    "reset",
    [
        Reset("7", None, np.zeros(8, np.float32), {}),
        Reset(True, None, np.zeros(8, np.float32), {}),
        Reset(None, [1], np.zeros(8, np.float32), {}),
        Reset(None, None, np.zeros(8, np.float32), "info"),
    ],
    ids=["seed-text", "seed-bool", "options-list", "info-text"],
)
def test_a_replay_whose_reset_is_not_one_is_refused_clearly(reset: Reset) -> None:
    env = lander()
    episode = Episode.of(env)
    assert episode is not None
    episode.reset(0, None)
    snapshot = dataclasses.replace(episode.capture(), replay=Replay(reset, [], None))
    with pytest.raises(ProtocolError, match="a snapshot's reset"):
        Snapshot.from_bytes(snapshot.to_bytes())


def jitter() -> gym.Env:
    """A custom env with no state API, not an EzPickle: pickled where allowed, else replayed."""
    return gym.make("envserver.testing:envserver/Jitter-v0", step_s=0.0, episode_steps=15)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_snapshot_is_restored_by_the_mechanism_it_was_taken_by(mode: AutoresetMode) -> None:
    """Taken where pickle is not allowed (the reset replayed), restored where it is, exactly,
    and taken there again (pickled); a pickled snapshot is refused where pickle is not allowed,
    saying so, before anything is restored."""
    plan = np.random.default_rng(3).integers(0, 2, size=(60, 2))
    source = EnvBlock([jitter(), jitter()], mode)
    source.reset([1, 2], None)
    for action in plan[:20]:  # the second episode is under way
        source.step(action)
    states = source.get_states()
    assert Snapshot.from_bytes(states[0]).layers[-1][1] == "reset replayed"
    expected = [source.step(a) for a in plan[20:]]
    target = EnvBlock([jitter(), jitter()], mode, allow_pickle=True)
    target.reset([5, 6], None)
    target.set_states(states)
    pickled = target.get_states()
    assert Snapshot.from_bytes(pickled[0]).layers[-1][1] == "pickle"
    assert data_equivalence([target.step(a) for a in plan[20:]], expected, exact=True)
    before = source.get_states()
    with pytest.raises(EnvCallError, match="taken by pickle, which this host does not allow"):
        source.set_states(pickled)
    assert source.get_states() == before
    source.close()
    target.close()


@pytest.mark.parametrize("taken_at", [0, 10])
def test_a_replayed_snapshot_holds_its_last_observation_once(taken_at: int) -> None:
    """The observation the replay ends on (its reset's, or its last action's) is the block's
    last: the snapshot holds it once, and the block that restores it gives it back."""
    source = EnvBlock([lander()], AutoresetMode.NEXT_STEP)
    obs, _ = source.reset([4], None)
    for action in actions(taken_at)[:, :1]:
        obs = source.step(action)[0]
    (taken,) = source.get_states()
    copies = taken.count(obs[0].tobytes())
    assert copies == 1, f"{copies} copies of the last observation"
    target = elsewhere(AutoresetMode.NEXT_STEP)
    ((restored, _, _),) = target.set_states([taken], env_ids=[1])
    assert data_equivalence(restored, obs[0], exact=True)
    plan = actions(20, seed=5)[:, :1]
    expected = [step(source, a) for a in plan]
    again = [timeless(target.step(a, env_ids=[1])) for a in plan]
    assert data_equivalence(again, expected, exact=True)
    source.close()
    target.close()
