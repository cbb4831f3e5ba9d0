"""The typed bodies: what a client builds is what a host reads back, key for key and default for
default; what a host sends, a client reads back to the same bytes; a reply that does not fit its
command is refused; and a request with several defects is refused for the one the host names
first."""

from __future__ import annotations

import itertools
import tempfile
from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from envserver.errors import EnvNotAllowedError, ProtocolError
from envserver.host.loop import EnvHost, HostConfig
from envserver.wire import codec
from envserver.wire.bodies import Call, Hello, Make, Reset, SetAttr, Step, Wrappers
from envserver.wire.messages import Command, decode_reply, encode_request
from envserver.wire.replies import (
    HeartbeatReply,
    HelloReply,
    HostInfo,
    MakeReply,
    ResetReply,
    StepReply,
)


def two() -> int:
    return 2


def no_envs() -> int:
    raise ProtocolError("this session has no envs yet: send MAKE first")


@pytest.mark.parametrize(
    ("body", "wire"),
    [
        (Hello("me", True, True), {"client": "me", "pickle": True, "said": True}),
        (
            Make(AutoresetMode.NEXT_STEP, 2, "CartPole-v1"),
            {"autoreset_mode": "NextStep", "env_id": "CartPole-v1", "kwargs": {}, "num_envs": 2},
        ),
        (
            Make(AutoresetMode.SAME_STEP, 2, "CartPole-v1", {"a": 1}, env_threads=2,
                 retry_window=3, autoreset_pending=True, first_resets=((1, None), (None, {})),
                 obs_slab="envserver-slab-1-0123456789abcdef"),
            {"autoreset_mode": "SameStep", "env_threads": 2, "env_id": "CartPole-v1",
             "kwargs": {"a": 1}, "num_envs": 2, "retry_window": 3, "autoreset_pending": True,
             "first_resets": [[1, None], [None, {}]],
             "obs_slab": "envserver-slab-1-0123456789abcdef"},
        ),
        (
            Make(AutoresetMode.NEXT_STEP, 2, "CartPole-v1", retry_window=3,
                 channel="envserver-chan-1-0123456789abcdef",
                 more_channels=("envserver-chan-1-00000000000000aa",)),
            {"autoreset_mode": "NextStep", "env_id": "CartPole-v1", "kwargs": {}, "num_envs": 2,
             "retry_window": 3, "channel": "envserver-chan-1-0123456789abcdef",
             "more_channels": ["envserver-chan-1-00000000000000aa"]},
        ),
        (
            Make(AutoresetMode.NEXT_STEP, 1, "Cart.agents", kind="parallel"),
            {"autoreset_mode": "NextStep", "kind": "parallel", "env_id": "Cart.agents",
             "kwargs": {}, "num_envs": 1},
        ),
        (Reset([1, None]), {"seeds": [1, None], "options": None}),
        (Reset([3], {"x": 1}, [1]), {"seeds": [3], "options": {"x": 1}, "env_ids": [1]}),
        (Step([0, 1]), {"actions": [0, 1]}),
        (Step([1], [1]), {"actions": [1], "env_ids": [1]}),
        (Call("gravity"), {"name": "gravity", "args": [], "kwargs": {}}),
        (Call("f", [1], {"k": 2}, [0]),
         {"name": "f", "args": [1], "kwargs": {"k": 2}, "env_ids": [0]}),
        (SetAttr("g", [1.0, 2.0]), {"name": "g", "values": [1.0, 2.0]}),
        (SetAttr("g", [1.0], [1], True),
         {"name": "g", "values": [1.0], "outermost": True, "env_ids": [1]}),
        (Wrappers(), {}),
        (Wrappers([1, 0]), {"env_ids": [1, 0]}),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, dict) else "",
)  # fmt: skip
def test_a_request_body_is_read_back_as_it_was_built(body: Any, wire: dict[str, Any]) -> None:
    assert body.to_wire() == wire
    assert list(body.to_wire()) == list(wire)  # the keys in the client's order
    if isinstance(body, Hello):
        assert Hello.from_wire(wire) == body
    elif isinstance(body, Make):
        assert Make.from_wire(wire, ["Cart*"]) == body
    else:
        assert type(body).from_wire(wire, two) == body


@pytest.mark.parametrize(
    ("parse", "message"),
    [
        (lambda: Call.from_wire({"name": 5}, no_envs), "CALL needs a name string"),
        (lambda: Call.from_wire({"name": "g"}, no_envs), "send MAKE first"),
        (lambda: SetAttr.from_wire({"name": "g", "values": 1}, no_envs), "SET_ATTR needs"),
        (lambda: Step.from_wire({}, no_envs), "send MAKE first"),
        (lambda: Step.from_wire({}, two), "STEP needs actions"),
        (lambda: Reset.from_wire({"seeds": [1]}, no_envs), "send MAKE first"),
        (lambda: Reset.from_wire({"seeds": [1], "env_ids": [2]}, two), "env_ids must be"),
        (lambda: Wrappers.from_wire({"env_ids": [True]}, two), "env_ids must be"),
        (lambda: Make.from_wire({"env_id": "X-v0", "num_envs": 1, "env_threads": 0}, ["C*"]),
         "does not serve 'X-v0'"),
        (lambda: Make.from_wire({"env_id": "C-v0", "num_envs": 1, "env_threads": 0}, ["C*"]),
         "env_threads must be"),
        (lambda: Make.from_wire({"factories": [1]}, ["*"]), "every factory must be callable"),
        (lambda: Make.from_wire({"kind": "aec", "env_id": "C", "num_envs": 1}, ["*"]),
         "kind must be one of"),
        (lambda: Make.from_wire({"kind": "parallel", "env_id": "X.y", "num_envs": 1}, ["C*"]),
         "does not serve 'X.y'"),
    ],
)  # fmt: skip
def test_a_request_with_defects_is_refused_for_the_first_the_host_checks(parse, message) -> None:
    with pytest.raises((ProtocolError, EnvNotAllowedError), match=message):
        parse()


