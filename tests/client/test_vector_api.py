"""The VectorEnv contract beyond reset/step: masks, async state machine, calls, attributes,
render, seeds, spaces, wrappers and input validation. Real hosts, real sockets."""

from __future__ import annotations

import functools
import inspect
import multiprocessing
import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same

from envserver import client
from envserver.errors import EnvNotAllowedError, PickleNotAllowedError, WaitTimeoutError

EPISODIC = "envserver.testing:envserver/Episodic-v0"


@pytest.fixture
def pair(plain_hosts, request):
    """A RemoteVectorEnv over two hosts and its SyncVectorEnv oracle (5 Episodic envs)."""
    params = getattr(request, "param", {})
    mode = params.get("mode", AutoresetMode.NEXT_STEP)
    kwargs = {"terminate_prob": 0.1, "max_steps": 10, **params.get("kwargs", {})}
    remote = client.make_vec(
        EPISODIC,
        num_envs=5,
        hosts=plain_hosts[:2],
        vector_kwargs={"autoreset_mode": mode},
        **kwargs,
    )
    oracle = SyncVectorEnv(
        [functools.partial(gym.make, "envserver/Episodic-v0", **kwargs)] * 5, autoreset_mode=mode
    )
    yield remote, oracle
    remote.close()
    oracle.close()


def both(pair, method, *args, **kwargs):
    remote, oracle = pair
    return getattr(remote, method)(*args, **kwargs), getattr(oracle, method)(*args, **kwargs)


# ---------------------------------------------------------------- reset masks


@pytest.mark.parametrize(
    "pair",
    [{"mode": AutoresetMode.NEXT_STEP}, {"mode": AutoresetMode.SAME_STEP}],
    indirect=True,
    ids=["next-step", "same-step"],
)
def test_reset_mask_resets_only_marked_envs(pair):
    assert_same(*both(pair, "reset", seed=11))
    for t in range(6):
        assert_same(*both(pair, "step", np.full(5, t % 3)))
    mask = np.array([True, False, False, True, False])
    options = {"reset_mask": mask, "offset": 100.0}
    remote_result = pair[0].reset(seed=[1, 2, 3, 4, 5], options=dict(options))
    oracle_result = pair[1].reset(seed=[1, 2, 3, 4, 5], options=dict(options))
    assert_same(remote_result, oracle_result)
    assert remote_result[1]["_offset"].tolist() == mask.tolist()
    for _ in range(5):
        assert_same(*both(pair, "step", np.ones(5, dtype=np.int64)))


@pytest.mark.parametrize(
    ("mask", "error"),
    [
        ([True] * 5, TypeError),
        (np.ones(4, dtype=bool), ValueError),
        (np.ones(5, dtype=np.int64), TypeError),
        (np.zeros(5, dtype=bool), ValueError),
    ],
    ids=["list", "wrong-shape", "wrong-dtype", "all-false"],
)
def test_bad_reset_mask_raises_like_sync(pair, mask, error):
    remote, oracle = pair
    with pytest.raises(error):
        remote.reset(options={"reset_mask": mask})
    # Gymnasium 1.2+ raises the same types; 1.1 asserted.
    with pytest.raises((error, AssertionError)):
        oracle.reset(options={"reset_mask": mask})
    assert_same(*both(pair, "reset", seed=5))  # nothing was left pending


@pytest.mark.parametrize("pair", [{"mode": AutoresetMode.DISABLED}], indirect=True)
def test_disabled_mode_refuses_to_step_a_finished_env(pair):
    remote, oracle = pair
    assert_same(*both(pair, "reset", seed=3))
    done = np.zeros(5, dtype=bool)
    while not done.any():
        result = both(pair, "step", np.zeros(5, dtype=np.int64))
        assert_same(*result)
        done = result[1][2] | result[1][3]
    with pytest.raises(AssertionError):
        oracle.step(np.zeros(5, dtype=np.int64))
    with pytest.raises(AssertionError, match="DISABLED"):
        remote.step(np.zeros(5, dtype=np.int64))
    # The refused step changed nothing: reset the finished envs and carry on in lockstep.
    # (The oracle stepped the envs before the finished one; rebuild it from the same seeds.)
    oracle.reset(seed=3)
    remote.reset(seed=3)
    for _ in range(4):
        result = both(pair, "step", np.ones(5, dtype=np.int64))
        assert_same(*result)
        finished = result[1][2] | result[1][3]
        if finished.any():
            assert_same(*both(pair, "reset", options={"reset_mask": finished}))


