"""Conformance: GET_STATE and SET_STATE on CartPole-v1 (snapshots the host itself reads back)."""

from __future__ import annotations

from typing import Any

import numpy as np

from envserver.conformance.conftest import Session
from envserver.wire.messages import Command


def step(envs: Session, actions: list[int]) -> Any:
    """The observations of a STEP of every env."""
    return envs.request(Command.STEP, {"actions": np.array(actions, np.int64)}).ok()["obs"]


def test_a_snapshot_restored_goes_on_as_the_env_did(envs: Session) -> None:
    """GET_STATE, three steps, SET_STATE, the same three steps: the same observations."""
    envs.request(Command.RESET, {"seeds": [1, 2], "options": None}).ok()
    step(envs, [0, 1])
    states = envs.request(Command.GET_STATE, {}).ok()
    assert isinstance(states, list) and len(states) == 2
    assert all(isinstance(s, bytes) for s in states)
    after = [step(envs, [1, 0]) for _ in range(3)]
    restored = envs.request(Command.SET_STATE, {"states": states[::-1], "env_ids": [1, 0]}).ok()
    assert isinstance(restored, list) and len(restored) == 2
    for values in restored:
        assert isinstance(values, list) and len(values) == 3
        assert isinstance(values[1], dict) and values[2] is False
    envs.request(Command.SET_STATE, {"states": states}).ok()
    again = [step(envs, [1, 0]) for _ in range(3)]
    assert all(np.array_equal(a, b) for a, b in zip(again, after))


def test_snapshots_that_are_not_are_refused(envs: Session) -> None:
    """Not bytes, not one per env, or bytes that are no snapshot: an error, envs untouched."""
    envs.request(Command.RESET, {"seeds": [1, 2], "options": None}).ok()
    state = envs.request(Command.GET_STATE, {"env_ids": [0]}).ok()[0]
    for body in (
        {"states": [state]},  # one for two envs
        {"states": ["text", state]},
        {"states": None},
        {"states": [state], "env_ids": [5]},
    ):
        envs.request(Command.SET_STATE, body).error("ProtocolError")
    reply = envs.request(Command.SET_STATE, {"states": [b"junk"], "env_ids": [1]})
    assert reply.error("ProtocolError")["env_index"] == 1
    envs.request(Command.SET_STATE, {"states": [state[: len(state) // 2]], "env_ids": [0]}).error(
        "ProtocolError"
    )
    step(envs, [0, 0])  # still usable
