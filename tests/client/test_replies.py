"""Replies read right: every reply taken into its own request, whatever interrupts the client.

- A frozen host's late reply to a step sent raw, arriving while recovery resumes its session,
  is read as that step's (it used to be decoded as a STEP reply and crash the recovery).
- A message is received whole or not at all, and sent whole or on a new socket, whatever
  exception interrupts it: pyzmq acts on a pending signal right before and right after it hands
  a frame to or takes one from libzmq, so a ``KeyboardInterrupt`` can leave a frame taken (and
  lost) or queued. Sockets that raise at every such point stand in for the signal.
- An interrupted lockstep call stays pending, as ``AsyncVectorEnv``'s does: ``step`` then raises
  ``AlreadyPendingCallError``, and ``step_wait`` returns the interrupted step's results, exactly
  SyncVectorEnv's; and so on for steps interrupted by real signals, at random, many times.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import zmq
from gymnasium.error import AlreadyPendingCallError
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from helpers import Interrupting, InterruptingContext, assert_same, channel_messages

import envserver
from envserver import client
from envserver.testing import start_host
from envserver.wire import channel as channel_module
from envserver.wire.frames import MessageReader, MessageWriter

EPISODIC = "envserver.testing:envserver/Episodic-v0"


# ---------------------------------------------------------------- a late raw reply in recovery


class WakeOnRecovery(logging.Handler):
    """Continues a stopped host the moment the client starts recovering it."""

    def __init__(self, process) -> None:
        super().__init__()
        self.process = process
        self.woken = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.woken and "recovering" in record.getMessage():
            self.woken = True
            self.process.send_signal(signal.SIGCONT)


def test_a_frozen_hosts_late_raw_reply_in_recovery_is_read_as_its_steps(tmp_path):
    """The host freezes with a raw step queued; the client gives up on the connection and
    resumes the session on a new one, resending the step; the host wakes, runs the first copy
    and answers the second from its cache, as STEP_RAW: the reply is read as the step's own."""
    host = start_host(tmp_path, bind="tcp://127.0.0.1:*")
    kwargs = {"terminate_prob": 0.0, "max_steps": 1000}
    envs = client.RemoteVectorEnv(
        env_id=EPISODIC,
        env_kwargs=kwargs,
        num_envs=3,
        hosts=[host.endpoint],
        on_host_failure="restart",
        host_timeout_s=1.0,
    )
    oracle = SyncVectorEnv([lambda: gym.make(EPISODIC, **kwargs)] * 3)
    wake = WakeOnRecovery(host.process)
    logging.getLogger("envserver.client").addHandler(wake)
    try:
        assert_same(envs.reset(seed=0), oracle.reset(seed=0))
        for t in range(6):
            actions = np.full(3, t % 3)
            if t == 3:
                host.process.send_signal(signal.SIGSTOP)  # the step goes to a frozen host
            assert_same(envs.step(actions), oracle.step(actions), f"step {t}")
        assert wake.woken and envs.host_restarts == 0  # resumed, not made anew
        assert envs.get_attr("_t") == (6, 6, 6)  # each step ran once
    finally:
        logging.getLogger("envserver.client").removeHandler(wake)
        host.process.send_signal(signal.SIGCONT)
        envs.close()
        oracle.close()
        host.stop()


# ---------------------------------------------------------------- whole messages


@pytest.fixture
def pair() -> Iterator[tuple[Interrupting, zmq.Socket, InterruptingContext]]:
    context = InterruptingContext()
    ours = context.socket(zmq.DEALER)
    theirs = context.socket(zmq.ROUTER)
    theirs.bind("inproc://replies")
    ours.connect("inproc://replies")
    yield ours, theirs, context
    ours.close(linger=0)
    theirs.close(linger=0)
    context.term()


def replies(theirs: zmq.Socket, identity: bytes, count: int) -> list[list[bytes]]:
    """``count`` replies of four frames (an envelope with the id, three parts), sent."""
    sent = []
    for request_id in range(1, count + 1):
        message = [envserver.wire.codec.pack_plain([6, request_id, 0, 0])]
        message += [f"{request_id}-{part}".encode() for part in range(3)]
        theirs.send_multipart([identity, *message])
        sent.append(message)
    return sent