# ---------------------------------------------------------------- async state machine


def test_async_calls_out_of_order(pair):
    remote, _ = pair
    with pytest.raises(NoAsyncCallError):
        remote.step_wait()
    with pytest.raises(NoAsyncCallError):
        remote.reset_wait()
    with pytest.raises(NoAsyncCallError):
        remote.call_wait()
    remote.reset_async(seed=0)
    with pytest.raises(AlreadyPendingCallError):
        remote.reset_async(seed=0)
    with pytest.raises(AlreadyPendingCallError):
        remote.step_async(np.zeros(5, dtype=np.int64))
    with pytest.raises(AlreadyPendingCallError):
        remote.call_async("resets")
    with pytest.raises(AlreadyPendingCallError):
        remote.set_attr("max_steps", 3)
    with pytest.raises(NoAsyncCallError):
        remote.step_wait()
    obs, _ = remote.reset_wait()
    remote.step_async(np.zeros(5, dtype=np.int64))
    with pytest.raises(NoAsyncCallError):
        remote.call_wait()
    assert remote.step_wait()[0].shape == obs.shape
    remote.call_async("resets")
    assert remote.call_wait() == (1, 1, 1, 1, 1)


@pytest.mark.parametrize("pair", [{"kwargs": {"step_delay_s": 2.0}}], indirect=True)
def test_wait_timeout_then_late_reply_is_dropped(pair):
    remote, oracle = pair
    assert_same(*both(pair, "reset", seed=1))
    remote.step_async(np.zeros(5, dtype=np.int64))
    with pytest.raises(WaitTimeoutError) as caught:
        remote.step_wait(timeout=0.05)
    assert isinstance(caught.value, multiprocessing.TimeoutError)
    assert isinstance(caught.value, TimeoutError)
    assert "step_wait" in str(caught.value)
    # The env is idle again; the late step reply must not be taken for the reset's.
    assert_same(remote.reset(seed=9), oracle.reset(seed=9))


def test_use_after_close(plain_hosts):
    envs = client.make_vec("CartPole-v1", num_envs=2, hosts=plain_hosts[:1])
    envs.reset(seed=0)
    envs.close()
    envs.close()  # idempotent
    assert envs.closed
    for call in (
        lambda: envs.reset(),
        lambda: envs.step(np.zeros(2, dtype=np.int64)),
        lambda: envs.call("render"),
        lambda: envs.get_attr("spec"),
        lambda: envs.set_attr("x", 1),
        lambda: envs.render(),
    ):
        with pytest.raises(ClosedEnvironmentError):
            call()


def test_close_with_a_pending_step(pair):
    remote, _ = pair
    remote.reset(seed=0)
    remote.step_async(np.zeros(5, dtype=np.int64))
    remote.close()
    assert remote.closed


# ---------------------------------------------------------------- actions


@pytest.mark.parametrize(
    "actions",
    [np.zeros(4, dtype=np.int64), np.zeros(6, dtype=np.int64), np.zeros((5, 1)), [0, 1], 3],
    ids=["too-few", "too-many", "wrong-shape", "short-list", "scalar"],
)
def test_wrong_actions_raise_value_error_at_once(pair, actions):
    remote, _ = pair
    remote.reset(seed=0)
    with pytest.raises(ValueError, match="actions"):
        remote.step(actions)
    remote.step(np.zeros(5, dtype=np.int64))  # still usable, nothing pending


