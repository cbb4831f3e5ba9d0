"""Conformance: error replies for bad requests and for envs that raise; the host goes on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from envserver.conformance.conftest import Session
from envserver.wire.messages import Command


def test_an_env_exception_names_the_env(envs: Session) -> None:
    """An exception raised by an env is the reply (its module, type, message and traceback),
    with env_index = that env's index in the block, not its position in env_ids."""
    actions = {"actions": np.array([1], np.int64), "env_ids": [1]}
    body = envs.request(Command.STEP, actions).error("ResetNeeded", "gymnasium.error")
    assert body["env_index"] == 1
    assert body["message"] and body["traceback"]
    envs.request(Command.RESET, {"seeds": [0, 0]}).ok()  # the envs are still usable
    envs.request(Command.STEP, {"actions": np.array([0, 1], np.int64)}).ok()


def test_a_missing_attribute_is_an_env_error(envs: Session) -> None:
    """CALL of an attribute the env lacks: AttributeError with the env's index."""
    body = envs.request(Command.CALL, {"name": "no_such_attribute", "env_ids": [1, 0]})
    assert body.error("AttributeError", "builtins")["env_index"] == 1


def test_an_action_the_env_rejects_is_an_env_error(envs: Session) -> None:
    """An action of the right shape that the env refuses is that env's error."""
    envs.request(Command.RESET, {"seeds": [0, 0]}).ok()
    reply = envs.request(Command.STEP, {"actions": np.array([0, 7], np.int64)})
    assert reply.status == 1
    assert reply.body["env_index"] == 1


def test_making_an_unknown_env_is_an_env_error(session: Session) -> None:
    """An env that cannot be made fails MAKE with the index of that env."""
    body = {"env_id": "NoSuchEnv-v0", "kwargs": None, "num_envs": 1}
    reply = session.request(Command.MAKE, body)
    assert reply.status == 1 and reply.body["env_index"] == 0
    assert reply.body["module"] == "gymnasium.error"


@pytest.mark.parametrize(
    "actions",
    [np.array([0, 1, 1]), np.array([0]), np.array([[0, 1]]), 1, None],
    ids=["three-for-two", "one-for-two", "wrong-shape", "scalar", "nil"],
)
def test_actions_of_the_wrong_shape_are_refused(envs: Session, actions: Any) -> None:
    """Actions that are not a batch of exactly one value per env: ValueError (BatchTypeError
    for a single value), env_index nil."""
    envs.request(Command.RESET, {"seeds": [0, 0]}).ok()
    body = envs.request(Command.STEP, {"actions": actions}).error(("ValueError", "BatchTypeError"))
    assert body["env_index"] is None


def test_a_step_without_actions_is_refused(envs: Session) -> None:
    """STEP needs an actions key."""
    envs.request(Command.STEP, {}).error("ProtocolError", "envserver.errors")


@pytest.mark.parametrize(
    "env_ids", [[], [2], [-1], [0, 0], [True], "0", [0.0]],
    ids=["empty", "out-of-range", "negative", "repeated", "boolean", "string", "float"],
)  # fmt: skip
@pytest.mark.parametrize("command", [Command.RESET, Command.CALL, Command.WRAPPERS])
def test_bad_env_ids_are_refused(envs: Session, env_ids: Any, command: Command) -> None:
    """env_ids is nil or a non-empty array of distinct env indices: else a ProtocolError."""
    body = {"seeds": [None], "name": "gravity", "env_ids": env_ids}
    envs.request(command, body).error("ProtocolError", "envserver.errors")


@pytest.mark.parametrize(
    "body",
    [{"seeds": [1]}, {"seeds": None}, {"seeds": ["1", 2]}, {"seeds": [True, 2]},
     {"seeds": [1, 2], "options": [1]}],
    ids=["too-few", "nil", "string", "boolean", "options-list"],
)  # fmt: skip
def test_bad_reset_bodies_are_refused(envs: Session, body: dict[str, Any]) -> None:
    """RESET needs one integer-or-nil seed per env and options that are a map or nil."""
    envs.request(Command.RESET, body).error("ProtocolError", "envserver.errors")


@pytest.mark.parametrize(
    ("command", "body"),
    [
        (Command.CALL, {"name": 5}),
        (Command.CALL, {"name": "gravity", "args": {}}),
        (Command.CALL, {"name": "gravity", "kwargs": []}),
        (Command.SET_ATTR, {"name": "gravity", "values": 1.0}),
        (Command.SET_ATTR, {"name": "gravity", "values": [1.0, 1.0], "outermost": 1}),
    ],
    ids=["call-name", "call-args", "call-kwargs", "set-values", "set-outermost"],
)
def test_bad_call_and_set_attr_bodies_are_refused(
    envs: Session, command: Command, body: dict[str, Any]
) -> None:
    """CALL needs a name string, args array, kwargs map; SET_ATTR a values array, a bool."""
    envs.request(command, body).error("ProtocolError", "envserver.errors")


def test_env_errors_reports_each_env_beside_the_others_results(envs: Session) -> None:
    """A STEP with ``"env_errors": true`` steps every env named; one that raises is reported in
    the OK reply's ``env_errors`` (``[[env index, error map], ...]``, in request order), and the
    others' results are in the batches, at their places."""
    envs.request(Command.RESET, {"seeds": [3], "env_ids": [0]}).ok()  # env 1 needs a reset
    body = {"actions": np.array([0, 1], np.int64), "env_ids": [1, 0], "env_errors": True}
    reply = envs.request(Command.STEP, body).ok()
    [[index, error]] = reply["env_errors"]
    assert index == 1 and error["type"] == "ResetNeeded" and error["env_index"] == 1
    assert error["module"] == "gymnasium.error" and error["message"] and error["traceback"]
    assert list(reply["rewards"]) == [0.0, 1.0]  # env 0 stepped, at its place
    without = envs.request(Command.STEP, {"actions": np.array([1], np.int64), "env_ids": [0]})
    assert "env_errors" not in without.ok()  # not asked for: not in the reply


def test_env_errors_on_reset(envs: Session) -> None:
    """A RESET with ``"env_errors": true`` answers OK, each env that raised in ``env_errors``."""
    body = {"seeds": [1, 2], "options": {"low": "not a number"}, "env_errors": True}
    reply = envs.request(Command.RESET, body).ok()
    assert [index for index, _ in reply["env_errors"]] == [0, 1]
    again = envs.request(Command.RESET, {"seeds": [1, 2], "env_errors": True}).ok()
    assert again["env_errors"] == []


@pytest.mark.parametrize("command", [Command.STEP, Command.RESET])
def test_env_errors_must_be_a_boolean(envs: Session, command: Command) -> None:
    """``env_errors`` is a bool: another value is a ProtocolError."""
    body = {"actions": np.array([0, 0]), "seeds": [None, None], "env_errors": 1}
    envs.request(command, body).error("ProtocolError", "envserver.errors")
