"""envserver.client.sb3.RemoteVecEnv against DummyVecEnv: same seeds and actions, same results, step
for step; and PPO trained on either gives the same episodes and the same final parameters.

The test env below lives in this module: the embedded hosts import it from here, as
SubprocVecEnv's workers would (they see the trainer's import path)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit
from helpers import assert_same
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)

from envserver import client
from envserver.client import sb3
from envserver.client.sb3 import RemoteVecEnv
from envserver.testing import start_host


def make_space(name: str) -> gym.Space:
    return {
        "box": lambda: spaces.Box(-2.0, 2.0, shape=(3,), dtype=np.float32),
        "discrete": lambda: spaces.Discrete(7),
        "multidiscrete": lambda: spaces.MultiDiscrete([3, 4]),
        "multibinary": lambda: spaces.MultiBinary(5),
        "dict": lambda: spaces.Dict(
            {"a": spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float64), "b": spaces.Discrete(4)}
        ),
        "tuple": lambda: spaces.Tuple(
            (spaces.Discrete(3), spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32))
        ),
    }[name]()


class SpacesEnv(gym.Env):
    """Random observations of any space, seeded; episodes that end by chance."""

    def __init__(self, obs: str = "box", act: str = "discrete") -> None:
        self.observation_space = make_space(obs)
        self.action_space = make_space(act)
        self._t = 0
        self.bumps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self._t = 0
        info = {"start": int(self.np_random.integers(100))}
        if options:
            info["options"] = options
        return self.observation_space.sample(), info

    def bump(self) -> int:
        self.bumps += 1
        return self.bumps

    def step(self, action: Any):
        assert self.action_space.contains(action), action
        self._t += 1
        reward = float(self.np_random.normal())
        terminated = bool(self.np_random.random() < 0.06)
        return self.observation_space.sample(), reward, terminated, False, {"t": self._t}


def actions_for(space: gym.Space, num_envs: int, rng: np.random.Generator) -> Any:
    """A batch in SB3's form: an array, or a list per env for Tuple and Dict action spaces."""
    space.seed(int(rng.integers(2**31)))
    samples = [space.sample() for _ in range(num_envs)]
    return samples if isinstance(space, (spaces.Tuple, spaces.Dict)) else np.stack(samples)