def test_wrong_structured_actions(pickle_hosts):
    envs = client.make_vec(
        "envserver.testing:envserver/DictTuple-v0", num_envs=3, hosts=pickle_hosts[:2]
    )
    try:
        envs.reset(seed=0)
        good = envs.action_space.sample()
        with pytest.raises(ValueError):
            envs.step(good[:1])
        with pytest.raises(ValueError):
            envs.step((good[0][:2], good[1]))
        with pytest.raises(ValueError):
            envs.step((good[0], good[1][:, :1]))
        envs.step(good)
    finally:
        envs.close()


# ---------------------------------------------------------------- call, attributes, render


def test_call_get_attr_set_attr_match_sync(pair):
    assert_same(*both(pair, "reset", seed=2))
    assert_same(*both(pair, "get_attr", "max_steps"))
    assert_same(*both(pair, "call", "get_wrapper_attr", "terminate_prob"))
    both(pair, "set_attr", "max_steps", [3, 4, 5, 6, 7])
    assert pair[0].get_attr("max_steps") == (3, 4, 5, 6, 7)
    both(pair, "set_attr", "terminate_prob", 0.0)
    assert pair[0].get_attr("terminate_prob") == (0.0,) * 5
    for _ in range(8):
        assert_same(*both(pair, "step", np.full(5, 2)))
    with pytest.raises(ValueError, match="Values must be a list or tuple"):
        pair[0].set_attr("max_steps", [1, 2])
    with pytest.raises(ValueError, match="use `reset` directly"):
        pair[0].call("reset")


def test_np_random_seed_and_generators(pair):
    assert_same(*both(pair, "reset", seed=123))
    assert pair[0].np_random_seed == pair[1].np_random_seed == tuple(range(123, 128))
    for remote_rng, oracle_rng in zip(pair[0].np_random, pair[1].np_random):
        assert isinstance(remote_rng, np.random.Generator)
        assert remote_rng.bit_generator.state == oracle_rng.bit_generator.state


@pytest.mark.parametrize("pair", [{"kwargs": {"render_mode": "rgb_array"}}], indirect=True)
def test_render_matches_sync(pair):
    remote, oracle = pair
    assert remote.render_mode == "rgb_array"
    assert remote.metadata["render_modes"] == ["rgb_array"]
    assert_same(*both(pair, "reset", seed=4))
    both(pair, "step", np.ones(5, dtype=np.int64))
    assert_same(remote.render(), oracle.render())


def test_metadata_spec_and_repr(plain_hosts):
    envs = client.make_vec("CartPole-v1", num_envs=3, hosts=plain_hosts[:2])
    try:
        assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        assert envs.metadata["render_fps"] == 50
        assert envs.spec.id == "CartPole-v1"
        assert "CartPole-v1" in repr(envs) and "num_envs=3" in repr(envs)
        assert envs.hosts == tuple(plain_hosts[:2])
        assert envs.envs_per_host == (2, 1)
    finally:
        envs.close()


# ---------------------------------------------------------------- spaces


def test_observation_mode_different(pickle_hosts):
    # Lambdas travel by value; a module-level function would need this module on the host.
    fns = [
        lambda b=b: gym.wrappers.RescaleObservation(
            gym.make("Pendulum-v1"), np.full(3, -b, np.float32), np.full(3, b, np.float32)
        )
        for b in (1.0, 2.0, 3.0)
    ]
    remote = client.RemoteVectorEnv(fns, hosts=pickle_hosts[:2], observation_mode="different")
    oracle = SyncVectorEnv(fns, observation_mode="different")
    try:
        assert remote.observation_space == oracle.observation_space
        assert_same(remote.reset(seed=0), oracle.reset(seed=0))
        actions = np.full((3, 1), 0.5, dtype=np.float32)
        assert_same(remote.step(actions), oracle.step(actions))
    finally:
        remote.close()
        oracle.close()
    with pytest.raises(RuntimeError) as ours:
        client.RemoteVectorEnv(fns, hosts=pickle_hosts[:2], observation_mode="same")
    with pytest.raises(RuntimeError) as gymnasiums:
        gym.vector.AsyncVectorEnv(fns, observation_mode="same")
    # Gymnasium's words, which users search for, then which env and host differ.
    for phrase in (
        "however some of the sub-environments observation spaces are not equivalent.",
        "If this is intentional, use `observation_mode='different'` instead.",
    ):
        assert phrase in str(gymnasiums.value) and phrase in str(ours.value)
    assert f"(host {pickle_hosts[0]}, env 1)" in str(ours.value)


