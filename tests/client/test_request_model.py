"""The client's bookkeeping of requests, against a model, over random interleavings.

A real ``HostConnection`` talks to a scripted host (a ROUTER socket in this process) that
answers requests in order, as a host does, keeps every reply for retries and answers a retried
id from that cache. Hypothesis interleaves: requests sent (general, or STEP_RAW read with the
session's layout), replies given (some twice), receives (some interrupted before or after any
frame, then settled), sends interrupted (the socket renewed), requests abandoned (their late
replies must be dropped), and recoveries (the request sent again, unchanged, on a new
connection to the same session). The model: every reply is taken into the request it answers,
read as what that request was (a raw reply with its layout, a general one with the codec), or
dropped; never one request's reply in another, never a request answered twice, never a decode
error; and every request not abandoned is answered once the host has answered it.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
import zmq
from gymnasium import spaces
from helpers import InterruptingContext
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from envserver.client._transport.connection import HostConnection
from envserver.client._transport.requests import Pending
from envserver.client._transport.session import HostSession
from envserver.client._transport.settings import ConnectionSettings
from envserver.wire.bodies import Step
from envserver.wire.messages import (
    Command,
    Status,
    decode_request,
    encode_raw_reply,
    encode_reply,
)
from envserver.wire.raw import StepLayout
from envserver.wire.replies import StepReply

COUNT = 2  # envs in the block
LAYOUT = StepLayout.of(
    spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64), spaces.Discrete(3)
)
SESSION = b"s" * 16
SETTINGS = ConnectionSettings(
    allow_pickle=False,
    host_timeout_s=60.0,
    connect_timeout_s=60.0,
    request_timeout_s=None,
    curve=None,
    shared_memory=False,
)
_endpoints = itertools.count()


class ScriptedHost:
    """A host that answers in order when told to, and from its cache for a retried id."""

    def __init__(self, context: zmq.Context) -> None:
        self.endpoint = f"inproc://request-model-{next(_endpoints)}"
        self.router = context.socket(zmq.ROUTER)
        self.router.bind(self.endpoint)
        self.queue: list[tuple[bytes, int, list]] = []  # received, not answered yet
        self.cache: dict[int, list] = {}
        self.answered: list[int] = []

    def read(self) -> None:
        while self.router.poll(0):
            identity, *frames = self.router.recv_multipart()
            request = decode_request(frames, allow_pickle=False)
            self.queue.append((identity, request.request_id, frames))

    def answer(self, twice: bool) -> int | None:
        """Answers the oldest request received (from the cache if it was answered before)."""
        self.read()
        if not self.queue:
            return None
        identity, request_id, frames = self.queue.pop(0)
        reply = self.cache.get(request_id)
        if reply is None:
            request = decode_request(frames, allow_pickle=False)
            if request.command is Command.STEP_RAW:
                obs = np.array([[request_id, 0.0], [request_id, 1.0]])
                body = LAYOUT.reply_frames(
                    obs,
                    np.full(COUNT, float(request_id)),
                    np.zeros(COUNT, np.bool_),
                    np.zeros(COUNT, np.bool_),
                    [],
                    allow_pickle=False,
                )
                reply = encode_raw_reply(request_id, body)
            else:
                reply = encode_reply(request_id, Status.OK, {"n": request_id})
            self.cache[request_id] = reply
            self.answered.append(request_id)
        for _ in range(2 if twice else 1):
            self.router.send_multipart([identity, *reply], copy=True)
        return request_id


def value_of(pending: Pending) -> int:
    """What a reply says its request was (the request id, as the scripted host answers)."""
    body = pending.reply.body
    if pending.layout is not None:
        assert isinstance(body, StepReply), body
        np.testing.assert_array_equal(body.obs[:, 1], [0.0, 1.0])
        assert body.rewards[0] == body.obs[0, 0]
        return int(body.obs[0, 0])
    return body["n"]


class RequestBookkeeping(RuleBasedStateMachine):
    """Random interleavings of a connection's requests and replies, checked against a model."""

    def __init__(self) -> None:
        super().__init__()
        self.context = InterruptingContext()
        self.host = ScriptedHost(self.context)
        self.ids = itertools.count(1)
        self.connection = self.connect()
        self.records: list[Pending] = []  # every request sent, in order
        self.abandoned: set[int] = set()
        self.retired: list[Pending] = []  # records of connections given up on

    def connect(self) -> HostConnection:
        connection = HostConnection(
            self.context, self.host.endpoint, SETTINGS, start=0, count=COUNT, ids=self.ids
        )
        connection.hold(HostSession(SESSION, step_layout=LAYOUT))
        return connection

    def teardown(self) -> None:
        try:
            self.settle_all()
        finally:
            self.close()

    def close(self) -> None:
        self.connection.close()
        self.host.router.close(linger=0)
        self.context.term()

    # ------------------------------------------------------------- rules

    @rule(raw=st.booleans())
    def send(self, raw: bool) -> None:
        actions = np.array([1, 2]) if raw else [1, 2]  # a list goes as STEP
        self.records.append(self.connection.requests.send(Command.STEP, Step(actions)))
        assert (self.records[-1].layout is not None) == raw

    @rule(twice=st.booleans())
    def host_answers(self, twice: bool) -> None:
        self.host.answer(twice)

    @rule(
        interrupt=st.none() | st.tuples(st.integers(0, 2), st.booleans()),
    )
    def receive(self, interrupt: tuple[int, bool] | None) -> None:
        self.host.read()
        if interrupt is not None:
            self.context.arm("recv", *interrupt)
            try:
                self.connection.requests.receive()
            except KeyboardInterrupt:
                self.connection.requests.settle()
            self.context.plan = None
        else:
            self.connection.requests.receive()

    @rule(frame=st.integers(0, 2), after=st.booleans(), raw=st.booleans())
    def interrupted_send(self, frame: int, after: bool, raw: bool) -> None:
        actions = np.array([0, 1]) if raw else [0, 1]
        pending = self.connection.requests.prepare(Command.STEP, Step(actions))
        self.records.append(pending)
        self.context.arm("send", frame, after)
        with contextlib.suppress(KeyboardInterrupt):
            self.connection.requests.transmit(pending)
        self.context.plan = None
        self.connection.requests.settle()

    @rule()
    def abandon(self) -> None:
        self.abandoned.update(self.connection.requests.outstanding)
        self.connection.requests.outstanding.clear()  # as HostPool.forget ends each

    @rule()
    def recover(self) -> None:
        """The connection is given up on; its oldest request resent on a new one.

        Nothing if none is under way: a rule, not a precondition, since what is under way
        depends on what the sockets delivered by then, and Hypothesis needs the rules it may
        draw to be the same whenever the same draws came before.
        """
        old = self.connection
        if not old.requests.outstanding:
            return
        oldest = next(iter(old.requests.outstanding.values()))
        self.abandoned.update(i for i in old.requests.outstanding if i != oldest.request_id)
        self.connection = self.connect()
        again = self.connection.requests.transmit(oldest.again())
        self.records.append(again)
        self.retired.append(oldest)
        old.close()

    # ------------------------------------------------------------- the model

    @invariant()
    def replies_are_their_requests(self) -> None:
        assert self.connection.health.failure is None, self.connection.health.failure
        for pending in self.records:
            if pending.reply is not None:
                assert pending.reply.request_id == pending.request_id
                assert value_of(pending) == pending.request_id
        for request_id, pending in self.connection.requests.outstanding.items():
            assert pending.request_id == request_id and pending.reply is None
            assert request_id not in self.abandoned

    def settle_all(self) -> None:
        """Everything the host was asked, answered; every request not given up on, taken."""
        for _ in range(50):
            while self.host.answer(twice=False) is not None:  # all it was asked, in order
                pass
            while self.connection.link.socket.poll(20):
                self.connection.requests.receive()
            if not self.connection.requests.outstanding:
                break
        live = [p for p in self.records if p not in self.retired]
        unanswered = [
            p.request_id for p in live if p.reply is None and p.request_id not in self.abandoned
        ]
        assert unanswered == []