def identity_of(ours: zmq.Socket, theirs: zmq.Socket) -> bytes:
    ours.send(b"hello")
    identity, _ = theirs.recv_multipart()
    return identity


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("frame", range(4))
def test_a_receive_interrupted_anywhere_never_leaves_half_a_message(pair, frame, after):
    ours, theirs, context = pair
    sent = replies(theirs, identity_of(ours, theirs), 3)
    reader = MessageReader(ours)
    while not ours.poll(1000):
        pass
    context.arm("recv", frame, after)
    with pytest.raises(KeyboardInterrupt):
        reader.next()
    got = []
    for _ in range(3):
        frames = reader.next(zmq.NOBLOCK)
        if frames is None:
            break
        got.append([f.bytes for f in frames])
        reader.release()
    if frame == 0 and not after:  # nothing was taken: the message comes whole
        assert got == sent and reader.lost == []
    else:  # a frame was taken and lost, or the message cut: dropped whole, its id said
        assert got == sent[1:]
        assert reader.lost == ([1] if frame > 0 else [None])


def test_a_message_taken_whole_is_kept_until_released(pair):
    ours, theirs, _ = pair
    sent = replies(theirs, identity_of(ours, theirs), 2)
    reader = MessageReader(ours)
    while not ours.poll(1000):
        pass
    first = reader.next()
    assert reader.next() is first  # not released: an interrupted caller gets it again
    reader.release()
    assert [f.bytes for f in reader.next()] == sent[1]


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("frame", range(4))
def test_a_send_interrupted_anywhere_leaves_the_writer_cut_and_sends_no_half(pair, frame, after):
    """pyzmq may raise out of a send before or after the frame was queued: the writer says
    the socket is cut (its owner replaces it), sends nothing more on it, and the peer never
    gets a message made of parts of two."""
    ours, theirs, context = pair
    identity = identity_of(ours, theirs)
    writer = MessageWriter(ours)
    message = [b"a", b"b", b"c", b"d"]
    context.arm("send", frame, after)
    with pytest.raises(KeyboardInterrupt):
        writer.send(message)
    assert writer.cut
    writer.send([b"e", b"f"])  # kept, not sent: it would complete the half message
    assert not writer.idle
    if frame == 3 and after:  # the last frame went: the message is whole, and alone
        assert theirs.recv_multipart() == [identity, *message]
    assert not theirs.poll(200)


def test_a_writer_sends_whole_messages_in_order(pair):
    ours, theirs, _ = pair
    identity = identity_of(ours, theirs)
    writer = MessageWriter(ours)
    for message in ([b"a", b"b"], [b"c"], [b"d", bytes(1 << 17), b"e"]):
        writer.send(message)
        assert theirs.recv_multipart() == [identity, *message]
    assert writer.idle and not writer.cut


# ---------------------------------------------------------------- interrupted calls


@pytest.fixture(params=["local", "tcp"])
def hosts_of(request, tmp_path) -> Iterator[list[str] | None]:
    if request.param == "local":
        yield None
        return
    hosts = [start_host(tmp_path, bind="tcp://127.0.0.1:*") for _ in range(2)]
    yield [host.endpoint for host in hosts]
    for host in hosts:
        host.stop()


POINTS = [
    ("recv", 0, False),
    ("recv", 0, True),
    ("recv", 1, True),
    ("recv", 2, False),
    ("recv", 2, True),
    ("send", 0, False),
    ("send", 0, True),
    ("send", 1, True),
]


def steps_interrupted(envs, oracle, rng, arm, sent=lambda actions: actions) -> int:
    """30 steps of 4 envs against ``oracle``; ``arm()`` before steps 5, 15 and 25 makes a later
    point of a step raise ``KeyboardInterrupt``, and the step stays pending, its results the
    oracle's.

    A step that never reaches the armed point (a reply already there, so no poll) is an
    ordinary step: the point stays armed for the next.

    ``sent`` makes what ``envs`` is given of the actions (a list goes as STEP).

    Returns:
        How many steps were interrupted.
    """
    interrupted = 0
    for t in range(30):
        actions = rng.integers(0, 2, 4)
        expected = oracle.step(actions)
        if t % 10 == 5:
            arm()
        try:
            got = envs.step(sent(actions))
        except KeyboardInterrupt:
            interrupted += 1
            with pytest.raises(AlreadyPendingCallError):
                envs.step(sent(actions))  # the interrupted step is pending, as AsyncVectorEnv's
            assert_same(envs.step_wait(), expected, f"step {t}, interrupted")
        else:
            assert_same(got, expected, f"step {t}")
    return interrupted


