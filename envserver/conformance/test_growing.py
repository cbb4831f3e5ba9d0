"""Conformance: a session that grows (MAKE with ``"add"``) and closes envs one by one.

An agent-loop client holds one session per host and makes its envs there one at a time, as its
rollouts ask for them; each env is closed when its rollout ends, the others going on.
"""

from __future__ import annotations

import numpy as np
import pytest

from envserver.conformance.conftest import ENV_ID, Session
from envserver.conformance.test_commands import check_obs
from envserver.wire.messages import Command


def add(session: Session, num_envs: int = 1, **body: object) -> dict:
    """MAKE ``num_envs`` CartPole envs added to the session's; the OK reply's body."""
    return session.make(num_envs, add=True, **body)


def test_add_makes_envs_after_those_held(envs: Session) -> None:
    """MAKE with add appends envs: the reply describes the new ones and says the first's index
    (``first_env``); requests may then name every env."""
    reply = add(envs, 2)
    assert reply["first_env"] == 2
    assert len(reply["observation_spaces"]) == len(reply["action_spaces"]) == 2
    third = add(envs)
    assert third["first_env"] == 4
    obs = envs.request(Command.RESET, {"seeds": [7, 8], "env_ids": [4, 0]}).ok()["obs"]
    check_obs(obs, 2)
    same = envs.request(Command.RESET, {"seeds": [7], "env_ids": [1]}).ok()["obs"]
    np.testing.assert_array_equal(same[0], obs[0])  # a new env is like the others
    stepped = envs.request(Command.STEP, {"actions": np.array([1, 0]), "env_ids": [0, 4]}).ok()
    assert len(stepped["rewards"]) == 2
    everyone = envs.request(Command.RESET, {"seeds": [None] * 5}).ok()
    check_obs(everyone["obs"], 5)


def test_add_to_a_session_without_envs_makes_its_first(session: Session) -> None:
    """An add to a session with no envs yet is its first MAKE: ``first_env`` is 0 (absent)."""
    reply = add(session, 2)
    assert reply.get("first_env", 0) == 0
    assert add(session)["first_env"] == 2


def test_make_without_add_is_still_refused(envs: Session) -> None:
    """Without add, a session that holds envs refuses MAKE (ProtocolError), as before."""
    envs.request(Command.MAKE, {"env_id": ENV_ID, "kwargs": None, "num_envs": 1}).error(
        "ProtocolError", "envserver.errors"
    )


@pytest.mark.parametrize(
    "body",
    [
        {"add": 1},
        {"add": True, "autoreset_mode": "SameStep"},
        {"add": True, "first_resets": [[1, None]]},
        {"add": True, "autoreset_pending": True},
        {"add": True, "env_id": "MountainCar-v0"},
    ],
    ids=["not-bool", "other-mode", "first-resets", "autoreset-pending", "other-spaces"],
)
def test_add_refuses_what_does_not_fit_the_session(envs: Session, body: dict) -> None:
    """An add in another autoreset mode, with keys only a first MAKE takes, or of envs whose
    spaces differ from the session's (their steps could not be batched) is refused, and adds
    nothing."""
    full = {"env_id": ENV_ID, "kwargs": None, "num_envs": 1, **body}
    reply = envs.request(Command.MAKE, full)
    reply.error("ValueError" if "env_id" in body else "ProtocolError")
    assert add(envs)["first_env"] == 2  # nothing was added


def test_close_with_env_ids_closes_those_envs_only(envs: Session) -> None:
    """CLOSE with ``{"env_ids": [...]}`` closes those envs and answers nil; the session and its
    other envs go on, and the indices are not reused."""
    add(envs)
    envs.request(Command.RESET, {"seeds": [1, 2, 3]}).ok()
    assert envs.request(Command.CLOSE, {"env_ids": [1]}).ok() is None
    stepped = envs.request(Command.STEP, {"actions": np.array([0, 1]), "env_ids": [2, 0]}).ok()
    assert len(stepped["rewards"]) == 2
    assert add(envs)["first_env"] == 3


@pytest.mark.parametrize(
    ("command", "body"),
    [
        (Command.STEP, {"actions": np.array([0]), "env_ids": [1]}),
        (Command.RESET, {"seeds": [None], "env_ids": [1]}),
        (Command.CALL, {"name": "gravity", "env_ids": [1]}),
        (Command.GET_STATE, {"env_ids": [1]}),
        (Command.CLOSE, {"env_ids": [1]}),
        (Command.RESET, {"seeds": [None]}),
        (Command.RENDER, {}),
    ],
    ids=["step", "reset", "call", "get-state", "close", "reset-all", "render"],
)
def test_a_closed_env_is_named_by_no_command(envs: Session, command: Command, body: dict) -> None:
    """A command that names a closed env, or (with none named) would reach it, is a
    ProtocolError; the other envs are untouched."""
    envs.request(Command.RESET, {"seeds": [1, 2]}).ok()
    envs.request(Command.CLOSE, {"env_ids": [1]}).ok()
    envs.request(command, body).error("ProtocolError", "envserver.errors")
    envs.request(Command.STEP, {"actions": np.array([0]), "env_ids": [0]}).ok()


def test_closed_envs_are_not_counted_as_held(wire, envs: Session) -> None:
    """The host info's ``envs`` counts the envs held: one closed is not."""
    before = wire.request(Command.PING).ok()["envs"]
    envs.request(Command.CLOSE, {"env_ids": [0]}).ok()
    assert wire.request(Command.PING).ok()["envs"] == before - 1
