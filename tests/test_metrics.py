"""Prometheus metrics of a real host, read over HTTP: exact counts after a known rollout, env
errors, refused and evicted sessions, gauges, process metrics."""

from __future__ import annotations

import re
import time
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import client
from envserver.host import EnvHost, HostConfig
from envserver.metrics import METRIC_NAMES, NoMetrics
from envserver.testing import HostProcess, start_host

TIMEOUT_S = 60


def metrics_url(host: HostProcess) -> str:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        match = re.search(r"metrics on (http://\S+)", host.log_text())
        if match:
            return match.group(1)
        time.sleep(0.05)
    raise AssertionError(f"the host never said where its metrics are: {host.log_text()}")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, by name and sorted labels."""
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


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


@pytest.mark.parametrize("host", [("--max-sessions", "1", "--session-idle-timeout", "0.5")],
                         indirect=True)  # fmt: skip
def test_refused_and_evicted_sessions_are_counted(host):
    process, url = host
    first = client.make_vec("CartPole-v1", num_envs=1, hosts=[process.endpoint])
    try:
        with pytest.raises(client.LimitError):
            client.make_vec("CartPole-v1", num_envs=1, hosts=[process.endpoint])
        assert scrape(url)[("envserver_sessions_refused_total", ())] == 1
        deadline = time.monotonic() + TIMEOUT_S  # the idle session is closed by the host
        while scrape(url)[("envserver_sessions_evicted_total", ())] < 1:
            assert time.monotonic() < deadline, "the idle session was never evicted"
            time.sleep(0.1)
        assert scrape(url)[("envserver_sessions", ())] == 0
    finally:
        first.close()


def test_a_host_without_a_metrics_port_counts_nothing():
    host = EnvHost(HostConfig(bind="tcp://127.0.0.1:*"))
    try:
        assert type(host.metrics) is NoMetrics and host.metrics.port is None
    finally:
        host.close()
    with pytest.raises(OSError):  # a taken port: the host does not start, and leaks nothing
        served = EnvHost(HostConfig(bind="tcp://127.0.0.1:*", metrics_port=0))
        try:
            EnvHost(HostConfig(bind="tcp://127.0.0.1:*", metrics_port=served.metrics.port))
        finally:
            served.close()
