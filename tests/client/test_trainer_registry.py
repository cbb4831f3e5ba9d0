"""Envs registered in the trainer: their specs travel to local hosts, which allow pickle.

An env defined in the trainer's ``__main__`` (a script run for real) or in a module it imported
is made on local hosts by ``client.make_vec``, by ``RemoteVectorEnv(env_fns)`` and by
``RemoteVectorEnv(env_id=...)``, with the results and the spec ``AsyncVectorEnv`` has, in every
autoreset mode. A host that does not allow pickle gets no specs: its error says how it would
know the id.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
from helpers import running_hosts

from envserver import client

TESTS = Path(__file__).resolve().parents[1]
GUIDE = TESTS.parent / "docs" / "guides" / "your-envs.md"

#: An env of the script's own, a spec with a time limit and a wrapper, and an id for each way in.
SCRIPT = textwrap.dedent(
    """
    import sys

    import gymnasium as gym
    import numpy as np
    from gymnasium.envs.registration import WrapperSpec
    from gymnasium.vector import AutoresetMode

    from envserver import client

    sys.path.insert(0, sys.argv[1])
    from helpers import assert_same

    FIELDS = ("id", "entry_point", "kwargs", "max_episode_steps", "additional_wrappers")


    class Coin(gym.Env):
        # Seeded flips; the episode ends on three heads in a row.

        observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, bias=0.5):
            self.bias = bias

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.heads = 0
            return np.zeros(1, np.float32), {"heads": 0}

        def step(self, action):
            head = self.np_random.random() < self.bias
            self.heads = self.heads + 1 if head else 0
            reward = float(head == bool(action))
            info = {"heads": self.heads}
            return np.array([head], np.float32), reward, self.heads >= 3, False, info


    ORDER = WrapperSpec("Order", "gymnasium.wrappers:OrderEnforcing", {})
    gym.register("Coin-v0", entry_point=Coin, max_episode_steps=6, additional_wrappers=(ORDER,))
    gym.register("Coin-v1", entry_point="__main__:Coin", kwargs={"bias": 0.7})


    def specs(envs):
        return [tuple(getattr(s, f) for f in FIELDS) for s in envs.get_attr("spec")]


    def compare(remote, oracle, mode, same_specs=True):
        # SyncVectorEnv's results (AsyncVectorEnv orders SAME_STEP's infos otherwise).
        try:
            assert remote.metadata["autoreset_mode"] == mode
            assert not same_specs or specs(remote) == specs(oracle), (specs(remote), specs(oracle))
            assert_same(remote.reset(seed=3), oracle.reset(seed=3))
            actions = np.random.default_rng(0).integers(0, 2, size=(16, remote.num_envs))
            for action in actions:
                result = remote.step(action)
                assert_same(result, oracle.step(action))
                ended = result[2] | result[3]
                if mode == AutoresetMode.DISABLED and ended.any():
                    mask = {"reset_mask": ended}
                    assert_same(remote.reset(options=mask), oracle.reset(options=mask))
        finally:
            remote.close()
            oracle.close()


    for mode in AutoresetMode:
        kwargs = {"autoreset_mode": mode}
        for env_id in ("Coin-v0", "Coin-v1"):
            asynchronous = gym.make_vec(env_id, 2, "async", vector_kwargs=kwargs)
            for vectorization_mode in (None, "sync", "async"):
                remote = client.make_vec(env_id, 2, vectorization_mode, vector_kwargs=kwargs)
                expected = asynchronous.spec
                expected.kwargs["vectorization_mode"] = vectorization_mode
                assert remote.spec == expected, (remote.spec, expected)
                assert remote.spec.max_episode_steps == expected.max_episode_steps
                assert specs(remote) == specs(asynchronous)
                compare(remote, gym.make_vec(env_id, 2, "sync", vector_kwargs=kwargs), mode)
            asynchronous.close()
        fns = [lambda: gym.make("Coin-v0"), lambda: gym.make("Coin-v1", bias=0.2)] * 2
        compare(
            client.RemoteVectorEnv(fns, autoreset_mode=mode),
            gym.vector.SyncVectorEnv(fns, autoreset_mode=mode),
            mode,
        )
        compare(
            client.RemoteVectorEnv(env_id="Coin-v0", num_envs=3, autoreset_mode=mode),
            gym.vector.SyncVectorEnv([lambda: gym.make("Coin-v0")] * 3, autoreset_mode=mode),
            mode,
        )
    # Wrappers of the script's, by value too (their specs hold a function: equal only to itself).
    doubled = [lambda env: gym.wrappers.TransformReward(env, lambda r: 2 * r)]
    compare(
        client.make_vec("Coin-v0", 2, wrappers=doubled),
        gym.make_vec("Coin-v0", 2, "sync", wrappers=doubled),
        AutoresetMode.NEXT_STEP,
        same_specs=False,
    )
    print("same")
    """
)

#: A module of the user's that registers envs when imported: one by callable, one by string.
MYENVS = textwrap.dedent(
    """
    import gymnasium as gym
    import numpy as np


    class Drift(gym.Env):
        observation_space = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
        action_space = gym.spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.x = self.np_random.normal(size=2).astype(np.float32)
            return self.x.copy(), {}

        def step(self, action):
            self.x += (int(action) - 1) + self.np_random.normal(size=2).astype(np.float32)
            return self.x.copy(), float(-abs(self.x).sum()), False, False, {}


    gym.register("MyEnvs/Drift-v0", entry_point=Drift, max_episode_steps=5)
    gym.register("MyEnvs/Walk-v0", entry_point="myenvs:Drift", max_episode_steps=4)
    """
)


@pytest.mark.slow
def test_envs_of_the_trainers_main_run_on_local_hosts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(TESTS)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip() == "same"


@pytest.fixture
def myenvs(tmp_path, monkeypatch):
    """The user's module, imported by this process only (the hosts never import it on their own)."""
    (tmp_path / "myenvs.py").write_text(MYENVS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "myenvs", raising=False)
    import myenvs  # noqa: F401  (registers MyEnvs/Drift-v0 and Walk-v0)

    yield tmp_path
    for env_id in ("MyEnvs/Drift-v0", "MyEnvs/Walk-v0"):
        gym.envs.registration.registry.pop(env_id, None)


