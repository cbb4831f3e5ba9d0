"""The transport's HostPool: the connections of one vector env and the waits on them.

Real host processes (the session's plain hosts); each test opens its own pool.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Iterator

import pytest
import zmq
from gymnasium.vector import AutoresetMode

from envserver.client._options import DEFAULT_OPTIONS
from envserver.client._transport.lease import Heartbeat
from envserver.client._transport.pool import HostPool
from envserver.client._transport.session import HostSession
from envserver.errors import HostUnavailableError, WaitTimeoutError
from envserver.testing import start_host
from envserver.wire.bodies import Hello, Make
from envserver.wire.messages import Command, Status


@pytest.fixture
def pool_of(plain_hosts) -> Iterator:
    pools: list[HostPool] = []
    context = zmq.Context()

    def make(endpoints, counts=None) -> HostPool:
        settings = dataclasses.replace(
            DEFAULT_OPTIONS.connection_settings(allow_pickle=False, curve=None, local=False),
            host_timeout_s=2.0,
            connect_timeout_s=30.0,
        )
        pool = HostPool(context, settings, heartbeat=Heartbeat())
        start = 0
        for index, endpoint in enumerate(endpoints):
            count = 1 if counts is None else counts[index]
            pool.connect(index, endpoint, start, count)
            start += count
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()
    context.term()


def open_sessions(pool: HostPool) -> None:
    requests = pool.send(Command.HELLO, lambda c: Hello("test"))
    assert pool.waits.all(requests.items(), time.monotonic() + 60, "hello", 60) is None
    for connection, pending in requests.items():
        connection.hold(HostSession(pending.reply.body["session"]))


def test_send_reaches_every_host_and_the_wait_takes_every_reply(plain_hosts, pool_of):
    pool = pool_of(plain_hosts)
    open_sessions(pool)
    requests = pool.send(
        Command.MAKE,
        lambda c: Make(AutoresetMode.NEXT_STEP, c.block.count, "CartPole-v1"),
    )
    assert list(requests) == pool.connections
    assert pool.waits.all(requests.items(), time.monotonic() + 60, "make", 60) is None
    for connection, pending in requests.items():
        assert pending.reply.request_id == pending.request_id
        assert pending.reply.status == Status.OK
        assert not connection.requests.outstanding  # answered: no longer under way


def test_one_poller_for_the_whole_pool(plain_hosts, pool_of, monkeypatch):
    pool = pool_of(plain_hosts)
    open_sessions(pool)
    built = []
    original = pool.waits._poller_of_all

    def counting():
        if pool.waits._poller is None:
            built.append(1)
        return original()

    monkeypatch.setattr(pool.waits, "_poller_of_all", counting)
    for _ in range(20):
        for connection in pool.connections:
            pool.ask_ok(connection, Command.PING, None, time.monotonic() + 60)
    assert len(built) <= 1  # not one per wait, nor per subset of hosts waited on


def test_a_reply_read_in_another_wait_is_taken_into_its_own_request(plain_hosts, pool_of):
    pool = pool_of(plain_hosts[:2])
    first, second = pool.connections
    early = second.requests.send(Command.PING, None)
    deadline = time.monotonic() + 60
    while not second.link.socket.poll(10):  # the second host's reply is queued
        assert time.monotonic() < deadline
    waited = first.requests.send(Command.PING, None)
    while waited.reply is None:  # a wait on the first host reads every socket that is ready
        assert pool.waits.any([(first, waited)], deadline, "ping", 60) is None
    assert early.reply is not None and early.reply.request_id == early.request_id
    assert not second.requests.outstanding


def test_late_replies_to_abandoned_requests_are_dropped(plain_hosts, pool_of):
    pool = pool_of(plain_hosts[:1])
    (connection,) = pool.connections
    abandoned = connection.requests.send(Command.PING, None)
    pool.forget([(connection, abandoned)])
    reply = pool.ask(connection, Command.PING, None, time.monotonic() + 60)
    assert reply.status == Status.OK  # the abandoned one's reply was not taken for it


def test_a_wait_times_out_and_a_dead_host_is_reported(tmp_path, pool_of):
    host = start_host(tmp_path, bind="tcp://127.0.0.1:*")
    pool = pool_of([host.endpoint])
    (connection,) = pool.connections
    open_sessions(pool)
    host.process.send_signal(signal.SIGSTOP)  # frozen: no reply comes, its heartbeats stop
    try:
        requests = [(connection, connection.requests.send(Command.PING, None))]
        failure = pool.waits.any(requests, time.monotonic() + 0.3, "nothing", 0.3)
        assert isinstance(failure, WaitTimeoutError)
        assert "`nothing` has timed out" in str(failure)
        deadline = time.monotonic() + 60
        while (failure := pool.waits.any(requests, deadline, "ping", 60)) is None:
            pass
        assert isinstance(failure, HostUnavailableError)
        assert connection.health.failure is not None  # and it stays failed
    finally:
        host.process.send_signal(signal.SIGCONT)
        host.stop()


def test_drop_closes_a_connection_and_its_place_is_taken(plain_hosts, pool_of):
    pool = pool_of(plain_hosts[:2])
    old = pool.connections[1]
    new = pool.connect(1, plain_hosts[2], old.block.start, old.block.count)
    pool.drop(old)
    assert pool.connections == [pool.connections[0], new]
    assert pool.ask_ok(new, Command.PING, None, time.monotonic() + 60)["protocol"] >= 1
    assert old.link.socket.closed
