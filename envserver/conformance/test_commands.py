"""Conformance: every command's happy path and reply shape, on two CartPole-v1 envs."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from envserver.conformance.conftest import Session
from envserver.conformance.test_bodies import ARRAY, ext
from envserver.conformance.wire import Wire, envelope
from envserver.wire.messages import PROTOCOL_VERSION, Command
from envserver.wire.spaces import space_from_data

OBS_SHAPE = (4,)


def column(values: Any, count: int, kind: type, dtype: str) -> list[Any]:
    """A STEP column: a msgpack array of ``count`` values of ``kind``, or an ARRAY of dtype."""
    if isinstance(values, np.ndarray):
        assert values.dtype.str == dtype and values.shape == (count,), f"{values!r:.200}"
        return values.tolist()
    assert isinstance(values, list) and len(values) == count, f"{values!r:.200}"
    assert all(type(v) is kind for v in values), f"{values!r:.200} must hold {kind.__name__}s"
    return values


def check_obs(obs: Any, count: int) -> None:
    """A batch of ``count`` CartPole observations: an ARRAY of float32, env on axis 0."""
    assert isinstance(obs, np.ndarray), f"obs must be an ARRAY, got {type(obs).__name__}"
    assert obs.dtype.str == "<f4" and obs.shape == (count, *OBS_SHAPE), f"{obs.dtype} {obs.shape}"


def check_infos(infos: Any, count: int) -> None:
    """Info entries: ``[index, map]`` pairs, index an env index of the block."""
    assert isinstance(infos, list), f"infos must be an array of entries, got {infos!r:.200}"
    for entry in infos:
        assert isinstance(entry, list) and len(entry) == 2, f"bad info entry {entry!r:.200}"
        assert type(entry[0]) is int and 0 <= entry[0] < count, f"bad index in {entry!r:.200}"
        assert isinstance(entry[1], dict), f"bad info in {entry!r:.200}"


def step(envs: Session, actions: list[int], **body: Any) -> dict[str, Any]:
    """STEP with int64 actions; checks the reply's shape and returns it."""
    reply = envs.request(Command.STEP, {"actions": np.array(actions, np.int64), **body}).ok()
    assert isinstance(reply, dict)
    count = len(actions)
    check_obs(reply["obs"], count)
    column(reply["rewards"], count, float, "<f8")
    column(reply["terminations"], count, bool, "|b1")
    column(reply["truncations"], count, bool, "|b1")
    check_infos(reply["infos"], 2)
    return reply


def test_make_reply_describes_every_env(session: Session) -> None:
    """MAKE answers one observation and one action space per env, metadata and render_mode."""
    reply = session.make(3)
    assert len(reply["observation_spaces"]) == len(reply["action_spaces"]) == 3
    for data in reply["observation_spaces"]:
        space = space_from_data(data)
        assert data["type"] == "Box" and space.shape == OBS_SHAPE and space.dtype == np.float32
    for data in reply["action_spaces"]:
        assert data["type"] == "Discrete" and data["n"] == 2 and data["start"] == 0
    assert isinstance(reply["metadata"], dict)
    assert reply["render_mode"] is None


@pytest.mark.parametrize(
    "body",
    [
        {"num_envs": 0},
        {"num_envs": "2"},
        {"env_id": 5},
        {"kwargs": [1]},
        {"autoreset_mode": "Sometimes"},
    ],
    ids=["zero-envs", "str-num-envs", "int-env-id", "list-kwargs", "autoreset-mode"],
)
def test_make_refuses_bad_bodies(session: Session, body: dict[str, Any]) -> None:
    """A MAKE body that breaks the documented types is refused, and no envs are made."""
    full = {"env_id": "CartPole-v1", "kwargs": None, "num_envs": 2, **body}
    reply = session.request(Command.MAKE, full)
    expected = "ValueError" if "autoreset_mode" in body else "ProtocolError"
    reply.error(expected)
    session.make(2)  # the session still has no envs


def test_reset_reply_shape_and_seeding(envs: Session) -> None:
    """RESET answers the batch of new observations and info entries; seeds make it repeat."""
    first = envs.request(Command.RESET, {"seeds": [1, 2], "options": None}).ok()
    check_obs(first["obs"], 2)
    check_infos(first["infos"], 2)
    again = envs.request(Command.RESET, {"seeds": [1, 2]}).ok()
    np.testing.assert_array_equal(again["obs"], first["obs"])
    assert not np.array_equal(first["obs"][0], first["obs"][1])
    unseeded = envs.request(Command.RESET, {"seeds": [None, None]}).ok()
    check_obs(unseeded["obs"], 2)


def test_reset_and_step_some_envs(envs: Session) -> None:
    """With env_ids, batches hold those envs in the order given."""
    both = envs.request(Command.RESET, {"seeds": [1, 2]}).ok()
    one = envs.request(Command.RESET, {"seeds": [2], "env_ids": [1]}).ok()
    check_obs(one["obs"], 1)
    np.testing.assert_array_equal(one["obs"][0], both["obs"][1])
    reply = step(envs, [0], env_ids=[1])
    assert len(reply["obs"]) == 1
    step(envs, [1, 0], env_ids=[1, 0])


def test_step_reply_shape(envs: Session) -> None:
    """STEP answers obs, float64 rewards, bool terminations and truncations, info entries."""
    envs.request(Command.RESET, {"seeds": [3, 4]}).ok()
    reply = step(envs, [0, 1])
    assert column(reply["rewards"], 2, float, "<f8") == [1.0, 1.0]


