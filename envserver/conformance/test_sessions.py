"""Conformance: HELLO, sessions, CLOSE, and retried requests answered from the cache."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest

from envserver.conformance.conftest import Session
from envserver.conformance.test_envelope import check_host_info
from envserver.conformance.wire import Wire
from envserver.wire.messages import Command

#: Commands that need a session holding envs.
ENV_COMMANDS = {
    Command.RESET: {"seeds": [None, None]},
    Command.STEP: {"actions": np.array([0, 1])},
    Command.CALL: {"name": "gravity"},
    Command.SET_ATTR: {"name": "gravity", "values": [1.0, 1.0]},
    Command.RENDER: {},
    Command.WRAPPERS: {},
}


def test_hello_opens_distinct_sessions(wire: Wire, open_wire: Callable[[], Wire]) -> None:
    """Each HELLO opens a new session: a bin id, merged with the host info; sessions are not
    bound to a connection."""
    first = wire.request(Command.HELLO, {"client": "a", "pickle": False}).ok()
    check_host_info({key: value for key, value in first.items() if key != "session"})
    assert isinstance(first["session"], bytes)
    with open_wire() as other:
        second = other.hello()
        assert second != first["session"]
        wire.request(Command.CLOSE, None, session=second).ok()  # another connection's session
    wire.request(Command.CLOSE, None, session=first["session"]).ok()


def test_hello_body_must_be_a_map(wire: Wire) -> None:
    """A HELLO body that is not a map is a ProtocolError."""
    wire.request(Command.HELLO, ["client"]).error("ProtocolError", "envserver.errors")


@pytest.mark.parametrize("command", [*ENV_COMMANDS, Command.MAKE, Command.CLOSE])
def test_requests_need_a_known_session(wire: Wire, command: Command) -> None:
    """Every command but HELLO and PING needs a session: nil or unknown is UnknownSessionError,
    not raised by an env (env_index nil)."""
    for session_id in (None, os.urandom(16)):
        body = wire.request(command, ENV_COMMANDS.get(command, {}), session=session_id).error(
            "UnknownSessionError", "envserver.errors"
        )
        assert body["env_index"] is None


@pytest.mark.parametrize("command", list(ENV_COMMANDS))
def test_commands_before_make_are_refused(session: Session, command: Command) -> None:
    """A session without envs answers every env command with a ProtocolError."""
    session.request(command, ENV_COMMANDS[command]).error("ProtocolError", "envserver.errors")


@pytest.mark.parametrize("command", [Command.MAKE, *ENV_COMMANDS])
def test_bodies_must_be_maps(envs: Session, command: Command) -> None:
    """The body of MAKE, RESET, STEP, CALL, SET_ATTR, RENDER and WRAPPERS is a map."""
    envs.request(command, [1, 2]).error("ProtocolError", "envserver.errors")


def test_close_forgets_the_session(envs: Session) -> None:
    """CLOSE answers nil; the session is then unknown."""
    assert envs.request(Command.CLOSE).ok() is None
    envs.request(Command.RESET, {"seeds": [1, 2]}).error("UnknownSessionError")


def test_make_twice_is_refused(envs: Session) -> None:
    """A session holds one block of envs: a second MAKE (without add) is a ProtocolError."""
    body = {"env_id": "CartPole-v1", "kwargs": None, "num_envs": 1}
    envs.request(Command.MAKE, body).error("ProtocolError", "envserver.errors")


def test_a_repeated_request_id_is_answered_from_the_cache(
    envs: Session, open_wire: Callable[[], Wire]
) -> None:
    """A request repeated with the id of the last one answered gets that reply again and is
    not run again; one with a smaller id is refused with a ProtocolError and not run."""
    envs.request(Command.RESET, {"seeds": [7, 8]}).ok()
    step = {"actions": np.array([1, 0])}
    request_id = envs.wire.next_id()
    first = envs.request(Command.STEP, step, request_id=request_id).ok()
    again = envs.request(Command.STEP, step, request_id=request_id).ok()
    np.testing.assert_array_equal(again["obs"], first["obs"])
    envs.request(Command.STEP, step, request_id=request_id - 1).error("ProtocolError")
    second = envs.request(Command.STEP, step).ok()

    with open_wire() as wire:  # the same seeds and actions, each step sent once
        fresh = Session(wire, wire.hello())
        fresh.make(2)
        fresh.request(Command.RESET, {"seeds": [7, 8]}).ok()
        np.testing.assert_array_equal(fresh.request(Command.STEP, step).ok()["obs"], first["obs"])
        np.testing.assert_array_equal(fresh.request(Command.STEP, step).ok()["obs"], second["obs"])
        fresh.request(Command.CLOSE).ok()


def test_a_retry_must_repeat_its_command(envs: Session) -> None:
    """A request id answered for one command, sent again with another, is refused and not
    run (it would get the other's cached reply otherwise)."""
    request_id = envs.wire.next_id()
    envs.request(Command.RESET, {"seeds": [3, 4]}, request_id=request_id).ok()
    envs.request(Command.CALL, {"name": "gravity"}, request_id=request_id).error("ProtocolError")


def test_the_retry_window_keeps_the_latest_replies(session: Session) -> None:
    """MAKE's ``retry_window`` n: the replies of the n latest requests are answered again from
    the cache; an older one is refused and not run."""
    session.make(2, retry_window=3)
    replies = {}
    for seed in (10, 20, 30, 40):
        request_id = session.wire.next_id()
        body = {"seeds": [seed, seed]}
        replies[request_id] = session.request(Command.RESET, body, request_id=request_id).ok()
    oldest, *kept = sorted(replies)
    for request_id in kept:
        again = session.request(Command.RESET, {"seeds": [0, 0]}, request_id=request_id).ok()
        np.testing.assert_array_equal(again["obs"], replies[request_id]["obs"])
    session.request(Command.RESET, {"seeds": [0, 0]}, request_id=oldest).error("ProtocolError")


@pytest.mark.parametrize("window", [0, -1, 1.5, "2", 1 << 20])
def test_a_retry_window_out_of_range_is_refused(session: Session, window: object) -> None:
    """A ``retry_window`` that is not an integer from 1 to 4096 is a ProtocolError."""
    body = {"env_id": "CartPole-v1", "kwargs": None, "num_envs": 1, "retry_window": window}
    session.request(Command.MAKE, body).error("ProtocolError")


def test_heartbeat_renews_a_session_outside_the_request_order(envs: Session) -> None:
    """HEARTBEAT needs a known session, ignores its body, replies with the lease, and is outside
    the request-id order: an id older than one already answered is still served."""
    envs.request(Command.RESET, {"seeds": [None, None]}, request_id=100).ok()
    for request_id, body in ((5, None), (6, {"anything": [1, 2]})):
        reply = envs.request(Command.HEARTBEAT, body, request_id=request_id).ok()
        assert isinstance(reply, dict) and type(reply.get("session_lease_s")) is float
    envs.request(Command.RESET, {"seeds": [None, None]}, request_id=101).ok()


def test_heartbeat_of_an_unknown_session_is_refused(wire: Wire) -> None:
    """A HEARTBEAT for a session the host does not hold tells the client it is gone."""
    wire.request(Command.HEARTBEAT, None, session=os.urandom(16)).error(
        "UnknownSessionError", "envserver.errors"
    )