def without_times(infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Infos without Monitor's wall-clock episode time, the one value that may differ."""
    for info in infos:
        info.get("episode", {}).pop("t", None)
    return infos


def assert_same_rollout(remote, dummy, steps: int, seed: int = 0) -> None:
    """Resets both (seeded) and steps both with the same random actions, comparing all."""
    remote.seed(seed)
    dummy.seed(seed)
    assert_same(remote.reset(), dummy.reset())
    assert_same(remote.reset_infos, dummy.reset_infos)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        actions = actions_for(remote.action_space, remote.num_envs, rng)
        obs, rewards, dones, infos = remote.step(actions)
        expected = dummy.step(actions)
        assert_same(
            (obs, rewards, dones, without_times(infos)), (*expected[:3], without_times(expected[3]))
        )
        assert_same(remote.reset_infos, dummy.reset_infos)


SPACE_PAIRS = [
    ("box", "discrete"),
    ("discrete", "box"),
    ("multidiscrete", "multibinary"),
    ("multibinary", "multidiscrete"),
    ("dict", "tuple"),
    ("tuple", "dict"),
]


@pytest.mark.parametrize(("obs", "act"), SPACE_PAIRS, ids=lambda s: s)
def test_factories_on_embedded_hosts_match_dummy_vec_env(obs, act):
    kwargs = {
        "n_envs": 3,
        "seed": 11,
        "env_kwargs": {"obs": obs, "act": act},
        "wrapper_class": TimeLimit,
        "wrapper_kwargs": {"max_episode_steps": 12},
    }
    remote = make_vec_env(SpacesEnv, vec_env_cls=RemoteVecEnv, **kwargs)
    dummy = make_vec_env(SpacesEnv, vec_env_cls=DummyVecEnv, **kwargs)
    try:
        assert remote.remote.envs_per_host == (2, 1)  # one local host per core, 2 cores
        assert_same_rollout(remote, dummy, steps=60)
    finally:
        remote.close()


def test_env_id_on_hosts_without_pickle_matches_dummy_vec_env(plain_hosts):
    remote = RemoteVecEnv(
        env_id="CartPole-v1",
        num_envs=5,
        env_kwargs={"max_episode_steps": 15},
        hosts=plain_hosts,
    )
    dummy = DummyVecEnv([functools.partial(gym.make, "CartPole-v1", max_episode_steps=15)] * 5)
    try:
        assert remote.remote.hosts == tuple(plain_hosts)
        assert remote.env_is_wrapped(Monitor) == [False] * 5
        assert remote.env_is_wrapped(TimeLimit) == [True] * 5
        assert remote.env_is_wrapped(gym.Wrapper) == [True] * 5  # subclasses count
        assert_same_rollout(VecMonitor(remote), VecMonitor(dummy), steps=80)
    finally:
        remote.close()


def test_seed_and_options_are_used_once_for_the_next_reset():
    make = functools.partial(gym.make, "envserver.testing:envserver/Episodic-v0", max_steps=50)
    remote = RemoteVecEnv([make] * 4)
    dummy = DummyVecEnv([make] * 4)
    try:
        for vec in (remote, dummy):
            vec.seed(5)
            vec.set_options([{"offset": 1.5}, {}, {"offset": -2.0}, {"offset": 1.5}])
        assert_same(remote.reset(), dummy.reset())
        assert_same(remote.reset_infos, dummy.reset_infos)
        assert remote.reset_infos[0]["offset"] == 1.5 and "offset" not in remote.reset_infos[1]
        assert_same(remote.reset(), dummy.reset())  # unseeded, no options: used once
        assert_same(remote.reset_infos, dummy.reset_infos)
        for vec in (remote, dummy):
            vec.set_options({"offset": 3.0})
        assert_same(remote.reset(), dummy.reset())
        assert_same(remote.reset_infos, dummy.reset_infos)
    finally:
        remote.close()


def test_attributes_methods_and_wrappers_by_index():
    make = functools.partial(gym.make, "envserver.testing:envserver/Episodic-v0")
    remote = make_vec_env(make, n_envs=4, vec_env_cls=RemoteVecEnv)
    dummy = make_vec_env(make, n_envs=4, vec_env_cls=DummyVecEnv)
    try:
        for vec in (remote, dummy):
            vec.reset()
            vec.set_attr("terminate_prob", 0.5, indices=[1, 3])
        assert remote.get_attr("terminate_prob") == dummy.get_attr("terminate_prob")
        assert remote.get_attr("terminate_prob") == [0.05, 0.5, 0.05, 0.5]
        assert remote.get_attr("resets", indices=2) == [1]
        assert remote.env_method("get_wrapper_attr", "max_steps", indices=[3, 0]) == [25, 25]
        assert remote.env_is_wrapped(Monitor) == [True] * 4
        assert remote.env_is_wrapped(TimeLimit, indices=[0]) == [False]  # none registered
        for wrapper in (Monitor, TimeLimit, gym.wrappers.OrderEnforcing, gym.Wrapper):
            assert remote.env_is_wrapped(wrapper, [2, 0]) == dummy.env_is_wrapped(wrapper, [2, 0])
        assert remote.has_attr("resets") and not remote.has_attr("no_such_attribute")
        with pytest.raises(AttributeError, match="env 1"):
            remote.get_attr("no_such_attribute", indices=[1])
    finally:
        remote.close()


def test_images_and_render_match():
    make = functools.partial(
        gym.make, "envserver.testing:envserver/Episodic-v0", render_mode="rgb_array"
    )
    remote = RemoteVecEnv([make] * 3)
    dummy = DummyVecEnv([make] * 3)
    try:
        assert remote.render_mode == "rgb_array"
        assert_same_rollout(remote, dummy, steps=3)
        assert_same(list(remote.get_images()), list(dummy.get_images()))
        assert_same(remote.render(mode="rgb_array"), dummy.render(mode="rgb_array"))
    finally:
        remote.close()


@pytest.mark.parametrize(
    ("env_id", "wrap"),
    [
        ("CartPole-v1", lambda v: VecFrameStack(v, n_stack=3)),
        ("envserver.testing:envserver/Episodic-v0", lambda v: VecNormalize(v, gamma=0.9)),
        ("CartPole-v1", VecMonitor),
        ("envserver.testing:envserver/Pixels-v0", VecTransposeImage),
    ],
    ids=["VecFrameStack", "VecNormalize", "VecMonitor", "VecTransposeImage"],
)
def test_under_sb3_wrappers(env_id, wrap):
    make = functools.partial(gym.make, env_id, max_episode_steps=20)
    remote = wrap(RemoteVecEnv([make] * 3))
    dummy = wrap(DummyVecEnv([make] * 3))
    try:
        assert_same_rollout(remote, dummy, steps=45)
    finally:
        remote.close()


def test_an_env_that_raises_names_the_env_and_host_and_the_rest_goes_on():
    make = functools.partial(gym.make, "envserver.testing:envserver/Failing-v0", step_error_at=3)
    remote = RemoteVecEnv([make] * 2)
    try:
        remote.reset()
        remote.step(np.zeros(2, dtype=np.int64))
        remote.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(ValueError, match=r"local host 0, env 0: simulated failure in step"):
            remote.step(np.zeros(2, dtype=np.int64))
        assert remote.reset().shape == (2, 2)  # still usable after a reset
    finally:
        remote.close()


def test_step_async_and_wait():
    remote = RemoteVecEnv([functools.partial(gym.make, "CartPole-v1")] * 2)
    try:
        remote.reset()
        remote.step_async(np.ones(2, dtype=np.int64))
        obs, rewards, dones, infos = remote.step_wait()
        assert obs.shape == (2, 4) and rewards.dtype == np.float32 and dones.dtype == np.bool_
        assert [info["TimeLimit.truncated"] for info in infos] == [False, False]
    finally:
        remote.close()


def test_options_the_adapter_sets_itself_are_refused():
    for option in ({"autoreset_mode": "NextStep"}, {"copy": False}, {"info_format": "dict"}):
        with pytest.raises(TypeError, match=next(iter(option))):
            RemoteVecEnv(env_id="CartPole-v1", num_envs=1, **option)


def spaces_pair(n_envs: int):
    kwargs = {"n_envs": n_envs, "seed": 3, "env_kwargs": {"obs": "box", "act": "discrete"}}
    remote = make_vec_env(SpacesEnv, vec_env_cls=RemoteVecEnv, **kwargs)
    return remote, make_vec_env(SpacesEnv, vec_env_cls=DummyVecEnv, **kwargs)


def test_reset_options_reach_each_env_exactly():
    remote, dummy = spaces_pair(6)
    options = [
        {"x": np.array([1, 2])},
        {"x": np.array([3, 4])},
        {},
        {"x": 1},
        {"x": 1.0},
        {"x": True},
    ]
    try:
        for vec in (remote, dummy):
            vec.seed(1)
            vec.set_options(options)
        assert_same(remote.reset(), dummy.reset())
        assert_same(remote.reset_infos, dummy.reset_infos)
        assert_same(remote.reset_infos[4]["options"], {"x": 1.0})
    finally:
        remote.close()


def test_methods_on_envs_named_twice_run_twice_and_indices_count_from_the_end():
    remote, dummy = spaces_pair(3)
    try:
        for indices in ([0, 0, 2], [2, -1, 1, 0], -1, range(3)):
            assert remote.env_method("bump", indices=indices) == dummy.env_method(
                "bump", indices=indices
            )
        assert remote.get_attr("bumps") == dummy.get_attr("bumps") == [4, 2, 5]
        with pytest.raises(ValueError, match="integers"):
            remote.get_attr("bumps", indices=[1.5])
    finally:
        remote.close()


def test_set_attr_sets_the_outermost_wrapper_as_sb3_does():
    make = functools.partial(gym.make, "envserver.testing:envserver/Episodic-v0", max_steps=40)
    remote = make_vec_env(make, n_envs=3, vec_env_cls=RemoteVecEnv)
    dummy = make_vec_env(make, n_envs=3, vec_env_cls=DummyVecEnv)
    try:
        for vec in (remote, dummy):
            vec.set_attr("terminate_prob", 0.9)  # on the Monitor: the env itself keeps 0.05
        assert remote.get_attr("terminate_prob") == dummy.get_attr("terminate_prob") == [0.9] * 3
        assert_same_rollout(remote, dummy, steps=40)
    finally:
        remote.close()


def test_metadata_and_has_attr_as_dummy_vec_env(plain_hosts):
    remote = RemoteVecEnv(env_id="CartPole-v1", num_envs=2, hosts=plain_hosts[:1])
    dummy = DummyVecEnv([functools.partial(gym.make, "CartPole-v1")] * 2)
    try:
        assert remote.metadata == dummy.metadata and remote.metadata["render_fps"] == 50
        assert remote.has_attr("spec") and dummy.has_attr("spec")  # spec cannot travel unpickled
        assert not remote.has_attr("no_such_attribute")
    finally:
        remote.close()


def train(env, total_timesteps: int = 1024):
    """PPO on ``env``, deterministic on the CPU: episodes seen and final parameters."""
    torch.set_num_threads(1)
    model = PPO(
        "MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu", verbose=0
    )
    model.learn(total_timesteps=total_timesteps)
    episodes = [(info["r"], info["l"]) for info in model.ep_info_buffer]
    return episodes, model.policy.state_dict()


def assert_same_training(remote, dummy) -> None:
    remote_episodes, remote_params = train(remote)
    dummy_episodes, dummy_params = train(dummy)
    assert len(dummy_episodes) > 10
    assert any(length == 30 for _, length in dummy_episodes)  # some were truncated
    assert remote_episodes == dummy_episodes
    assert list(remote_params) == list(dummy_params)
    for name, value in dummy_params.items():
        assert torch.equal(remote_params[name], value), name


# Episodes cut at 30 steps: training bootstraps from `terminal_observation` where
# `TimeLimit.truncated` says so, and both must be right for the parameters to agree.
SHORT = {"max_episode_steps": 30}


@pytest.mark.slow
def test_ppo_on_factories_trains_exactly_as_on_dummy_vec_env():
    remote = make_vec_env("CartPole-v1", n_envs=4, vec_env_cls=RemoteVecEnv, env_kwargs=SHORT)
    dummy = make_vec_env("CartPole-v1", n_envs=4, vec_env_cls=DummyVecEnv, env_kwargs=SHORT)
    try:
        assert_same_training(remote, dummy)
    finally:
        remote.close()


def test_ppo_on_an_env_id_on_two_tcp_hosts_trains_exactly_as_on_dummy_vec_env(tmp_path):
    hosts = [start_host(tmp_path, bind="tcp://127.0.0.1:*") for _ in range(2)]
    remote = RemoteVecEnv(
        env_id="CartPole-v1", num_envs=4, env_kwargs=SHORT, hosts=[h.endpoint for h in hosts]
    )
    try:
        dummy = DummyVecEnv([functools.partial(gym.make, "CartPole-v1", **SHORT)] * 4)
        assert_same_training(VecMonitor(remote), VecMonitor(dummy))
    finally:
        remote.close()
        for host in hosts:
            host.stop()


def test_import_client_imports_neither_sb3_nor_torch():
    code = (
        "import sys, client; "
        "print(sorted(m for m in ('stable_baselines3', 'torch') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"
    assert "RemoteVecEnv" not in client.__all__


def test_without_sb3_the_import_says_what_to_install():
    code = "import sys; sys.modules['stable_baselines3'] = None; import envserver.client.sb3"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "ImportError: envserver.client.sb3 needs Stable-Baselines3: pip install 'envserver[sb3]'"
    )


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


@pytest.fixture
def torch_threads(monkeypatch):
    """Sets torch's threads for a test (restored after it); this process not yet warned."""
    monkeypatch.setattr(sb3, "_threads_warned", False)
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_torch_threads_and_local_hosts_beyond_the_cores_warn_once(torch_threads):
    torch_threads(usable_cores())
    with pytest.warns(UserWarning, match=r"torch\.set_num_threads\(") as caught:
        first = RemoteVecEnv(env_id="CartPole-v1", num_envs=2, num_local_hosts=1)
    first.close()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"torch runs {usable_cores()} threads beside 1 local env hosts" in message
    assert caught[0].filename == __file__  # it points at the line that made the env
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RemoteVecEnv(env_id="CartPole-v1", num_envs=2, num_local_hosts=1).close()  # once


def test_one_torch_thread_is_never_warned_of(torch_threads):
    torch_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a host per core (the default), and torch's one thread
        envs = RemoteVecEnv(env_id="CartPole-v1", num_envs=usable_cores() + 1)
    try:
        assert len(envs.remote.hosts) == usable_cores()
    finally:
        envs.close()


def test_torch_threads_that_leave_the_local_hosts_their_cores_do_not_warn(torch_threads):
    if usable_cores() < 2:
        pytest.skip("one core: one thread is the least torch can have")
    torch_threads(usable_cores() - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RemoteVecEnv(env_id="CartPole-v1", num_envs=2, num_local_hosts=1).close()


def test_hosts_elsewhere_do_not_warn_of_torch_threads(torch_threads, plain_hosts):
    torch_threads(usable_cores())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RemoteVecEnv(env_id="CartPole-v1", num_envs=3, hosts=plain_hosts).close()


def test_a_trainer_without_torch_is_not_warned_and_torch_stays_unimported(
    torch_threads, monkeypatch
):
    torch_threads(usable_cores())
    monkeypatch.delitem(sys.modules, "torch")  # as if the trainer had not imported it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RemoteVecEnv(env_id="CartPole-v1", num_envs=2, num_local_hosts=1).close()
    assert "torch" not in sys.modules
