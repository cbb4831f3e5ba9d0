"""MAKE's ``envs`` (each env's id and kwargs) and ``specs`` (the trainer's, pickled): written by
the client as a host reads them, checked, and on a host the specs are Gymnasium's only while
the session's envs are made."""

from __future__ import annotations

import sys

import gymnasium as gym
import pytest
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from envserver import client
from envserver.errors import EnvNotAllowedError, PickleNotAllowedError, ProtocolError
from envserver.wire import codec
from envserver.wire.bodies import EnvSpecs, MainEntryPoint, Make

PAIRS = (("CartPole-v1", {}), ("Pendulum-v1", {"g": 9.0}))


def test_each_envs_id_and_kwargs_travel_as_pairs():
    wire = Make(AutoresetMode.NEXT_STEP, 2, envs=PAIRS).to_wire()
    assert wire == {
        "autoreset_mode": "NextStep",
        "envs": [["CartPole-v1", {}], ["Pendulum-v1", {"g": 9.0}]],
    }
    read = Make.from_wire(wire, ["*"])
    assert read.envs == PAIRS and read.num_envs == 2 and read.pairs() == list(PAIRS)
    assert Make(AutoresetMode.NEXT_STEP, 2, "CartPole-v1").pairs() == [("CartPole-v1", {})] * 2


@pytest.mark.parametrize(
    ("envs", "error", "match"),
    [
        ([], ProtocolError, "non-empty list of"),
        ([["CartPole-v1"]], ProtocolError, r"\[env_id string, kwargs map\] pair"),
        ([["CartPole-v1", None]], ProtocolError, r"\[env_id string, kwargs map\] pair"),
        ([[1, {}]], ProtocolError, r"\[env_id string, kwargs map\] pair"),
        ([["CartPole-v1", {}], ["Pendulum-v1", {}]], EnvNotAllowedError, "'Pendulum-v1'"),
    ],
)
def test_bad_envs_are_refused(envs, error, match):
    with pytest.raises(error, match=match):
        Make.from_wire({"envs": envs}, ["CartPole-*"])


def test_specs_travel_pickled_and_only_to_a_host_that_allows_pickle():
    spec = EnvSpec("Mine-v0", entry_point=MainEntryPoint("__main__:Mine", gym.Env))
    body = Make(AutoresetMode.NEXT_STEP, 1, "Mine-v0", specs=(spec,)).to_wire()
    frames = codec.encode(body, allow_pickle=True)
    with pytest.raises(PickleNotAllowedError):
        codec.decode([bytes(f) for f in frames])
    read = Make.from_wire(codec.decode([bytes(f) for f in frames], allow_pickle=True), ["*"])
    (entry_point,) = [s.entry_point for s in read.specs]
    assert entry_point == "__main__:Mine" and entry_point.creator is gym.Env
    for specs in (["Mine-v0"], [spec], EnvSpecs(("Mine-v0",)), EnvSpecs(3)):
        with pytest.raises(ProtocolError, match="EnvSpecs of gymnasium EnvSpecs"):
            Make.from_wire({"env_id": "Mine-v0", "num_envs": 1, "specs": specs}, ["*"])


def test_a_sessions_specs_never_reach_another_session(pickle_hosts, tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('Mine/Stay-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import mine  # noqa: F401  (registers Mine/Stay-v0 here only)

    try:
        host = pickle_hosts[:1]
        with_specs = client.RemoteVectorEnv([lambda: gym.make("Mine/Stay-v0")], hosts=host)
        with_specs.close()
        with pytest.raises(gym.error.NamespaceNotFound, match="does not have it registered"):
            client.RemoteVectorEnv(env_id="Mine/Stay-v0", num_envs=1, hosts=host)
    finally:
        gym.envs.registration.registry.pop("Mine/Stay-v0")


def test_a_spec_the_host_cannot_read_is_left_out(pickle_hosts, tmp_path, monkeypatch):
    """A factory's MAKE carries every spec the trainer registered: one whose entry point's module
    the host cannot import (a class, pickled by reference) must not refuse envs that never use
    it, and the specs the host can read still travel."""
    (tmp_path / "only_here.py").write_text(
        "import gymnasium as gym\n"
        "from gymnasium.envs.classic_control import CartPoleEnv\n"
        "class Here(CartPoleEnv):\n"
        "    pass\n"
        "gym.register('OnlyHere-v0', entry_point=Here)\n"
        "gym.register('AlsoHere-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',\n"
        "             max_episode_steps=7)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here  # noqa: F401  (registers both here only)

    try:
        envs = client.RemoteVectorEnv([lambda: gym.make("AlsoHere-v0")] * 2, hosts=pickle_hosts[:1])
        try:
            envs.reset(seed=1)
            truncations = [envs.step(envs.action_space.sample())[3] for _ in range(7)]
            assert truncations[-1].all() and not any(t.any() for t in truncations[:-1])
        finally:
            envs.close()
        wire = Make(AutoresetMode.NEXT_STEP, 1, specs=(gym.spec("OnlyHere-v0"),)).to_wire()
        frames = codec.encode(wire, allow_pickle=True)
        monkeypatch.delitem(sys.modules, "only_here")
        monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
        assert codec.decode([bytes(f) for f in frames], allow_pickle=True)["specs"].specs == ()
    finally:
        for name in ("OnlyHere-v0", "AlsoHere-v0"):
            gym.envs.registration.registry.pop(name)