def test_action_space_mismatch_in_gymnasiums_words(pickle_hosts):
    fns = [
        lambda: gym.make("Pendulum-v1"),
        lambda: gym.wrappers.RescaleAction(gym.make("Pendulum-v1"), -1.0, 1.0),
    ]
    with pytest.raises(RuntimeError) as ours:
        client.RemoteVectorEnv(fns, hosts=pickle_hosts[:2])
    with pytest.raises(RuntimeError) as gymnasiums:
        gym.vector.AsyncVectorEnv(fns)
    phrase = "In order to batch actions, the action spaces from all environments must be equal."
    assert phrase in str(gymnasiums.value) and phrase in str(ours.value)
    assert f"host {pickle_hosts[1]}, env 1 has Box(-1.0, 1.0" in str(ours.value)


def test_observation_mode_custom_spaces(plain_hosts):
    single = gym.spaces.Box(-5.0, 5.0, shape=(4,), dtype=np.float32)
    batch = gym.spaces.Box(-5.0, 5.0, shape=(2, 4), dtype=np.float32)
    envs = client.make_vec(
        "CartPole-v1",
        num_envs=2,
        hosts=plain_hosts[:2],
        vector_kwargs={"observation_mode": (batch, single)},
    )
    try:
        assert envs.single_observation_space is single
        assert envs.observation_space is batch
        assert envs.reset(seed=0)[0].shape == (2, 4)
    finally:
        envs.close()


def test_space_mismatch_names_host_and_env(pickle_hosts):
    fns = [lambda: gym.make("CartPole-v1")] * 3 + [
        lambda: gym.make("envserver.testing:envserver/Failing-v0")
    ]
    with pytest.raises(RuntimeError) as caught:
        client.RemoteVectorEnv(fns, hosts=pickle_hosts[:2])
    assert pickle_hosts[1] in str(caught.value)
    assert "env 3" in str(caught.value)


# ---------------------------------------------------------------- wrappers


def test_works_under_vector_wrappers(pair):
    remote, oracle = pair
    wrapped = [
        gym.wrappers.vector.NormalizeObservation(gym.wrappers.vector.RecordEpisodeStatistics(env))
        for env in (remote, oracle)
    ]
    assert_same(wrapped[0].reset(seed=8), wrapped[1].reset(seed=8))
    episodes = 0
    for t in range(40):
        actions = np.full(5, t % 3)
        result, expected = wrapped[0].step(actions), wrapped[1].step(actions)
        np.testing.assert_allclose(result[0], expected[0], rtol=1e-6)
        for infos in (result[4], expected[4]):  # wall-clock episode time differs by nature
            infos.get("episode", {}).pop("t", None)
        assert_same(result[1:], expected[1:])
        episodes += int("episode" in expected[4])
    assert episodes > 0


def test_make_vec_with_wrappers_ships_factories(pickle_hosts):
    envs = client.make_vec(
        "CartPole-v1",
        num_envs=2,
        hosts=pickle_hosts[:1],
        wrappers=[functools.partial(gym.wrappers.TimeLimit, max_episode_steps=5)],
    )
    try:
        envs.reset(seed=0)
        for _ in range(4):
            assert not envs.step(np.zeros(2, dtype=np.int64))[3].any()
        truncated = envs.step(np.zeros(2, dtype=np.int64))[3]
        terminated = envs.step(np.zeros(2, dtype=np.int64))[2]
        assert (truncated | terminated).all()
    finally:
        envs.close()


