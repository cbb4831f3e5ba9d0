"""Prometheus metrics of a real host, read over HTTP: exact counts after a known rollout, env
errors, refused and evicted sessions, gauges, process metrics."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import zmq
from helpers import metrics_url, scrape

from envserver import client
from envserver.host.loop import EnvHost, HostConfig
from envserver.host.metrics import METRIC_NAMES, NoMetrics
from envserver.testing import start_host
from envserver.wire.messages import Command, Status, decode_reply, encode_request

TIMEOUT_S = 60


def requests(samples, command: str, status: str = "ok") -> float:
    key = ("envserver_requests_total", (("command", command), ("status", status)))
    return samples.get(key, 0.0)


@pytest.fixture
def host(tmp_path, request):
    args = getattr(request, "param", ())
    started = start_host(tmp_path, "--metrics-port", "0", *args, bind="tcp://127.0.0.1:*")
    yield started, metrics_url(started)
    started.stop()


def test_counts_are_exact_after_a_known_rollout(host):
    process, url = host
    before = scrape(url)
    for name in METRIC_NAMES:
        assert any(key[0].startswith(name) for key in before), name
    assert before[("envserver_env_steps_total", ())] == 0
    assert ("process_cpu_seconds_total", ()) in before  # the library's process collector
    envs = client.make_vec("CartPole-v1", num_envs=3, hosts=[process.endpoint])
    envs.reset(seed=0)
    for _ in range(10):
        envs.step(np.zeros(3, dtype=np.int64))
    during = scrape(url)
    assert during[("envserver_sessions", ())] == 1 and during[("envserver_envs", ())] == 3
    envs.close()
    after = scrape(url)
    assert after[("envserver_env_steps_total", ())] == 30  # 10 vector steps of 3 envs
    assert requests(after, "step") == 10 and requests(after, "reset") == 1
    assert requests(after, "hello") == 1 and requests(after, "make") == 1
    assert requests(after, "close") == 1
    count = ("envserver_request_duration_seconds_count", (("command", "step"),))
    assert after[count] == 10
    assert after[("envserver_request_duration_seconds_sum", (("command", "step"),))] > 0
    assert after[("envserver_sessions", ())] == 0 and after[("envserver_envs", ())] == 0
    assert after[("envserver_env_errors_total", ())] == 0


def test_env_errors_and_failed_requests_are_counted(host):
    process, url = host
    envs = client.make_vec(
        "envserver.testing:envserver/Failing-v0",
        num_envs=2,
        hosts=[process.endpoint],
        step_error_at=2,
    )
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(ValueError, match="simulated failure"):
            envs.step(np.zeros(2, dtype=np.int64))
    finally:
        envs.close()
    samples = scrape(url)
    assert samples[("envserver_env_errors_total", ())] == 1
    assert requests(samples, "step", "error") == 1 and requests(samples, "step") == 1
    assert samples[("envserver_env_steps_total", ())] == 2  # the failed step served none


@pytest.mark.parametrize("host", [("--max-sessions", "1")], indirect=True)
def test_refused_sessions_are_counted(host):
    process, url = host
    first = client.make_vec("CartPole-v1", num_envs=1, hosts=[process.endpoint])
    try:
        with pytest.raises(client.LimitError):
            client.make_vec("CartPole-v1", num_envs=1, hosts=[process.endpoint])
        assert scrape(url)[("envserver_sessions_refused_total", ())] == 1
    finally:
        first.close()


@pytest.mark.parametrize("host", [("--session-idle-timeout", "0.5")], indirect=True)
def test_evicted_sessions_are_counted(host):
    """Apart from the refusal above: that one needs the first session to stay, this one needs
    it gone after 0.5 s, and a busy machine can take longer between the two."""
    process, url = host
    first = client.make_vec("CartPole-v1", num_envs=1, hosts=[process.endpoint])
    try:
        deadline = time.monotonic() + TIMEOUT_S  # the idle session is closed by the host
        while scrape(url)[("envserver_sessions_evicted_total", (("reason", "idle"),))] < 1:
            assert time.monotonic() < deadline, "the idle session was never evicted"
            time.sleep(0.1)
        assert scrape(url)[("envserver_sessions", ())] == 0
    finally:
        first.close()


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_host_without_a_metrics_port_counts_nothing():
    host = EnvHost(HostConfig(bind="tcp://127.0.0.1:*"))
    try:
        assert type(host.metrics) is NoMetrics and host.metrics.port is None
    finally:
        host.close()


def test_a_taken_metrics_port_stops_the_host_and_frees_its_endpoint():
    served = EnvHost(HostConfig(bind="tcp://127.0.0.1:*", metrics_port=0))
    bind = f"tcp://127.0.0.1:{free_tcp_port()}"
    try:
        with pytest.raises(
            OSError, match=f"cannot serve metrics on 127.0.0.1:{served.metrics.port}"
        ):
            EnvHost(HostConfig(bind=bind, metrics_port=served.metrics.port))
        EnvHost(HostConfig(bind=bind)).close()  # the failed host released its endpoint
    finally:
        served.close()


def test_a_retried_request_counts_with_its_cached_status(host):
    process, url = host
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(process.endpoint)

    def ask(request_id, command, session, body):
        dealer.send_multipart(
            encode_request(request_id, command, session, body, allow_pickle=False)
        )
        assert dealer.poll(TIMEOUT_S * 1000)
        return decode_reply(dealer.recv_multipart(), allow_pickle=False)

    try:
        session = ask(1, Command.HELLO, None, {}).body["session"]
        bad = {"env_id": "NoSuchEnv-v0", "kwargs": {}, "num_envs": 1}
        for _ in range(2):  # the same id twice: answered again from the cache
            assert ask(2, Command.MAKE, session, bad).status == Status.ERROR
    finally:
        dealer.close()
        context.term()
    samples = scrape(url)
    assert requests(samples, "make", "error") == 2 and requests(samples, "make") == 0
