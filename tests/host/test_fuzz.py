"""A running host under hostile input: every well-framed request gets an error reply with a
clear message, nothing is unpickled, memory stays bounded, the host never dies, and a legitimate
client on the same host keeps getting results identical to SyncVectorEnv throughout."""

from __future__ import annotations

import itertools
import os
import pickle
import tempfile
from pathlib import Path

import gymnasium as gym
import msgpack
import numpy as np
import pytest
import zmq
from helpers import assert_same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envserver import client
from envserver.testing import start_host
from envserver.wire.channel import MOST_CHANNELS, ChannelOffer
from envserver.wire.codec import Ext
from envserver.wire.messages import PROTOCOL_VERSION, Command, Status, decode_reply, encode_request

MAX_MESSAGE_BYTES = 1 << 20
MARKER = Path(tempfile.gettempdir()) / f"envserver-fuzz-unpickled-{os.getpid()}"  # per run
REPLY_TIMEOUT_MS = 30_000


class Unpickled:
    """Pickles into a call that would create MARKER: proof of unpickling, were it to happen."""

    def __reduce__(self):
        return (open, (str(MARKER), "w"))


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    """A host, a raw fuzzing socket, and a legitimate client with its oracle."""
    MARKER.unlink(missing_ok=True)
    host = start_host(
        tmp_path_factory.mktemp("fuzz"),
        "--max-message-bytes",
        str(MAX_MESSAGE_BYTES),
        "--log-level",
        "ERROR",
    )
    context = zmq.Context()
    raw = context.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(host.endpoint)
    legit = client.make_vec("CartPole-v1", num_envs=2, hosts=[host.endpoint])
    oracle = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    assert_same(legit.reset(seed=5), oracle.reset(seed=5))
    state = {"t": 0}

    def legit_step():
        state["t"] += 1
        actions = np.array([state["t"] % 2, (state["t"] // 3) % 2])
        assert_same(legit.step(actions), oracle.step(actions))

    yield host, raw, legit_step
    legit.close()
    oracle.close()
    raw.close()
    context.term()
    assert host.process.poll() is None, "the host died"
    status = Path(f"/proc/{host.process.pid}/status").read_text()
    peak_kb = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
    assert peak_kb < 1_000_000, f"host peak RSS {peak_kb} kB: an unbounded allocation"
    host.stop()
    assert not MARKER.exists(), "the host unpickled peer data"


def ask(raw, frames):
    raw.send_multipart(frames)
    assert raw.poll(REPLY_TIMEOUT_MS), "no reply: the host dropped a framed request or hung"
    return decode_reply(raw.recv_multipart(), allow_pickle=False)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=40)
)


def containers(inner):
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


plain = st.recursive(scalars, containers, max_leaves=12)
dtypes = st.sampled_from(
    ["|O8", "O", "V8", "(1000000000,)i4", "<f8", "|u1", "<M8[ns]", "[('a','<i4')]", "<U0", "x", ""]
)
shapes = st.lists(st.integers(-5, 2**40), max_size=40)
array_ext = st.builds(
    lambda dtype, shape, data: msgpack.ExtType(Ext.ARRAY, msgpack.packb([dtype, shape, data])),
    dtypes,
    shapes,
    st.binary(max_size=64) | st.integers(-3, 8),
)
other_ext = st.builds(
    lambda code, payload: msgpack.ExtType(code, payload),
    st.integers(0, 127),
    st.binary(max_size=64),
)
pickled = st.just(msgpack.ExtType(Ext.PICKLE, pickle.dumps(Unpickled())))
hostile_value = st.recursive(plain | array_ext | other_ext | pickled, containers, max_leaves=6)
commands = st.sampled_from([int(c) for c in Command]) | st.integers(-5, 300)
versions = st.just(PROTOCOL_VERSION) | st.integers(-3, 10) | st.text(max_size=3) | st.none()
sessions = (
    st.none() | st.binary(max_size=20) | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5)
)