def test_make_vec_takes_gymnasiums_make_vec_arguments():
    """Every parameter of gymnasium.make_vec, by the same name, in the same place, with the same
    default: a call written for it works unchanged (the drift check)."""
    ours = list(inspect.signature(client.make_vec).parameters.values())
    theirs = list(inspect.signature(gym.make_vec).parameters.values())
    positional = [p for p in theirs if p.kind is not p.VAR_KEYWORD]
    assert [(p.name, p.kind, p.default) for p in ours[: len(positional)]] == [
        (p.name, p.kind, p.default) for p in positional
    ]
    assert ours[-1].kind is inspect.Parameter.VAR_KEYWORD
    assert all(p.kind is p.KEYWORD_ONLY for p in ours[len(positional) : -1])  # hosts


@pytest.mark.parametrize(
    "mode", [None, "sync", "async", gym.VectorizeMode.SYNC, gym.VectorizeMode.ASYNC]
)
def test_make_vec_accepts_the_vectorization_modes_gymnasium_takes(plain_hosts, mode):
    """Called as gymnasium.make_vec is (positional mode, an EnvSpec id): the same results."""
    spec = gym.spec("CartPole-v1")
    envs = client.make_vec(spec, 3, mode, {"copy": True}, hosts=plain_hosts[:1])
    oracle = gym.make_vec(spec, 3, "sync")
    try:
        assert envs.spec.id == "CartPole-v1"
        assert_same(envs.reset(seed=4), oracle.reset(seed=4))
        for _ in range(5):
            actions = np.ones(3, dtype=np.int64)
            assert_same(envs.step(actions), oracle.step(actions))
    finally:
        envs.close()
        oracle.close()


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [("CartPole-v1", {}), ("envserver.testing:envserver/Episodic-v0", {"max_steps": 7})],
)
@pytest.mark.parametrize("mode", ["sync", gym.VectorizeMode.ASYNC])
def test_make_vec_records_the_spec_gymnasium_records(plain_hosts, env_id, kwargs, mode):
    """``envs.spec`` as gymnasium.make_vec sets it, ``module:EnvId`` ids included; and the
    spec makes the same envs again, as Gymnasium's does."""
    envs = client.make_vec(env_id, 2, mode, hosts=plain_hosts[:1], **kwargs)
    oracle = gym.make_vec(env_id, 2, mode, **kwargs)
    try:
        assert envs.spec == oracle.spec
        again = client.make_vec(envs.spec, hosts=plain_hosts[:1])
        try:
            assert again.num_envs == 2 and again.spec == oracle.spec
        finally:
            again.close()
    finally:
        envs.close()
        oracle.close()


def test_make_vec_refuses_modes_whose_envs_cannot_run_on_hosts():
    with pytest.raises(ValueError, match=r"vector_entry_point.*gymnasium\.make_vec"):
        client.make_vec("CartPole-v1", 2, gym.VectorizeMode.VECTOR_ENTRY_POINT, hosts=[])
    with pytest.raises(ValueError, match=r"one of \[None, 'sync', 'async'\].*got 'parallel'"):
        client.make_vec("CartPole-v1", 2, vectorization_mode="parallel", hosts=[])


# ---------------------------------------------------------------- what hosts refuse


def test_pickled_factory_refused_without_allow_pickle(plain_hosts):
    with pytest.raises(PickleNotAllowedError, match="--allow-pickle") as caught:
        client.RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * 2, hosts=plain_hosts[:1])
    assert str(caught.value).count(plain_hosts[0]) == 1  # named once, by the client
    with pytest.raises(PickleNotAllowedError):
        client.make_vec(
            "CartPole-v1", num_envs=1, hosts=plain_hosts[:1], wrappers=[gym.wrappers.TimeLimit]
        )