def test_what_a_host_sends_reads_back_to_the_same_bytes() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        host = EnvHost(HostConfig(bind=f"ipc://{tmp}/h.sock"))
        try:
            ids = itertools.count(1)

            def ask(command: Command, body: Any, session: bytes | None = None) -> list[Any]:
                request = encode_request(next(ids), command, session, body, allow_pickle=False)
                reply = host.handle(request)
                assert reply is not None and decode_reply(reply, allow_pickle=False).status == 0
                return reply

            def same(kind: Any, reply: list[Any]) -> Any:
                body = decode_reply(reply, allow_pickle=False).body
                typed = kind.from_wire(body)
                assert [bytes(f) for f in codec.encode(typed.to_wire())] == [
                    bytes(memoryview(f)) for f in reply[1:]
                ]
                return typed

            same(HostInfo, ask(Command.PING, {}))
            hello = same(HelloReply, ask(Command.HELLO, Hello("t").to_wire()))
            assert hello.info.sessions == 1
            session = hello.session
            assert same(HeartbeatReply, ask(Command.HEARTBEAT, None, session)).env_threads is None
            make = Make(AutoresetMode.NEXT_STEP, 2, "CartPole-v1").to_wire()
            made = same(MakeReply, ask(Command.MAKE, make, session))
            assert not made.slab_offered and made.step_layout is not None
            same(ResetReply, ask(Command.RESET, Reset([1, 2]).to_wire(), session))
            step = Step(np.zeros(2, np.int64)).to_wire()
            assert same(StepReply, ask(Command.STEP, step, session)).rewards == [1.0, 1.0]
            assert same(HeartbeatReply, ask(Command.HEARTBEAT, None, session)).env_threads == 1
        finally:
            host.close()


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (HostInfo, []),
        (HostInfo, {"name": "h"}),
        (HelloReply, {"name": "h"}),
        (HeartbeatReply, {"session_lease_s": -1.0}),
        (HeartbeatReply, {"session_lease_s": 30.0, "env_threads": 0}),
        (HeartbeatReply, {"session_lease_s": 30.0, "draining_s": -2.0}),
        (HeartbeatReply, {"session_lease_s": 30.0, "draining_s": "soon"}),
        (MakeReply, {"observation_spaces": [], "action_spaces": []}),
        (ResetReply, {"obs": None}),
        (StepReply, {"obs": None, "rewards": [], "terminations": [], "truncations": []}),
    ],
)
def test_a_reply_that_does_not_fit_its_command_is_refused(kind: Any, body: Any) -> None:
    with pytest.raises(ProtocolError):
        kind.from_wire(body)


_CHANNEL = "envserver-chan-1-0123456789abcdef"
_MORE = "envserver-chan-1-00000000000000aa"


@pytest.mark.parametrize(
    "more",
    [
        {"retry_window": 2, "channel": _CHANNEL, "more_channels": _MORE},  # not a list
        {"retry_window": 2, "channel": _CHANNEL, "more_channels": [_MORE, _MORE]},  # too many
        {"retry_window": 1, "channel": _CHANNEL, "more_channels": [_MORE]},  # one under way
        {"retry_window": 2, "more_channels": [_MORE]},  # beside no channel
        {"retry_window": 2, "channel": _CHANNEL, "more_channels": ["/dev/shm/x"]},  # a path
        {"retry_window": 2, "add": True, "more_channels": []},  # a session that grows
    ],
)
def test_a_make_whose_more_channels_do_not_fit_is_refused(more: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        Make.from_wire({"env_id": "CartPole-v1", "num_envs": 1, **more}, ["*"])


def test_a_make_reply_says_the_size_of_each_more_channel_taken() -> None:
    base = {"observation_spaces": [], "action_spaces": [], "metadata": {}, "render_mode": None,
            "env_threads": 1, "env_threads_auto": True, "step_layout": None}  # fmt: skip
    reply = MakeReply.from_wire({**base, "channel": 4096, "more_channels": [4096, None]})
    assert (reply.channel, reply.more_channels) == (4096, (4096, None))
    assert MakeReply.from_wire(reply.to_wire()) == reply
    assert MakeReply.from_wire({**base, "channel": 4096}).more_channels == ()
    for bad in ("4096", [4096.0], [True, "x"]):
        with pytest.raises(ProtocolError, match="more_channels"):
            MakeReply.from_wire({**base, "channel": 4096, "more_channels": bad})


def test_a_heartbeat_reply_says_a_drain() -> None:
    reply = HeartbeatReply(30.0, 2, 12.5)
    assert HeartbeatReply.from_wire(reply.to_wire()) == reply
    assert "draining_s" not in HeartbeatReply(30.0, 2).to_wire()
    assert HeartbeatReply.from_wire({"session_lease_s": 30.0}).draining_s is None
