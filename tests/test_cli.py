"""The envserver command: ping for health checks, rollout, serve errors, python -m."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

TIMEOUT_S = 120


def envserver(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envserver", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ping_a_live_host(plain_hosts):
    for endpoint in plain_hosts:
        result = envserver("ping", endpoint)
        assert result.returncode == 0, result.stderr
        assert "envserver" in result.stdout and "protocol" in result.stdout


def test_ping_nobody_fails_within_timeout():
    result = envserver("ping", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.5")
    assert result.returncode == 1
    assert "no answer" in result.stderr


@pytest.mark.parametrize("use_hosts", [False, True], ids=["local-hosts", "remote-host"])
def test_rollout_reports_speed_and_returns(plain_hosts, use_hosts):
    args = ["rollout", "CartPole-v1", "--num-envs", "3", "--steps", "200", "--no-progress"]
    if use_hosts:
        args += ["--hosts", *plain_hosts[:2]]
    result = envserver("--log-level", "WARNING", *args)
    assert result.returncode == 0, result.stderr
    assert "steps/s:" in result.stdout
    episodes = int(result.stdout.split("episodes finished:")[1].split()[0])
    assert episodes > 0
    mean_return = float(result.stdout.split("mean episode return:")[1].split()[0])
    assert 5 < mean_return < 500
    assert "on 2 host(s)" in result.stdout


def test_serve_on_a_taken_address_fails_clearly(plain_hosts):
    tcp_endpoint = plain_hosts[2]
    result = envserver("serve", "--bind", tcp_endpoint)
    assert result.returncode == 2
    assert "cannot bind" in result.stderr


def test_help_lists_commands():
    result = envserver("--help")
    assert result.returncode == 0
    for command in ("serve", "rollout", "ping"):
        assert command in result.stdout