def test_env_allowlist(tmp_path):
    from helpers import running_hosts

    with running_hosts(tmp_path, 1, "--env", "CartPole-*", "--env", "Pendulum-v1") as hosts:
        endpoint = hosts[0].endpoint
        envs = client.make_vec("CartPole-v1", num_envs=1, hosts=[endpoint])
        envs.close()
        with pytest.raises(EnvNotAllowedError, match="this host does not serve") as caught:
            client.make_vec(EPISODIC, num_envs=1, hosts=[endpoint])
        assert str(caught.value).startswith(f"host {endpoint}: this host does not serve")


def test_calls_and_attributes_on_some_envs(pair):
    remote, oracle = pair
    remote.reset(seed=1)
    oracle.reset(seed=1)
    remote.set_attr("terminate_prob", [0.5, 0.9], env_ids=[4, 1])
    assert remote.call_envs([1, 4, 1], "terminate_prob") == (0.9, 0.5, 0.9)
    assert remote.get_attr("terminate_prob") == (0.1, 0.9, 0.1, 0.1, 0.5)
    assert remote.call_envs([3, 0], "np_random_seed") == (4, 1)  # seed + index, as in Sync
    assert remote.call_envs([], "resets") == ()
    remote.set_attr("max_steps", 3, env_ids=[2])
    assert remote.get_attr("max_steps") == (10, 10, 3, 10, 10)
    chains = remote.wrappers([0, 4])
    expected = [[type(w).__module__ + "." + type(w).__qualname__ for w in wrapper_chain(env)]
                for env in (oracle.envs[0], oracle.envs[4])]  # fmt: skip
    assert [[wrapper[0] for wrapper in chain] for chain in chains] == expected
    with pytest.raises(ValueError, match="env indices below 5"):
        remote.call_envs([5], "resets")
    with pytest.raises(ValueError, match="Got `1` values for 2 environments"):
        remote.set_attr("max_steps", [1], env_ids=[0, 1])


