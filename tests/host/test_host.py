"""The host keeps serving whatever arrives: malformed messages, unknown commands, foreign
protocol versions, requests for unknown sessions; and it shuts down cleanly on signals."""

from __future__ import annotations

import signal

import msgpack
import numpy as np
import pytest
import zmq

from envserver import client
from envserver.errors import ProtocolVersionError
from envserver.testing import start_host
from envserver.wire import messages
from envserver.wire.messages import PROTOCOL_VERSION, Command, Status, decode_reply, encode_request

TIMEOUT_MS = 30_000


@pytest.fixture
def raw(plain_hosts):
    """A bare DEALER socket on a plain host, and a helper to send frames and read the reply."""
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(plain_hosts[0])

    def ask(frames):
        socket.send_multipart(frames)
        assert socket.poll(TIMEOUT_MS), "the host did not answer"
        return decode_reply(socket.recv_multipart(), allow_pickle=False)

    yield ask, socket
    socket.close()
    context.term()


def envelope(*items):
    return msgpack.packb(list(items))


@pytest.mark.parametrize(
    ("frames", "fragment"),
    [
        ([envelope(PROTOCOL_VERSION, 7, 99, None), msgpack.packb({})], "unknown command"),
        ([envelope(PROTOCOL_VERSION, 7, int(Command.STEP), b"x" * 16), b"\x80"], "no session"),
        ([envelope(PROTOCOL_VERSION, 7, int(Command.PING), None), b"\xc1"], "malformed"),
        ([envelope(PROTOCOL_VERSION, 7, int(Command.STEP)), msgpack.packb({})], "envelope"),
        ([envelope(PROTOCOL_VERSION, 7, int(Command.PING), None), b"\x92\x01"], "malformed"),
        ([envelope(PROTOCOL_VERSION, 7, int(Command.HELLO), 5), msgpack.packb({})], "session"),
        ([b"\xff\xfe garbage", b"more garbage"], "envelope"),
        ([envelope(PROTOCOL_VERSION, 7, int(Command.HELLO), None)], "at least 2 frames"),
    ],
    ids=[
        "unknown-command",
        "no-session",
        "invalid-body",
        "short-envelope",
        "truncated-body",
        "bad-session",
        "garbage",
        "one-frame",
    ],
)
def test_malformed_requests_get_error_replies(raw, frames, fragment):
    ask, _ = raw
    reply = ask(frames)
    assert reply.status == Status.ERROR
    assert fragment in reply.body["message"]
    assert reply.request_id in (7, None)
    assert ask(encode_request(8, Command.PING, None, {}, allow_pickle=False)).status == Status.OK


def test_foreign_protocol_version_gets_a_clear_error(raw):
    ask, _ = raw
    reply = ask([envelope(PROTOCOL_VERSION + 41, 3, int(Command.HELLO), None), b"\x80"])
    assert reply.status == Status.ERROR
    assert reply.request_id == 3
    assert reply.body["type"] == "ProtocolVersionError"
    assert str(PROTOCOL_VERSION + 41) in reply.body["message"]