@pytest.mark.parametrize(
    "point", POINTS, ids=lambda p: f"{p[0]}-frame{p[1]}-{'after' if p[2] else 'before'}"
)
@pytest.mark.parametrize("path", ["raw", "general"])
def test_an_interrupted_step_stays_pending_and_returns_its_results(hosts_of, point, path):
    context = InterruptingContext()
    envs = client.RemoteVectorEnv(  # local hosts' steps on their sockets here (not channels)
        env_id="CartPole-v1",
        num_envs=4,
        hosts=hosts_of,
        num_local_hosts=2,
        context=context,
        shared_memory=False,
    )
    oracle = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    try:
        assert_same(envs.reset(seed=3), oracle.reset(seed=3))
        interrupted = steps_interrupted(
            envs,
            oracle,
            np.random.default_rng(1),
            lambda: context.arm(*point),
            sent=(lambda a: a) if path == "raw" else (lambda a: a.tolist()),  # a list: STEP
        )
        assert interrupted == 3  # a step always sends and receives
    finally:
        envs.close()
        oracle.close()
        context.term()


class _Proxy(SimpleNamespace):
    """A module with some of its functions replaced (the others are the module's)."""

    def __init__(self, module, **replaced) -> None:
        super().__init__(**replaced)
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)


class ChannelInterrupts:
    """Makes the channel's ``os.write``, ``os.read`` or its poll raise ``KeyboardInterrupt``
    (before or after the call), once, where :meth:`arm` says: the points a Ctrl-C can cut a
    post or a wait in a channel at. Install it before the channels are made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.plan: tuple[str, bool] | None = None
        self.raised = 0
        real_os = channel_module.os
        wrap = self._wrap
        monkeypatch.setattr(
            channel_module,
            "os",
            _Proxy(real_os, write=wrap("write", real_os.write), read=wrap("read", real_os.read)),
        )
        real_poll = channel_module.select.poll

        def poll():  # a poll object whose poll may raise (its channel made after this)
            made = real_poll()
            return _Proxy(made, poll=wrap("poll", made.poll))

        monkeypatch.setattr(channel_module, "select", _Proxy(channel_module.select, poll=poll))

    def arm(self, name: str, after: bool) -> None:
        self.plan = (name, after)

    def _wrap(self, name, call):
        def wrapped(*args):
            plan = self.plan
            if plan is None or plan[0] != name:
                return call(*args)
            self.plan = None
            self.raised += 1
            if not plan[1]:
                raise KeyboardInterrupt
            call(*args)
            raise KeyboardInterrupt

        return wrapped


@pytest.mark.parametrize(
    "point",
    [("write", False), ("write", True), ("poll", False), ("poll", True), ("read", True)],
    ids=lambda p: f"{p[0]}-{'after' if p[1] else 'before'}",
)
def test_a_step_interrupted_in_its_channel_stays_pending_and_returns_its_results(
    monkeypatch, point
):
    kwargs = {"step_s": 0.003, "slow_prob": 0.0}  # a step slow enough to be waited for
    interrupts = ChannelInterrupts(monkeypatch)
    envs = client.make_vec(
        "envserver.testing:envserver/Jitter-v0",
        num_envs=4,
        vector_kwargs={"num_local_hosts": 2},
        **kwargs,
    )
    oracle = SyncVectorEnv([lambda: gym.make("envserver/Jitter-v0", **kwargs)] * 4)
    try:
        assert channel_messages(envs) != [-1, -1]
        assert_same(envs.reset(seed=4), oracle.reset(seed=4))
        interrupted = steps_interrupted(
            envs, oracle, np.random.default_rng(2), lambda: interrupts.arm(*point)
        )
        interrupts.plan = None  # (a point a late step did not reach: not the close's)
        # A step whose reply came before its wait neither polls nor reads its pipe; with the
        # point kept armed up to the end, one never reached is rare (every step writes).
        assert interrupted == interrupts.raised >= (3 if point[0] == "write" else 1)
        assert all(count >= 30 for count in channel_messages(envs))
    finally:
        envs.close()
        oracle.close()


def test_an_interrupted_reset_and_call_stay_pending(plain_hosts):
    context = InterruptingContext()
    envs = client.RemoteVectorEnv(
        env_id="CartPole-v1", num_envs=4, hosts=plain_hosts[:2], context=context
    )
    oracle = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    try:
        context.arm("recv", 1, True)
        with pytest.raises(KeyboardInterrupt):
            envs.reset(seed=9)
        assert_same(envs.reset_wait(), oracle.reset(seed=9))
        context.arm("recv", 0, True)
        with pytest.raises(KeyboardInterrupt):
            envs.get_attr("metadata")
        with pytest.raises(AlreadyPendingCallError):
            envs.reset()
        assert envs.call_wait() == oracle.get_attr("metadata")
    finally:
        envs.close()
        oracle.close()
        context.term()


# ---------------------------------------------------------------- real signals, many times


class Interrupter:
    """Sends SIGINT every few milliseconds, raising ``KeyboardInterrupt`` where Ctrl-C can be
    survived: while a call of ``envs`` is pending, or before it began (in ``*_async``).

    Not where the test's own code runs, nor in the return of results already made (the call
    over, its results on their way out: no Python function can keep a value it returned when
    the caller is interrupted before it stores it); those signals are kept for the next send.
    """

    def __init__(self, envs) -> None:
        self.envs = envs
        self.armed = False
        self.raised = 0
        #: How much longer than 1-6 ms the next signal waits: ``settled`` grows it while one call
        #: is interrupted again and again, so that a call slower than that on a busy machine
        #: still gets to its end (a livelock of the test's making, not of the call's).
        self.spacing = 1.0
        self._stop = threading.Event()
        self._package = str(Path(envserver.__file__).parent.parent)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Interrupter:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        signal.signal(signal.SIGINT, self._previous)

    def _run(self) -> None:
        while not self._stop.wait(random.uniform(0.001, 0.006) * self.spacing):
            os.kill(os.getpid(), signal.SIGINT)

    def _handle(self, signum, frame) -> None:
        if not self.armed or not self._survivable(frame):
            return
        self.armed = False
        self.raised += 1
        raise KeyboardInterrupt

    def _survivable(self, frame) -> bool:
        names = []
        while frame is not None and frame.f_code.co_filename.startswith(self._package):
            if "/tests/" in frame.f_code.co_filename:
                break
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if not names:
            return False  # the test's own code
        pending = self.envs._state is not AsyncState.DEFAULT
        return pending or any(name.endswith("_async") for name in names)


def settled(envs, run, interrupter: Interrupter):
    """``run(envs)`` to its end, however often it is interrupted: its results."""
    interrupter.armed = True
    tries = 0
    try:
        while True:
            try:
                if envs._state is AsyncState.DEFAULT:
                    return run(envs)
                wait = {
                    AsyncState.WAITING_STEP: envs.step_wait,
                    AsyncState.WAITING_RESET: envs.reset_wait,
                }[envs._state]
                return wait()
            except KeyboardInterrupt:
                tries += 1
                interrupter.spacing = min(2.0**tries, 100.0)
                interrupter.armed = True
    finally:
        interrupter.armed = False
        interrupter.spacing = 1.0


@pytest.mark.parametrize("path", ["raw", "general"])
def test_steps_interrupted_by_signals_at_random_are_exact(hosts_of, path):
    envs = client.RemoteVectorEnv(
        env_id="CartPole-v1", num_envs=4, hosts=hosts_of, num_local_hosts=2
    )
    oracle = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    rng = np.random.default_rng(7)
    steps = 0
    try:
        with Interrupter(envs) as interrupter:
            assert_same(settled(envs, lambda e: e.reset(seed=1), interrupter), oracle.reset(seed=1))
            deadline = time.monotonic() + 60  # inside the per-test timeout, when busy too
            while interrupter.raised < 40 and time.monotonic() < deadline:
                actions = rng.integers(0, 2, 4)
                sent = actions if path == "raw" else actions.tolist()
                expected = oracle.step(actions)
                got = settled(envs, lambda e, sent=sent: e.step(sent), interrupter)
                assert_same(got, expected, f"step {steps} ({interrupter.raised} interruptions)")
                steps += 1
        assert interrupter.raised >= 10, f"only {interrupter.raised} interruptions in {steps} steps"
        assert_same(
            envs.step(np.zeros(4, dtype=np.int64)), oracle.step(np.zeros(4, dtype=np.int64))
        )
    finally:
        envs.close()
        oracle.close()