@st.composite
def framed_requests(draw):
    request_id = draw(st.integers(0, 2**40) | plain)
    envelope = [draw(versions), request_id, draw(commands), draw(sessions)]
    if draw(st.booleans()):
        envelope = envelope[: draw(st.integers(0, 5))]
    body = msgpack.packb(draw(hostile_value), use_bin_type=True)
    if draw(st.booleans()):
        body = body[: draw(st.integers(0, len(body)))]  # truncated msgpack
    extra = draw(st.lists(st.binary(max_size=64), max_size=3))
    return [msgpack.packb(envelope, use_bin_type=True), body, *extra]


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    frames=framed_requests()
    | st.lists(st.binary(max_size=80), min_size=1, max_size=5)
    | st.just([b"x"] * 4097)  # more frames than allowed
)
def test_hostile_requests_get_error_replies(arena, frames):
    _, raw, legit_step = arena
    reply = ask(raw, frames)
    if reply.status == Status.ERROR:
        assert isinstance(reply.body["message"], str) and reply.body["type"]
    else:  # only a request that happens to be valid can succeed
        assert msgpack.unpackb(frames[0])[0] == PROTOCOL_VERSION
    legit_step()


def test_oversized_messages_are_bounded(arena):
    _, raw, legit_step = arena
    # Under the per-frame bound but over the whole-message bound: an error reply.
    chunk = b"x" * (MAX_MESSAGE_BYTES // 2)
    frames = [*encode_request(1, Command.PING, None, {}, allow_pickle=False), chunk, chunk, chunk]
    reply = ask(raw, frames)
    assert reply.body["type"] == "MessageTooLargeError"
    # A single frame over ZMQ_MAXMSGSIZE: libzmq drops the connection, the host lives on.
    raw.send_multipart([b"x" * (MAX_MESSAGE_BYTES + 1)])
    legit_step()
    reply = ask(raw, encode_request(2, Command.PING, None, {}, allow_pickle=False))
    assert reply.status == Status.OK
    legit_step()


#: What a peer may name for a Parallel env: real ones, callables that must never be called,
#: ids that do not exist, and anything else.
parallel_specs = st.sampled_from(
    [
        "envserver.testing.agents",
        "envserver.testing.agents:parallel_env",
        "envserver.testing.agents:ScriptedAgents",
        "os:system",
        "builtins:open",
        "subprocess:run",
        "butterfly/nope-v0",
        "envserver.testing.agents:nope/x-v0",
        ":",
        "",
        "a..b",
    ]
) | st.text(max_size=30)


@given(spec=parallel_specs, kwargs=st.dictionaries(st.text(max_size=8), plain, max_size=3))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_parallel_envs_a_peer_names_are_made_or_refused(arena, spec, kwargs):
    """Only what was made to be called is called: a module's parallel_env or a registry id.

    ``os:system`` and ``builtins:open`` with the marker's path would create the marker.
    """
    _, raw, legit_step = arena
    hello = ask(raw, encode_request(1, Command.HELLO, None, {}, allow_pickle=False))
    session = hello.body["session"]
    calls = {
        "os:system": {"command": f"touch {MARKER}"},
        "builtins:open": {"file": str(MARKER), "mode": "w"},
    }
    kwargs = calls.get(spec, kwargs)
    body = {"kind": "parallel", "env_id": spec, "kwargs": kwargs, "num_envs": 1}
    reply = ask(raw, encode_request(2, Command.MAKE, session, body, allow_pickle=False))
    if reply.status == Status.ERROR:
        assert isinstance(reply.body["message"], str) and reply.body["type"]
    assert not MARKER.exists(), f"the host called {spec!r}"
    ask(raw, encode_request(3, Command.CLOSE, session, None, allow_pickle=False))
    legit_step()


#: Channel names a MAKE may carry: ``"real"`` stands for a channel this test offers, made anew.
channel_names = (
    st.just("real")
    | st.sampled_from(["envserver-chan-1-0123456789abcdef", "../../etc/passwd", "", "x" * 300])
    | plain
)


@given(
    channel=channel_names,
    more=st.lists(channel_names, max_size=MOST_CHANNELS + 3) | plain,
    window=st.integers(-1, MOST_CHANNELS + 4) | plain,
)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_makes_offering_channels_a_peer_chose_are_made_or_refused(arena, channel, more, window):
    """MAKE with hostile ``channel``/``more_channels``/``retry_window``: an error or a session.

    A session that was made steps on (its channels taken or not), and the legit client's steps
    stay exact; the host lives on (the fixture checks that, and its memory, at the end).
    """
    _, raw, legit_step = arena
    offers: list[ChannelOffer] = []

    def named(value):
        if value != "real":
            return value
        offer = ChannelOffer.make()
        assert offer is not None
        offers.append(offer)
        return offer.name

    try:
        hello = ask(raw, encode_request(next(IDS), Command.HELLO, None, {}, allow_pickle=False))
        session = hello.body["session"]
        body = {"env_id": "CartPole-v1", "num_envs": 1, "retry_window": window}
        body["channel"] = named(channel)
        body["more_channels"] = [named(v) for v in more] if isinstance(more, list) else more
        reply = ask(raw, encode_request(next(IDS), Command.MAKE, session, body, allow_pickle=False))
        if reply.status == Status.ERROR:
            assert isinstance(reply.body["message"], str) and reply.body["type"]
        else:
            taken = [reply.body["channel"], *reply.body.get("more_channels", [])]
            assert len(taken) == 1 + len(more)
            assert sum(size is not None for size in taken) <= MOST_CHANNELS
            for command, request in (
                (Command.RESET, {"seeds": [0], "options": None}),
                (Command.STEP, {"actions": np.array([1])}),
            ):
                request = encode_request(next(IDS), command, session, request, allow_pickle=False)
                assert ask(raw, request).status == Status.OK
        ask(raw, encode_request(next(IDS), Command.CLOSE, session, None, allow_pickle=False))
    finally:
        for offer in offers:
            offer.withdraw()
    legit_step()


#: A real snapshot of the fuzzing session's CartPole env, and that session (made at first use).
GOOD_SNAPSHOT: list[bytes] = []
GOOD_SNAPSHOT_SESSION: list[bytes] = []
IDS = itertools.count(100)


def _snapshot_session(raw) -> bytes:
    """Opens a session with one CartPole env on the raw socket; its snapshot after a step."""
    session = ask(raw, encode_request(next(IDS), Command.HELLO, None, {}, allow_pickle=False))
    session = session.body["session"]
    GOOD_SNAPSHOT_SESSION.append(session)
    make = {"env_id": "CartPole-v1", "kwargs": None, "num_envs": 1}
    for command, body in (
        (Command.MAKE, make),
        (Command.RESET, {"seeds": [0], "options": None}),
        (Command.STEP, {"actions": np.array([1])}),
    ):
        assert (
            ask(raw, encode_request(next(IDS), command, session, body, allow_pickle=False)).status
            == Status.OK
        )
    reply = ask(raw, encode_request(next(IDS), Command.GET_STATE, session, {}, allow_pickle=False))
    return reply.body[0]


def _flipped(data: bytes, at: int, byte: int) -> bytes:
    """``data`` with the byte at ``at`` (wrapped around) replaced by ``byte``."""
    at %= len(data)
    return data[:at] + bytes([byte]) + data[at + 1 :]


@given(
    data=st.binary(max_size=200)
    | st.builds(lambda cut: ("cut", cut), st.integers(0, 2000))
    | st.builds(lambda at, byte: ("flip", at, byte), st.integers(0, 2000), st.integers(0, 255))
)
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_hostile_snapshots_get_error_replies(arena, data):
    """SET_STATE with bytes that are not a snapshot: an error naming the env, nothing else."""
    _, raw, legit_step = arena
    if not GOOD_SNAPSHOT:
        GOOD_SNAPSHOT.append(_snapshot_session(raw))
    good, session = GOOD_SNAPSHOT[0], GOOD_SNAPSHOT_SESSION[0]
    if isinstance(data, tuple):  # a real snapshot, cut short or with one byte changed
        data = good[: data[1]] if data[0] == "cut" else _flipped(good, data[1], data[2])
    body = {"states": [data], "env_ids": [0]}
    reply = ask(
        raw, encode_request(next(IDS), Command.SET_STATE, session, body, allow_pickle=False)
    )
    if reply.status == Status.ERROR:
        assert isinstance(reply.body["message"], str) and reply.body["type"]
    assert not MARKER.exists()
    legit_step()
