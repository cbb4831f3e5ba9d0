"""Embedded local hosts: started when no hosts are given, and never left behind: not after
close(), not after the trainer exits without closing, not after the trainer is SIGKILLed."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers import alive, assert_same, children, cmdline, wait_until_gone

from envserver import client
from envserver.client._transport.local import START_METHOD_VARIABLE, default_host_count

DEADLINE_S = 30.0

TRAINER = """
import sys
import gymnasium as gym
from envserver import client

envs = client.RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * 3, num_local_hosts=2)
envs.reset(seed=0)
print(" ".join(envs.hosts), flush=True)
mode = sys.argv[1]
sys.stdin.readline()  # the test has found the hosts
if mode == "close":
    envs.close()
    print("closed", flush=True)
elif mode == "wait":
    sys.stdin.read()
"""


@pytest.fixture(params=["forkserver", "spawn"])
def trainer(request):
    """Starts a trainer script; returns it, its hosts' endpoints, and its processes that are
    gone once it is: the hosts and, with the fork server, the fork server too (last)."""
    started: list[subprocess.Popen] = []

    def start(mode: str) -> tuple[subprocess.Popen, list[str], list[int]]:
        process = subprocess.Popen(
            [sys.executable, "-c", TRAINER, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, START_METHOD_VARIABLE: request.param},
        )
        started.append(process)
        endpoints = process.stdout.readline().split()
        assert len(endpoints) == 2, "the trainer did not start its hosts"
        helpers = children(process.pid)
        if request.param == "forkserver":  # the hosts are the fork server's children
            (server,) = helpers
            assert "envserver.cli.forkhost" in cmdline(server)
            helpers = [*children(server), server]
        assert len(helpers) == 2 + (request.param == "forkserver")
        assert all(alive(pid) for pid in helpers)
        process.stdin.write("go\n")
        process.stdin.flush()
        return process, endpoints, helpers

    yield start
    for process in started:
        process.kill()
        process.wait()


def socket_dir(endpoints: list[str]) -> Path:
    return Path(endpoints[0].removeprefix("ipc://")).parent


def test_hosts_gone_after_close(trainer):
    process, endpoints, started = trainer("close")
    assert process.stdout.readline().strip() == "closed"
    hosts = started[:2]  # a fork server stays for the trainer's next vector env
    assert wait_until_gone(hosts) == []
    assert not socket_dir(endpoints).exists()
    assert process.wait(DEADLINE_S) == 0


def test_hosts_gone_after_trainer_exits_without_close(trainer):
    process, endpoints, hosts = trainer("exit")
    assert process.wait(DEADLINE_S) == 0
    assert wait_until_gone(hosts) == []
    assert not socket_dir(endpoints).exists()


def test_hosts_gone_after_trainer_is_killed(trainer):
    process, _, hosts = trainer("wait")
    os.kill(process.pid, signal.SIGKILL)
    process.wait(DEADLINE_S)
    assert wait_until_gone(hosts) == [], (
        "orphaned env hosts (or fork server) outlived a SIGKILLed trainer"
    )


def test_local_hosts_match_sync_and_are_private():
    fns = [lambda: gym.make("CartPole-v1")] * 5
    envs = client.RemoteVectorEnv(fns)
    oracle = gym.vector.SyncVectorEnv(fns)
    try:
        assert len(envs.hosts) == default_host_count(5) == min(len(os.sched_getaffinity(0)), 5)
        directory = socket_dir(list(envs.hosts))
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert all(h.startswith("ipc://") for h in envs.hosts)
        assert_same(envs.reset(seed=1), oracle.reset(seed=1))
        for _ in range(30):
            actions = np.ones(5, dtype=np.int64)
            assert_same(envs.step(actions), oracle.step(actions))
    finally:
        envs.close()
        oracle.close()
    assert not directory.exists()


def test_dead_local_host_is_reported_not_waited_on():
    envs = client.RemoteVectorEnv(
        [lambda: gym.make("envserver.testing:envserver/Episodic-v0", step_delay_s=60)] * 2,
        num_local_hosts=1,
    )
    try:
        envs.reset(seed=0)
        (host_pid,) = [p.pid for p in envs._hosts.local.processes]
        envs.step_async(np.zeros(2, dtype=np.int64))
        os.kill(host_pid, signal.SIGKILL)
        with pytest.raises(client.HostUnavailableError, match="exited"):
            envs.step_wait()
    finally:
        envs.close()


def test_an_unknown_start_method_is_refused_clearly(monkeypatch):
    monkeypatch.setenv(START_METHOD_VARIABLE, "threads")
    with pytest.raises(ValueError, match=r"ENVSERVER_LOCAL_START.*'threads'"):
        client.RemoteVectorEnv([lambda: gym.make("CartPole-v1")])


UNGUARDED_TRAINER = """
import os, sys
import gymnasium as gym
from envserver import client

with open(sys.argv[1], "a") as runs:
    runs.write(f"{os.getpid()}\\n")
envs = client.RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * 2, num_local_hosts=2)
envs.reset(seed=0)
envs.close()
print(os.getpid())
"""


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_trainer_script_without_a_main_guard_runs_once(tmp_path, start_method):
    """Hosts never import the trainer's ``__main__``: a script with no
    ``if __name__ == "__main__"`` runs in the trainer only (multiprocessing's spawn and
    forkserver would run it again in every host, as ``__mp_main__``)."""
    script, runs = tmp_path / "train.py", tmp_path / "runs"
    script.write_text(UNGUARDED_TRAINER)
    result = subprocess.run(
        [sys.executable, str(script), str(runs)],
        env={**os.environ, START_METHOD_VARIABLE: start_method},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 2,
    )
    assert result.returncode == 0, result.stderr
    assert runs.read_text().split() == [result.stdout.strip()]  # the trainer's own run only