TestRequestBookkeeping = RequestBookkeeping.TestCase
TestRequestBookkeeping.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("raw", [False, True], ids=["general", "raw"])
@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("frame", range(3))
def test_a_reply_lost_to_an_interrupted_receive_is_asked_again(frame, after, raw) -> None:
    machine = RequestBookkeeping()
    try:
        machine.send(raw)
        machine.send(raw)
        machine.host_answers(twice=False)
        machine.host_answers(twice=False)
        machine.receive((frame, after))
        machine.replies_are_their_requests()
        machine.settle_all()
        assert all(p.reply is not None for p in machine.records)
    finally:
        machine.close()


def test_every_request_is_answered_once_the_host_has() -> None:
    """A fixed run to its end: a mix of everything, then everything answered and taken."""
    machine = RequestBookkeeping()
    try:
        for step in range(40):
            if step % 5 == 0:
                machine.interrupted_send(step % 3, bool(step % 2), bool(step % 4))
            else:
                machine.send(raw=bool(step % 2))
            if step % 3 == 0:
                machine.host_answers(twice=bool(step % 2))
            machine.receive((step % 5, bool(step % 3)) if step % 4 == 0 else None)
            if step == 17:
                machine.recover()
            if step == 29:
                machine.abandon()
            machine.replies_are_their_requests()
        machine.settle_all()
        machine.replies_are_their_requests()
    finally:
        machine.close()
