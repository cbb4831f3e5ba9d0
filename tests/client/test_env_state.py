"""get_state and set_state across vector envs and hosts, against the same envs never restored.

Each test takes snapshots in one vector env, goes on there, restores them into another vector
env (other hosts, another layout) and takes the same steps: every result must be the same.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode
from restored import with_an_action_changed

from envserver import client
from envserver.errors import ProtocolError, StateMismatchError


def vector(
    env_id: str, hosts: list[str] | None, mode: AutoresetMode, **kwargs
) -> client.RemoteVectorEnv:
    return client.make_vec(
        env_id,
        num_envs=4,
        hosts=hosts,
        vector_kwargs={"autoreset_mode": mode, **kwargs},
        max_episode_steps=25,
    )


def steps(envs: client.RemoteVectorEnv, actions: list) -> list:
    return [envs.step(a) for a in actions]


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_snapshots_go_on_exactly_in_another_vector_env(plain_hosts, env_id, mode) -> None:
    """Taken on two ipc hosts, restored on local hosts: the next 60 steps are the same."""
    source = vector(env_id, plain_hosts[:2], mode)
    target = vector(env_id, None, mode, num_local_hosts=1)
    try:
        source.action_space.seed(3)
        actions = [source.action_space.sample() for _ in range(80)]
        source.reset(seed=5)
        steps(source, actions[:20])
        snapshots = source.get_state()
        observation = source.step(actions[20])[0]  # what the snapshot's next step gives
        expected = steps(source, actions[21:])
        target.reset(seed=123)
        _, infos = target.set_state(snapshots)
        assert len(infos) == 4 and all(isinstance(info, dict) for info in infos)
        assert data_equivalence(target.step(actions[20])[0], observation, exact=True)
        assert data_equivalence(steps(target, actions[21:]), expected, exact=True)
    finally:
        source.close()
        target.close()


#: The simulators' envs, and the module each needs.
SIMULATORS = {"ale_py:ALE/Pong-v5": "ale_py", "Hopper-v5": "mujoco", "LunarLander-v3": "Box2D"}


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", list(SIMULATORS))
def test_simulators_go_on_exactly_on_another_host(plain_hosts, env_id, mode) -> None:
    """MuJoCo (all of MjData), Atari with sticky actions (the episode's start and the actions
    since, replayed by the host that restores) and Box2D's LunarLander, which nothing else
    covers (its generator before its episode's reset, the reset and the actions since, run
    again by the host that restores): taken mid-episode, episodes having ended and reset on
    the way, restored on another host."""
    pytest.importorskip(SIMULATORS[env_id])
    source = vector(env_id, plain_hosts[:2], mode)
    target = vector(env_id, plain_hosts[2:], mode)
    try:
        source.action_space.seed(4)
        actions = [source.action_space.sample() for _ in range(70)]
        source.reset(seed=6)
        steps(source, actions[:30])  # 25-step episodes: the second one is under way
        snapshots = source.get_state()
        expected = steps(source, actions[30:])
        target.reset(seed=7)
        target.set_state(snapshots)
        assert data_equivalence(steps(target, actions[30:]), expected, exact=True)
        again = target.get_state()  # the host that restored goes on recording the episode
        target.set_state(again)
    finally:
        source.close()
        target.close()


def test_an_env_whose_episode_had_ended_is_reset_by_its_next_step(plain_hosts) -> None:
    """Snapshots right after episodes ended (NEXT_STEP): the restored envs reset next, too."""
    source = vector("CartPole-v1", plain_hosts[:1], AutoresetMode.NEXT_STEP)
    target = vector("CartPole-v1", plain_hosts[1:2], AutoresetMode.NEXT_STEP)
    try:
        source.reset(seed=0)
        ones = np.ones(4, dtype=np.int64)
        ended = np.zeros(4, bool)
        while not ended.any():  # always pushing right: the poles fall within a few dozen steps
            _, _, terminated, truncated, _ = source.step(ones)
            ended = terminated | truncated
        snapshots = source.get_state()
        expected = steps(source, [ones] * 5)
        target.reset(seed=1)
        target.set_state(snapshots, env_ids=[0, 1, 2, 3])
        assert data_equivalence(steps(target, [ones] * 5), expected, exact=True)
    finally:
        source.close()
        target.close()


def test_some_envs_restored_into_other_positions(plain_hosts) -> None:
    source = vector("CartPole-v1", plain_hosts[:2], AutoresetMode.NEXT_STEP)
    try:
        source.reset(seed=2)
        steps(source, [np.array([0, 1, 0, 1])] * 3)
        snapshots = source.get_state(env_ids=[3, 0])
        obs, _ = source.set_state(snapshots, env_ids=[1, 2])  # env 3 into 1, env 0 into 2
        assert obs.shape == (2, 4)
        same = source.step(np.array([1, 1, 1, 1]))[0]
        assert np.array_equal(same[1], same[3]) and np.array_equal(same[2], same[0])
    finally:
        source.close()


def test_refusals_name_the_env_and_leave_the_vector_env_usable(plain_hosts) -> None:
    cartpole = vector("CartPole-v1", plain_hosts[:1], AutoresetMode.NEXT_STEP)
    pendulum = vector("Pendulum-v1", plain_hosts[:1], AutoresetMode.NEXT_STEP)
    episodic = client.make_vec(
        "envserver.testing:envserver/Episodic-v0",
        num_envs=2,
        vector_kwargs={"hosts": plain_hosts[:1]},
    )
    try:
        cartpole.reset(seed=0)
        pendulum.reset(seed=0)
        episodic.reset(seed=0)
        snapshots = cartpole.get_state()
        with pytest.raises(StateMismatchError, match=r"env 0: the snapshot was taken with env"):
            pendulum.set_state(snapshots)
        cartpole.step(np.array([1, 0, 1, 0]))
        before = cartpole.get_state(env_ids=[0])
        with pytest.raises(ProtocolError, match=r"env 1: not an envserver snapshot"):
            cartpole.set_state([snapshots[0], b"junk"], env_ids=[0, 1])
        assert cartpole.get_state(env_ids=[0]) == before  # checked first: none restored
        taken = episodic.get_state()  # its reset replayed: it counts its resets, in their infos
        steps(episodic, [np.ones(2, dtype=np.int64)] * 60)  # so episodes end, and reset
        with pytest.raises(
            StateMismatchError, match=r"env 0: the reset replayed gave another info"
        ):
            episodic.set_state(taken)
        with pytest.raises(ValueError, match="distinct"):
            cartpole.get_state(env_ids=[1, 1])
        with pytest.raises(ValueError, match="2 snapshots"):
            cartpole.set_state(snapshots, env_ids=[0, 1])
        for envs in (cartpole, pendulum, episodic):  # all still usable
            envs.step(envs.action_space.sample())
    finally:
        for envs in (cartpole, pendulum, episodic):
            envs.close()


def test_a_replay_that_goes_another_way_is_refused_and_the_host_goes_on(plain_hosts) -> None:
    """A LunarLander snapshot with one action changed: its restore is refused, naming the env;
    the vector env goes on, and the snapshots as they were taken restore."""
    source = vector("LunarLander-v3", plain_hosts[:1], AutoresetMode.NEXT_STEP)
    target = vector("LunarLander-v3", plain_hosts[1:2], AutoresetMode.NEXT_STEP)
    try:
        source.action_space.seed(5)
        actions = [source.action_space.sample() for _ in range(30)]
        source.reset(seed=1)
        steps(source, actions[:12])
        snapshots = source.get_state()
        expected = steps(source, actions[12:])
        damaged = with_an_action_changed(snapshots[2], 5, actions=4)
        target.reset(seed=2)
        with pytest.raises(StateMismatchError, match=r"env 2: replaying the 12 actions"):
            target.set_state([damaged], env_ids=[2])
        target.reset(seed=3)
        target.set_state(snapshots)
        assert data_equivalence(steps(target, actions[12:]), expected, exact=True)
    finally:
        source.close()
        target.close()


def test_hosts_that_allow_pickle_snapshot_any_env(pickle_hosts) -> None:
    """An env nothing else covers (the Episodic test env) on hosts started with --allow-pickle:
    its attributes travel pickled, and the restored envs go on exactly."""

    def episodic(hosts):
        return client.make_vec(
            "envserver.testing:envserver/Episodic-v0",
            num_envs=3,
            vector_kwargs={"hosts": hosts},
            terminate_prob=0.2,
        )

    source, target = episodic(pickle_hosts[:1]), episodic(pickle_hosts[1:])
    try:
        source.reset(seed=3)
        actions = [np.array([t % 2, 1, 0]) for t in range(30)]
        steps(source, actions[:10])
        snapshots = source.get_state()
        expected = steps(source, actions[10:])
        target.reset(seed=9)
        target.set_state(snapshots)
        assert data_equivalence(steps(target, actions[10:]), expected, exact=True)
    finally:
        source.close()
        target.close()


def env_infos(infos: dict, i: int) -> dict:
    """Env ``i``'s infos out of a vector env's batched ones (what ``set_state`` gives per env)."""
    return {
        key: env_infos(value, i) if isinstance(value, dict) else value[i]
        for key, value in infos.items()
        if not key.startswith("_") and infos[f"_{key}"][i]
    }


def plain(value: object) -> object:
    """``value`` with numpy's scalars as Python's (batched infos hold numpy's)."""
    if isinstance(value, dict):
        return {key: plain(v) for key, v in value.items()}
    return value.item() if isinstance(value, np.generic) else value


def test_a_snapshot_of_an_end_step_gives_back_its_final_obs_and_info(pickle_hosts) -> None:
    """SAME_STEP: taken on the step an episode ended, a snapshot restored elsewhere gives the
    infos that step gave (its final_obs and final_info, and the reset's), as SyncVectorEnv's."""
    episodic = "envserver.testing:envserver/Episodic-v0"
    kwargs = {"terminate_prob": 0.2, "max_steps": 6}

    def vector(hosts: list[str]) -> client.RemoteVectorEnv:
        options = {"hosts": hosts, "autoreset_mode": AutoresetMode.SAME_STEP}
        return client.make_vec(episodic, num_envs=3, vector_kwargs=options, **kwargs)

    source, target = vector(pickle_hosts[:1]), vector(pickle_hosts[1:])
    oracle = gym.make_vec(
        episodic, num_envs=3, vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **kwargs,
    )  # fmt: skip
    try:
        source.reset(seed=4)
        oracle.reset(seed=4)
        for t in range(40):
            infos = source.step(np.array([t % 3, 1, 2]))[4]
            expected = oracle.step(np.array([t % 3, 1, 2]))[4]
            if "final_obs" in infos and not infos["_final_obs"].all():
                break
        ended = infos["_final_obs"]
        assert ended.any() and not ended.all()
        target.reset(seed=5)
        _, restored = target.set_state(source.get_state())
        for i in range(3):
            assert "final_obs" in restored[i] if ended[i] else "final_obs" not in restored[i]
            got = plain(restored[i])
            for batched in (infos, expected):
                assert data_equivalence(got, plain(env_infos(batched, i)), exact=True), i
    finally:
        for envs in (source, target, oracle):
            envs.close()


def test_a_snapshot_is_restored_on_any_host_that_can_apply_its_mechanism(
    plain_hosts, pickle_hosts
) -> None:
    """A custom env with no state API (not an EzPickle): taken on a host that does not allow
    pickle (its reset replayed), restored on one that does, exactly; taken there (pickled), it
    is refused by the first, saying why, and the env there is untouched."""

    def jitter(hosts: list[str]) -> client.RemoteVectorEnv:
        return client.make_vec(
            "envserver.testing:envserver/Jitter-v0", num_envs=2, vector_kwargs={"hosts": hosts},
            step_s=0.0, episode_steps=15,
        )  # fmt: skip

    plain, pickling = jitter(plain_hosts[:1]), jitter(pickle_hosts[:1])
    try:
        actions = [np.array([t % 2, 1]) for t in range(50)]
        plain.reset(seed=3)
        steps(plain, actions[:20])
        snapshots = plain.get_state()
        expected = steps(plain, actions[20:])
        pickling.reset(seed=4)
        pickling.set_state(snapshots)
        pickled = pickling.get_state()
        assert data_equivalence(steps(pickling, actions[20:]), expected, exact=True)
        before = plain.get_state()
        refusal = r"env 0: .*JitterEnv's state was taken by pickle, which this host does not allow"
        with pytest.raises(StateMismatchError, match=refusal):
            plain.set_state(pickled)
        assert plain.get_state() == before
        plain.set_state(snapshots)  # what it took itself restores as ever
        assert data_equivalence(steps(plain, actions[20:]), expected, exact=True)
    finally:
        plain.close()
        pickling.close()