def wrapper_chain(env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


def assert_env_info(infos, info, i):
    """Env ``i``'s dict holds exactly the keys the batched infos mark for it, same values."""
    keys = [k for k in infos if not k.startswith("_") and infos[f"_{k}"][i]]
    assert sorted(info) == sorted(keys)
    for key in keys:
        if isinstance(info[key], dict):
            assert_env_info(infos[key], info[key], i)
        else:
            np.testing.assert_array_equal(np.asarray(info[key]), infos[key][i], key)


def assert_per_env_infos_match(infos, per_env):
    assert isinstance(per_env, list) and len(per_env) == 5
    for i, info in enumerate(per_env):
        assert_env_info(infos, info, i)


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_per_env_infos_hold_what_the_batched_infos_hold(plain_hosts, mode):
    kwargs = {"terminate_prob": 0.2, "max_steps": 6}
    batched, listed = (
        client.make_vec(
            EPISODIC,
            num_envs=5,
            hosts=plain_hosts[:2],
            vector_kwargs={"autoreset_mode": mode, "info_format": info_format},
            **kwargs,
        )
        for info_format in ("dict", "list")
    )
    try:
        assert_per_env_infos_match(batched.reset(seed=7)[1], listed.reset(seed=7)[1])
        rng = np.random.default_rng(0)
        for _ in range(30):
            actions = rng.integers(0, 3, size=5)
            expected, got = batched.step(actions), listed.step(actions)
            assert_same(got[:4], expected[:4])
            assert_per_env_infos_match(expected[4], got[4])
            done = expected[2] | expected[3]
            if mode == AutoresetMode.DISABLED and done.any():
                assert_per_env_infos_match(
                    batched.reset(options={"reset_mask": done})[1],
                    listed.reset(options={"reset_mask": done})[1],
                )
    finally:
        batched.close()
        listed.close()
    with pytest.raises(ValueError, match="info_format must be 'dict' or 'list'"):
        client.make_vec(EPISODIC, num_envs=1, vector_kwargs={"info_format": "tuple"})


def test_first_ready_batches_with_per_env_infos(plain_hosts):
    envs = client.make_vec(
        EPISODIC,
        num_envs=4,
        hosts=plain_hosts[:2],
        vector_kwargs={"batch_size": 2, "info_format": "list"},
    )
    try:
        envs.async_reset(seed=0)
        for _ in range(3):  # all 4 envs in flight: two batches of 2 hand out each once
            seen = []
            for _ in range(2):
                _, _, _, _, infos = envs.recv()
                assert len(infos) == 2 and all("resets" in i or "phase" in i for i in infos)
                ids = [info["env_id"] for info in infos]
                assert ids == sorted(ids)
                seen += ids
            assert sorted(seen) == [0, 1, 2, 3]
            envs.send(np.zeros(4, dtype=np.int64), seen)
    finally:
        envs.close()


def test_a_single_action_for_a_batch_is_a_type_error_as_in_gymnasium(pair):
    remote, oracle = pair
    remote.reset(seed=0)
    oracle.reset(seed=0)
    with pytest.raises(TypeError):
        oracle.step(0)
    with pytest.raises(TypeError, match="got the single value 0: give one per env") as caught:
        remote.step(0)
    assert isinstance(caught.value, ValueError)  # callers that caught ValueError still do
    assert remote.step(np.zeros(5, dtype=np.int64))[0].shape == (5, 4)  # still usable


@pytest.mark.parametrize("pending", ["step", "reset", "call"])
def test_close_with_a_pending_call_warns_as_gymnasium_does(plain_hosts, pending):
    envs = client.make_vec("CartPole-v1", num_envs=2, hosts=plain_hosts[:1])
    envs.reset(seed=0)
    start = {
        "step": lambda: envs.step_async(np.zeros(2, dtype=np.int64)),
        "reset": lambda: envs.reset_async(seed=1),
        "call": lambda: envs.call_async("np_random_seed"),
    }[pending]
    start()
    message = f"Calling `close` while waiting for a pending call to `{pending}` to complete."
    with pytest.warns(UserWarning, match=re.escape(message)):
        envs.close()
    assert envs.closed


def test_options_read_as_attributes_and_copy_may_change_between_calls(plain_hosts):
    envs = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=2, hosts=plain_hosts[:2])
    try:
        obs, _ = envs.reset(seed=0)
        assert obs is not envs.observations
        envs.copy = False  # AsyncVectorEnv reads its copy attribute at every call too
        obs, _ = envs.reset(seed=0)
        assert obs is envs.observations
        with pytest.raises(AttributeError, match="on_host_failure is set when the env is made"):
            envs.on_host_failure = "restart"  # would leave recovery as it was: refused
        assert envs.autoreset_mode is AutoresetMode.NEXT_STEP and envs.info_format == "dict"
        assert (envs.batch_size, envs.sub_batch_size, envs.host_restarts) == (2, 1, 0)
        envs.host_restarts = 0  # a trainer may count restarts per epoch
    finally:
        envs.close()


def test_min_hosts_without_hosts_is_refused_before_other_checks():
    with pytest.raises(ValueError, match="min_hosts needs hosts"):
        client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=2, batch_size=5, min_hosts=1)


def test_make_vec_takes_the_hosts_in_vector_kwargs_too(plain_hosts):
    """Where RemoteVectorEnv's other keywords go (the Ray and Slurm pages write it so)."""
    envs = client.make_vec("CartPole-v1", 2, vector_kwargs={"hosts": plain_hosts[:1]})
    try:
        assert envs.reset(seed=0)[0].shape == (2, 4)
    finally:
        envs.close()
    with pytest.raises(TypeError, match="hosts twice"):
        client.make_vec("CartPole-v1", 2, hosts=plain_hosts[:1], vector_kwargs={"hosts": ["x"]})
