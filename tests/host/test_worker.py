"""EnvBlock's batching of observations, on the edges of its one-call fast path for Box spaces."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from envserver.host.worker import EnvBlock, EnvCallError


class ObsEnv(gym.Env):
    """A float32 Box env whose observations come as ``make_obs(step)``: any dtype or shape."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, make_obs: Any) -> None:
        self.make_obs = make_obs
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return self.make_obs(self.t), {}

    def step(self, action: Any) -> tuple:
        self.t += 1
        return self.make_obs(self.t), 1.0, self.t % 4 == 0, False, {}


@pytest.mark.parametrize(
    "make_obs",
    [
        lambda t: np.full(3, t / 3, dtype=np.float32),  # the fast path
        lambda t: np.full(3, t / 3, dtype=np.float64),  # cast, as SyncVectorEnv casts
        lambda t: [t, t + 1, t + 2],  # a list, cast
        lambda t: np.arange(3, dtype=np.int64) + t,  # integers, cast
    ],
    ids=["float32", "float64", "list", "int64"],
)
def test_observations_batch_as_sync_vector_env_does(make_obs):
    block = EnvBlock([ObsEnv(make_obs) for _ in range(3)], AutoresetMode.NEXT_STEP)
    oracle = SyncVectorEnv([lambda: ObsEnv(make_obs) for _ in range(3)])
    obs, _ = block.reset([0, 1, 2], None)
    expected, _ = oracle.reset(seed=0)
    np.testing.assert_array_equal(obs, expected)
    for _ in range(9):
        actions = np.zeros(3, dtype=np.int64)
        obs, rewards, terminations, truncations, _ = block.step(actions)
        expected, *flags, _ = oracle.step(actions)
        assert obs.dtype == expected.dtype == np.float32
        np.testing.assert_array_equal(obs, expected)
        for got, want in zip((rewards, terminations, truncations), flags):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype


def test_an_observation_of_the_wrong_shape_is_refused():
    block = EnvBlock([ObsEnv(lambda t: np.zeros(4, np.float32))], AutoresetMode.NEXT_STEP)
    with pytest.raises(ValueError):
        block.reset([0], None)
    with pytest.raises(ValueError):
        block.step(np.zeros(1, dtype=np.int64))


def test_an_env_failing_mid_step_is_named():
    def make_obs(t: int) -> np.ndarray:
        if t == 2:
            raise RuntimeError("boom")
        return np.zeros(3, np.float32)

    block = EnvBlock(
        [ObsEnv(lambda t: np.zeros(3, np.float32)), ObsEnv(make_obs)], AutoresetMode.NEXT_STEP
    )
    block.reset([0, 1], None)
    block.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(EnvCallError) as caught:
        block.step(np.zeros(2, dtype=np.int64))
    assert caught.value.index == 1
    assert isinstance(caught.value.error, RuntimeError)


class PlannedEnv(gym.Env):
    """Steps as planned: ``plan[t]`` is "raise", or a truncated value to return with
    terminated=True; any other step goes on. Its observation counts steps and resets."""

    observation_space = gym.spaces.Box(-1e9, 1e9, (1,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, plan: dict[int, Any]) -> None:
        self.plan = plan
        self.t = self.resets = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t, self.resets = 0, self.resets + 1
        return np.array([100.0 * self.resets]), {}

    def step(self, action: Any) -> tuple:
        self.t += 1
        planned = self.plan.get(self.t)
        if isinstance(planned, str):  # "raise"
            raise RuntimeError("boom")
        if planned is not None:
            return np.array([float(self.t)]), 0.0, True, planned, {}
        return np.array([float(self.t)]), 0.0, False, False, {}


def test_an_env_failing_in_a_subset_is_named_by_its_index():
    block = EnvBlock(
        [PlannedEnv({}), PlannedEnv({}), PlannedEnv({1: "raise"})],
        AutoresetMode.NEXT_STEP,
    )
    block.reset([0, 1, 2], None)
    with pytest.raises(EnvCallError) as caught:
        block.step(np.zeros(2, dtype=np.int64), env_ids=[0, 2])
    assert caught.value.index == 2


def test_a_step_whose_flags_cannot_be_stored_leaves_the_env_as_sync_vector_env_does():
    # terminated=True with an unstorable truncated: the step raises, and the env must not be
    # left marked as finished (the next step steps it, it does not reset it).
    plans = [{}, {1: np.array([0, 0])}]
    block = EnvBlock([PlannedEnv(p) for p in plans], AutoresetMode.NEXT_STEP)
    oracle = SyncVectorEnv([lambda p=p: PlannedEnv(p) for p in plans])
    block.reset([None, None], None)
    oracle.reset()
    actions = np.zeros(2, dtype=np.int64)
    with pytest.raises(EnvCallError) as caught:
        block.step(actions)
    assert caught.value.index == 1
    with pytest.raises(ValueError):
        oracle.step(actions)
    np.testing.assert_array_equal(block.step(actions)[0], oracle.step(actions)[0])


def test_a_block_that_grows_steps_its_new_envs_on_threads_as_it_would_have():
    """Envs added one by one (``extend``) are stepped exactly as a block made with all of them,
    and on as many threads: the pool grows with the block, and closed envs drop out."""
    grown = EnvBlock([gym.make("CartPole-v1")], AutoresetMode.NEXT_STEP, env_threads=None)
    whole = EnvBlock.make(
        [lambda: gym.make("CartPole-v1")] * 4, AutoresetMode.NEXT_STEP, env_threads=None
    )
    try:
        assert grown.concurrency.most == 1
        for i in range(1, 4):
            assert grown.extend([lambda: gym.make("CartPole-v1")]) == range(i, i + 1)
        assert grown.concurrency.most == whole.concurrency.most == 4
        for block in (grown, whole):
            block.reset([0, 1, 2, 3], None)
        for t in range(60):  # through autoresets
            actions = np.array([t % 2, 1, 0, (t // 3) % 2])
            for got, want in zip(grown.step(actions)[:4], whole.step(actions)[:4]):
                np.testing.assert_array_equal(got, want)
        grown.close_envs([2])
        assert grown.open_envs == 3
        with pytest.raises(Exception, match="env 2 of this session is closed"):
            grown.step(np.array([0]), env_ids=[2])
        with pytest.raises(Exception, match="name the envs"):
            grown.step(np.array([0, 0, 0, 0]))
    finally:
        grown.close()
        whole.close()


def test_env_errors_are_gathered_while_the_others_step():
    """With ``errors``, every env named is stepped: the one that raises is reported, the
    envs after it step on (in turn and on threads alike)."""
    for threads in (1, 3):
        block = EnvBlock.make(
            [lambda: gym.make("CartPole-v1")] * 3, AutoresetMode.DISABLED, env_threads=threads
        )
        try:
            block.reset([0, 2], None, env_ids=[0, 2])  # env 1 needs a reset
            errors: list[EnvCallError] = []
            _, rewards, *_ = block.step(np.array([0, 1, 1]), errors=errors)
            assert [e.index for e in errors] == [1]
            assert type(errors[0].error).__name__ == "ResetNeeded"
            assert rewards.tolist() == [1.0, 0.0, 1.0]
        finally:
            block.close()