@pytest.mark.parametrize("env_id", ["MyEnvs/Drift-v0", "MyEnvs/Walk-v0"])
def test_envs_of_a_module_the_trainer_imported_run_on_local_hosts(myenvs, env_id):
    from helpers import assert_same

    remote = client.make_vec(env_id, 2, vectorization_mode="async")
    oracle = gym.make_vec(env_id, 2, vectorization_mode="async")
    fns = client.RemoteVectorEnv([lambda: gym.make(env_id)] * 2)
    try:
        expected = oracle.spec
        assert remote.spec == expected and fns.spec is None
        for envs in (remote, fns):
            steps = [spec.max_episode_steps for spec in envs.get_attr("spec")]
            assert steps == [expected.max_episode_steps] * 2
            assert_same(envs.reset(seed=5), oracle.reset(seed=5))
            for _ in range(9):  # past the time limit
                action = oracle.action_space.sample()
                assert_same(envs.step(action), oracle.step(action))
    finally:
        for envs in (remote, oracle, fns):
            envs.close()


@pytest.fixture(scope="module")
def plain_host(tmp_path_factory) -> str:
    with running_hosts(tmp_path_factory.mktemp("plain"), 1) as hosts:
        yield hosts[0].endpoint


@pytest.mark.parametrize(
    ("env_id", "error"),
    [("MyEnvs/Drift-v0", gym.error.NamespaceNotFound), ("Coin-v0", gym.error.NameNotFound)],
)
def test_a_host_without_the_id_says_how_to_register_it(myenvs, plain_host, env_id, error):
    gym.register("Coin-v0", entry_point="myenvs:Drift")
    try:
        with pytest.raises(error) as raised:
            client.make_vec(env_id, 2, hosts=[plain_host])
    finally:
        gym.envs.registration.registry.pop("Coin-v0")
    what = {
        "Coin-v0": "Environment `Coin` doesn't exist.",
        "MyEnvs/Drift-v0": "Namespace MyEnvs not found. Have you installed the proper package "
        "for MyEnvs?",
    }[env_id]
    expected = (
        f"host {plain_host}, env 0: {what} This host does not have it registered: start it "
        "with `envserver serve --import MODULE` (MODULE: the module that registers it), or ask "
        f"for '{'MODULE:' + env_id}'"
    )
    assert str(raised.value) == expected
    if env_id == "Coin-v0":  # the guide quotes it (its lines joined)
        quoted = f"gymnasium.error.NameNotFound: {expected}".replace(plain_host, "tcp://sim-a:5555")
        assert quoted in " ".join(GUIDE.read_text().split())
    client.make_vec("CartPole-v1", 2, hosts=[plain_host]).close()  # the host serves on