def test_step_accepts_actions_in_their_own_frame(envs: Session) -> None:
    """An ARRAY whose data is a buffer index refers to a later frame: the host reads it there,
    whatever its size."""
    envs.request(Command.RESET, {"seeds": [5, 6]}).ok()
    request_id = envs.wire.next_id()
    body = {"actions": ext(ARRAY, ["<i8", [2], 1]), "env_ids": None}
    frames = [
        envelope(PROTOCOL_VERSION, request_id, int(Command.STEP), envs.session_id),
        msgpack.packb(body, use_bin_type=True),
        np.array([1, 0], "<i8").tobytes(),
    ]
    reply = envs.wire.ask(frames)
    assert reply.request_id == request_id
    check_obs(reply.ok()["obs"], 2)


def run_until_done(envs: Session) -> dict[str, Any]:
    """Steps env 0 alone with action 1 (the pole falls) until its episode ends."""
    for _ in range(500):
        reply = step(envs, [1], env_ids=[0])
        if reply["terminations"][0] or reply["truncations"][0]:
            return reply
    raise AssertionError("CartPole pushed one way did not end within 500 steps")


def test_next_step_autoreset(envs: Session) -> None:
    """NextStep: the STEP after an episode ends resets that env: reward 0, flags false."""
    envs.request(Command.RESET, {"seeds": [0, 1]}).ok()
    run_until_done(envs)
    after = step(envs, [1, 0])
    assert column(after["rewards"], 2, float, "<f8")[0] == 0.0
    assert not column(after["terminations"], 2, bool, "|b1")[0]
    assert not column(after["truncations"], 2, bool, "|b1")[0]


def test_same_step_autoreset(session: Session) -> None:
    """SameStep: the ending STEP reports final_obs and final_info in an info entry."""
    session.make(2, autoreset_mode="SameStep")
    session.request(Command.RESET, {"seeds": [0, 1]}).ok()
    ended = run_until_done(session)
    finals = [info for index, info in ended["infos"] if index == 0 and "final_obs" in info]
    assert finals, f"no final_obs entry for env 0 in {ended['infos']!r:.300}"
    assert set(finals[0]) == {"final_obs", "final_info"}
    assert not np.array_equal(finals[0]["final_obs"], ended["obs"][0])


def test_disabled_autoreset_refuses_a_step_after_the_end(session: Session) -> None:
    """Disabled: a STEP for an env whose episode ended is refused (AssertionError, its index)
    before any env steps; RESET with env_ids clears it."""
    session.make(2, autoreset_mode="Disabled")
    session.request(Command.RESET, {"seeds": [0, 1]}).ok()
    run_until_done(session)
    body = session.request(Command.STEP, {"actions": np.array([1, 0])}).error("AssertionError")
    assert body["env_index"] == 0
    session.request(Command.RESET, {"seeds": [None], "env_ids": [0]}).ok()
    step(session, [1, 0])


def test_call_reads_attributes_and_calls_methods(envs: Session) -> None:
    """CALL answers one result per env (of env_ids): attributes as they are, methods called."""
    assert envs.request(Command.CALL, {"name": "gravity"}).ok() == [9.8, 9.8]
    assert envs.request(
        Command.CALL, {"name": "has_wrapper_attr", "args": ["gravity"], "env_ids": [1]}
    ).ok() == [True]
    envs.request(Command.RESET, {"seeds": [11, 12]}).ok()
    seeds = envs.request(Command.CALL, {"name": "np_random_seed", "kwargs": {}}).ok()
    assert seeds == [11, 12]


@pytest.mark.parametrize("name", ["reset", "step", "close"])
def test_call_refuses_reset_step_close(envs: Session, name: str) -> None:
    """CALL must not run reset, step or close (ValueError)."""
    envs.request(Command.CALL, {"name": name}).error("ValueError", "builtins")


def test_set_attr_sets_one_value_per_env(envs: Session) -> None:
    """SET_ATTR answers nil and sets values[i] on env i (of env_ids)."""
    assert envs.request(Command.SET_ATTR, {"name": "gravity", "values": [5.0, 6.0]}).ok() is None
    assert envs.request(Command.CALL, {"name": "gravity"}).ok() == [5.0, 6.0]
    body = {"name": "gravity", "values": [7.0], "env_ids": [1], "outermost": False}
    assert envs.request(Command.SET_ATTR, body).ok() is None
    assert envs.request(Command.CALL, {"name": "gravity"}).ok() == [5.0, 7.0]
    wrong = {"name": "gravity", "values": [1.0]}
    envs.request(Command.SET_ATTR, wrong).error("ValueError", "builtins")


def test_render_answers_one_frame_per_env(envs: Session) -> None:
    """RENDER answers an array of one result per env (nil without a render mode)."""
    envs.request(Command.RESET, {"seeds": [0, 0]}).ok()
    assert envs.request(Command.RENDER, {}).ok() == [None, None]


def test_wrappers_answers_each_env_chain(envs: Session) -> None:
    """WRAPPERS answers, per env, per wrapper (outermost first), its class's MRO names."""
    chains = envs.request(Command.WRAPPERS, {"env_ids": [1]}).ok()
    assert isinstance(chains, list) and len(chains) == 1
    for wrapper in chains[0]:
        assert isinstance(wrapper, list) and wrapper
        assert all(isinstance(name, str) and "." in name for name in wrapper)
    assert chains[0][0][0] == "gymnasium.wrappers.common.TimeLimit"
    assert len(envs.request(Command.WRAPPERS, {}).ok()) == 2


def test_ping_counts_sessions(wire: Wire, envs: Session) -> None:
    """PING's host info counts the sessions held (this test holds at least one)."""
    assert wire.request(Command.PING, {}).ok()["sessions"] >= 1
