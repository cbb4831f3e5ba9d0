"""A session that overlaps (MAKE's ``"overlap"``): its steps and resets run on threads.

On a real host, over the wire. The envs are GateEnvs: a ``wait`` env's step waits until an
``open`` env's step ran, which a host that steps one request after another never lets happen
(the waiting step would wait its whole timeout, and say so in its info).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from helpers import running_hosts

from envserver.conformance.wire import Wire, request_frames
from envserver.wire.messages import Command

GATE = "envserver.testing:envserver/Gate-v0"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_hosts(tmp_path_factory.mktemp("overlap"), 1) as hosts:
        yield hosts[0].endpoint


def make(wire: Wire, session: bytes, gate: str, overlap: bool = True) -> None:
    """Env 0 waits at ``gate``, env 1 opens it, env 2 is another waiter (all reset)."""
    envs = [[GATE, {"role": role, "gate": gate, "timeout_s": 20.0}] for role in ("wait", "open")]
    body = {"envs": [*envs, envs[0]], "overlap": overlap, "autoreset_mode": "Disabled"}
    wire.request(Command.MAKE, {**body, "retry_window": 8}, session=session).ok()
    wire.request(Command.RESET, {"seeds": [0, 1, 2]}, session=session).ok()


def send(wire: Wire, session: bytes, command: Command, body: dict, request_id: int) -> None:
    wire.send(request_frames(command, body, session=session, request_id=request_id))


def step(env_ids: list[int]) -> dict:
    return {"actions": np.zeros(len(env_ids), np.int64), "env_ids": env_ids}


def test_a_step_runs_while_another_waits(host):
    """The waiting step is under way when the opening one comes: both are answered (in the
    order they finish), and the waiting one saw the gate open."""
    with Wire(host) as wire:
        session = wire.hello()
        make(wire, session, "first")
        send(wire, session, Command.STEP, step([0]), 100)
        send(wire, session, Command.STEP, step([1]), 101)
        replies = {reply.request_id: reply for reply in (wire.receive(), wire.receive())}
        assert dict(replies[100].ok()["infos"])[0] == {"opened": True}
        assert dict(replies[101].ok()["infos"])[1] == {"opened": True}


def test_without_overlap_requests_are_served_in_turn(host):
    """The same envs in a session that did not ask: one request after another (the waiting
    step times out before the opening one runs)."""
    with Wire(host) as wire:
        session = wire.hello()
        envs = [[GATE, {"role": r, "gate": "turn", "timeout_s": 0.5}] for r in ("wait", "open")]
        wire.request(Command.MAKE, {"envs": envs}, session=session).ok()
        wire.request(Command.RESET, {"seeds": [0, 1]}, session=session).ok()
        send(wire, session, Command.STEP, step([0]), 100)
        send(wire, session, Command.STEP, step([1]), 101)
        replies = [wire.receive(), wire.receive()]
        assert [r.request_id for r in replies] == [100, 101]
        assert dict(replies[0].ok()["infos"])[0] == {"opened": False}


def test_a_request_for_a_busy_env_is_refused(host):
    """While env 0's step is under way, a request naming env 0 (or every env) is refused and
    runs nothing; one for other envs, and MAKE with add, run."""
    with Wire(host) as wire:
        session = wire.hello()
        make(wire, session, "busy")
        send(wire, session, Command.STEP, step([0]), 100)
        for request_id, (command, body) in enumerate(
            [
                (Command.STEP, step([2, 0])),
                (Command.RESET, {"seeds": [None], "env_ids": [0]}),
                (Command.CALL, {"name": "role", "env_ids": [0]}),
                (Command.GET_STATE, {"env_ids": [0]}),
                (Command.RESET, {"seeds": [None, None, None]}),
            ],
            start=101,
        ):
            reply = wire.request(command, body, session=session, request_id=request_id)
            assert "under way" in reply.error("ProtocolError")["message"]
        body = {"name": "role", "env_ids": [2]}
        called = wire.request(Command.CALL, body, session=session, request_id=110)
        assert called.ok() == ["wait"]
        add = {"envs": [[GATE, {"gate": "busy"}]], "add": True, "autoreset_mode": "Disabled"}
        made = wire.request(Command.MAKE, add, session=session, request_id=111)
        assert made.ok()["first_env"] == 3
        send(wire, session, Command.STEP, step([1]), 200)  # opens the gate
        ids = {wire.receive().request_id, wire.receive().request_id}
        assert ids == {100, 200}
        wire.request(Command.STEP, step([0]), session=session, request_id=201).ok()  # free


def test_a_retry_of_a_request_under_way_gets_its_reply(host):
    """A request sent again (the same id) while it runs is not run twice: its reply comes
    once for each copy, once it is ready."""
    with Wire(host) as wire:
        session = wire.hello()
        make(wire, session, "retry")
        send(wire, session, Command.STEP, step([0]), 100)
        send(wire, session, Command.STEP, step([0]), 100)  # the retry
        send(wire, session, Command.STEP, step([1]), 101)
        replies = [wire.receive() for _ in range(3)]
        assert sorted(r.request_id for r in replies) == [100, 100, 101]
        bodies = [r.ok() for r in replies if r.request_id == 100]
        assert bodies[0]["rewards"] == bodies[1]["rewards"] == [1.0]
        again = wire.request(Command.STEP, step([1]), session=session, request_id=102)
        again.ok()  # free: its step ran once


def test_closing_the_session_waits_for_its_requests(host):
    """CLOSE while a step is under way: the step finishes and is answered, then the CLOSE."""
    with Wire(host) as wire:
        session = wire.hello()
        make(wire, session, "close")
        send(wire, session, Command.STEP, step([1]), 100)  # opens: quick
        send(wire, session, Command.STEP, step([0]), 101)  # the gate is open: quick too
        send(wire, session, Command.CLOSE, None, 102)
        ids = sorted(wire.receive().request_id for _ in range(3))
        assert ids == [100, 101, 102]
        reset = wire.request(Command.RESET, {"seeds": [0]}, session=session, request_id=103)
        reset.error("UnknownSessionError")