def test_client_with_another_protocol_version_fails_clearly(plain_hosts, monkeypatch):
    monkeypatch.setattr(messages, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    with pytest.raises(ProtocolVersionError, match="protocol version mismatch"):
        client.make_vec("CartPole-v1", num_envs=1, hosts=plain_hosts[:1])


def test_unknown_session_is_refused(raw):
    ask, _ = raw
    reply = ask(
        encode_request(4, Command.STEP, b"\x00" * 16, {"actions": np.zeros(1)}, allow_pickle=False)
    )
    assert reply.status == Status.ERROR
    assert reply.body["type"] == "UnknownSessionError"


def test_pickle_sent_to_a_plain_host_is_refused(raw, tmp_path):
    ask, _ = raw
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    hello = ask(encode_request(1, Command.HELLO, None, {"client": "t"}, allow_pickle=False))
    session = hello.body["session"]
    frames = encode_request(2, Command.MAKE, session, {"factories": [Exploit()]}, allow_pickle=True)
    reply = ask(frames)
    assert reply.status == Status.ERROR
    assert reply.body["type"] == "PickleNotAllowedError"
    assert "--allow-pickle" in reply.body["message"]
    assert not marker.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_close_envs_and_exit_zero(tmp_path, sig):
    host = start_host(tmp_path)
    envs = client.make_vec("CartPole-v1", num_envs=2, hosts=[host.endpoint])
    envs.reset(seed=0)
    assert host.stop(sig) == 0
    log = host.log_text()
    assert "closed" in log
    envs.close()  # the host is gone: close() must still return (bounded)


def test_host_checks_the_action_count_before_stepping(raw):
    ask, _ = raw
    session = ask(encode_request(1, Command.HELLO, None, {}, allow_pickle=False)).body["session"]

    def request(request_id, command, body):
        return ask(encode_request(request_id, command, session, body, allow_pickle=False))

    made = request(2, Command.MAKE, {"env_id": "CartPole-v1", "kwargs": {}, "num_envs": 2})
    assert made.status == Status.OK, made.body
    assert request(3, Command.RESET, {"seeds": [0, 1]}).status == Status.OK
    for wrong in (np.zeros(3, dtype=np.int64), np.zeros(1, dtype=np.int64)):
        reply = request(4, Command.STEP, {"actions": wrong})
        assert reply.status == Status.ERROR
        assert reply.body["type"] == "ValueError"
    assert request(5, Command.CALL, {"name": "np_random_seed"}).body == [0, 1]
    stepped = request(6, Command.STEP, {"actions": np.zeros(2, dtype=np.int64)})
    assert stepped.status == Status.OK
    assert stepped.body["obs"].shape == (2, 4)
    assert request(7, Command.CLOSE, None).status == Status.OK
    assert request(8, Command.STEP, {"actions": np.zeros(2)}).body["type"] == "UnknownSessionError"


def test_call_set_attr_and_wrappers_on_some_envs(raw):
    ask, _ = raw
    session = ask(encode_request(1, Command.HELLO, None, {}, allow_pickle=False)).body["session"]

    ids = iter(range(2, 100))  # a new id each: a repeated id is answered from the host's cache

    def request(command, body):
        return ask(encode_request(next(ids), command, session, body, allow_pickle=False))

    made = request(Command.MAKE, {"env_id": "CartPole-v1", "kwargs": {}, "num_envs": 3})
    assert made.status == Status.OK, made.body
    assert request(Command.RESET, {"seeds": [0, 1, 2]}).status == Status.OK
    set_reply = request(Command.SET_ATTR, {"name": "tag", "values": ["c", "a"], "env_ids": [2, 0]})
    assert set_reply.status == Status.OK, set_reply.body
    assert request(Command.CALL, {"name": "tag", "env_ids": [0, 2]}).body == ["a", "c"]
    assert request(Command.CALL, {"name": "np_random_seed", "env_ids": [1]}).body == [1]
    missing = request(Command.CALL, {"name": "tag", "env_ids": [1]})
    assert missing.body["type"] == "AttributeError" and missing.body["env_index"] == 1
    chains = request(Command.WRAPPERS, {"env_ids": [1]}).body
    assert len(chains) == 1 and chains[0][0][:2] == [
        "gymnasium.wrappers.common.TimeLimit",
        "gymnasium.core.Wrapper",
    ]
    assert len(request(Command.WRAPPERS, {}).body) == 3
    for body in ({"env_ids": [3]}, {"env_ids": [0, 0]}, {"env_ids": []}, {"env_ids": "0"}):
        reply = request(Command.WRAPPERS, body)
        assert reply.status == Status.ERROR and reply.body["type"] == "ProtocolError"
    wrong = request(Command.SET_ATTR, {"name": "tag", "values": [1, 2, 3], "env_ids": [0]})
    assert wrong.body["type"] == "ValueError"


def test_bad_first_resets_are_refused_before_any_env_is_made(raw):
    ask, _ = raw
    hello = ask(
        encode_request(1, Command.HELLO, None, {"client": "t", "pickle": False}, allow_pickle=False)
    )
    session = hello.body["session"]
    for request_id, first_resets in enumerate(([[1, None]], [[1.5, None], [None, None]]), 2):
        reply = ask(
            encode_request(
                request_id,
                Command.MAKE,
                session,
                {
                    "env_id": "CartPole-v1",
                    "kwargs": {},
                    "num_envs": 2,
                    "first_resets": first_resets,
                },
                allow_pickle=False,
            )
        )
        assert reply.status == Status.ERROR and reply.body["type"] == "ProtocolError"
    made = ask(
        encode_request(
            9,
            Command.MAKE,
            session,
            {"env_id": "CartPole-v1", "kwargs": {}, "num_envs": 2, "first_resets": [[3, None]] * 2},
            allow_pickle=False,
        )
    )
    assert made.status == Status.OK  # the session had no envs left behind by the refusals
    ask(encode_request(10, Command.CLOSE, session, None, allow_pickle=False))
