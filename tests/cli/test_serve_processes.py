"""envserver serve --processes N: N real hosts forked from one parent, which keeps them running.

Every host is checked the way a trainer uses it (RemoteVectorEnv against SyncVectorEnv); the
parent's supervision by killing hosts and the parent itself; its refusals by the exit status
and the one line it prints.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers import alive, children, cmdline, wait_for

from envserver import client
from envserver.cli.processes import host_binds
from envserver.testing import start_host

DEADLINE_S = 60.0


class Served:
    """A running ``envserver serve --processes N`` and its log."""

    def __init__(self, process: subprocess.Popen, log: Path) -> None:
        self.process = process
        self.log = log

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def endpoints(self) -> list[str]:
        return re.findall(r"serving on (\S+)", self.text())

    def hosts(self) -> list[int]:
        """The pids of the parent's live children (its hosts)."""
        return sorted(pid for pid in children(self.process.pid) if alive(pid))


def running_with(text: str) -> list[int]:
    """The live processes whose command line holds ``text``."""
    pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return [pid for pid in pids if text in cmdline(pid) and alive(pid)]


def pid_of(endpoint: str) -> int:
    """The pid of the host serving ``endpoint``, as its PING reply says."""
    result = subprocess.run(
        [sys.executable, "-m", "envserver", "ping", endpoint, "--json"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
    )
    return json.loads(result.stdout)[0]["pid"]


@contextmanager
def serve(tmp_path: Path, *args: str, count: int) -> Iterator[Served]:
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "envserver", "serve", "--processes", str(count), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    served = Served(process, log)
    try:
        yield served
    finally:
        hosts = served.hosts()
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in hosts:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def started(served: Served, count: int) -> list[str]:
    wait_for(lambda: len(served.endpoints()) >= count, f"{count} hosts serving:\n{served.text()}")
    return served.endpoints()


def test_every_host_serves_steps_as_sync_vector_env(tmp_path):
    with serve(tmp_path, "--bind", f"ipc://{tmp_path}/h.sock", count=3) as served:
        endpoints = started(served, 3)
        assert sorted(endpoints) == [f"ipc://{tmp_path}/h.sock.{i}" for i in range(3)]
        assert len(served.hosts()) == 3  # forked by the parent, not interpreters of their own
        for i in range(3):  # each host's log lines say which it is
            assert f"[host {i}] env host ipc://{tmp_path}/h.sock.{i} serving" in served.text()
        envs = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=6, hosts=sorted(endpoints))
        oracle = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 6)
        try:
            got, _ = envs.reset(seed=7)
            want, _ = oracle.reset(seed=7)
            np.testing.assert_array_equal(got, want)
            rng = np.random.default_rng(0)
            for _ in range(200):
                actions = rng.integers(0, 2, 6)
                for g, w in zip(envs.step(actions)[:4], oracle.step(actions)[:4]):
                    np.testing.assert_array_equal(g, w)
        finally:
            envs.close()
            oracle.close()


def test_a_killed_host_is_started_again_and_the_trainer_goes_on(tmp_path):
    """A host SIGKILLed is forked again on its endpoint; a trainer that restarts lost envs
    finds it there: the step reports the lost envs, the other host's envs step on exactly."""
    with serve(tmp_path, "--bind", f"ipc://{tmp_path}/h.sock", count=2) as served:
        endpoints = sorted(started(served, 2))
        before = served.hosts()
        envs = client.RemoteVectorEnv(
            env_id="CartPole-v1", num_envs=4, hosts=endpoints, on_host_failure="restart"
        )
        oracle = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
        try:
            envs.reset(seed=3)
            oracle.reset(seed=3)
            actions = np.zeros(4, np.int64)
            for _ in range(5):
                envs.step(actions)
                oracle.step(actions)
            killed = pid_of(endpoints[0])
            assert killed in before
            os.kill(killed, signal.SIGKILL)
            for step in range(2):  # the lost envs' step (the host forked again and re-made
                got, want = envs.step(actions), oracle.step(actions)  # them), then the next
                if step == 0:
                    assert got[4]["_host_failure"].tolist() == [True, True, False, False]
                    assert got[3][:2].all()  # reported as truncated
                for g, w in zip(got[:4], want[:4]):  # the other host's envs step on exactly
                    np.testing.assert_array_equal(g[2:], w[2:])
        finally:
            envs.close()
            oracle.close()
        after = served.hosts()
        assert len(after) == 2 and killed not in after
        assert "was killed by signal 9; starting it again in 1 s" in served.text()


def test_sigterm_stops_every_host_and_exits_zero(tmp_path):
    with serve(tmp_path, "--bind", f"ipc://{tmp_path}/h.sock", count=3) as served:
        started(served, 3)
        hosts = served.hosts()
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(DEADLINE_S) == 0, served.text()
        wait_for(lambda: not any(alive(pid) for pid in hosts), "every host gone")
        assert served.text().count("closed") >= 3  # each host closed cleanly
        assert "starting it again" not in served.text()


def test_hosts_warned_by_slurm_and_by_their_parent_drain_once(tmp_path):
    """Slurm signals every process of a job step: each host gets Slurm's SIGTERM and the one
    its parent forwards. Each drains once: it serves its session until the trainer has moved
    its env to a spare, then stops, and the parent exits 0 once both are gone."""
    args = ("--bind", f"ipc://{tmp_path}/h.sock", "--drain-grace", "60", "--session-lease", "3")
    spare = start_host(tmp_path / "spare")
    with serve(tmp_path, *args, count=2) as served:
        endpoints = sorted(started(served, 2))
        hosts = served.hosts()
        envs = client.RemoteVectorEnv(
            env_id="CartPole-v1", num_envs=2, hosts=endpoints, spare_hosts=[spare.endpoint],
            on_host_failure="restore",
        )  # fmt: skip
        try:
            envs.reset(seed=0)
            for pid in hosts:  # Slurm's SIGTERM to each host...
                os.kill(pid, signal.SIGTERM)
            draining = "draining: 1 session(s) holding 1 env(s)"
            wait_for(lambda: served.text().count(draining) == 2, f"two drains:\n{served.text()}")
            served.process.send_signal(signal.SIGTERM)  # ...and to the parent, which forwards it
            again = "received SIGTERM while draining: the drain goes on"
            wait_for(lambda: served.text().count(again) == 2, f"both told:\n{served.text()}")
            deadline = time.monotonic() + DEADLINE_S
            while envs.envs_moved < 2:  # each host serves its session until its env moved
                assert time.monotonic() < deadline, f"moved {envs.envs_moved}:\n{served.text()}"
                assert "host_failure" not in envs.step(envs.action_space.sample())[4]
            assert envs.host_restarts == 0 and list(envs.hosts) == [spare.endpoint] * 2
            assert served.process.wait(DEADLINE_S) == 0, served.text()
        finally:
            envs.close()
            spare.stop()
        text = served.text()
        assert text.count("drained: no session left") == 2, text
        assert text.count("envserver.cli INFO received SIGTERM") == 1, text  # the parent's
        assert "received signal 0" not in text and "starting it again" not in text, text


def test_sigint_after_sigterm_stops_the_draining_hosts_at_once(tmp_path):
    args = ("--bind", f"ipc://{tmp_path}/h.sock", "--drain-grace", "60")
    with serve(tmp_path, *args, count=2) as served:
        endpoints = sorted(started(served, 2))
        envs = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=2, hosts=endpoints)
        try:
            envs.reset(seed=0)
            served.process.send_signal(signal.SIGTERM)
            draining = "draining: 1 session(s) holding 1 env(s)"
            wait_for(lambda: served.text().count(draining) == 2, f"two drains:\n{served.text()}")
            served.process.send_signal(signal.SIGINT)  # the sessions are still open
            wait_for(lambda: served.process.poll() is not None, f"stopped:\n{served.text()}", 20)
            assert served.process.returncode == 0, served.text()
        finally:
            envs.close()
        text = served.text()
        assert "received SIGINT; stopping 2 hosts at once" in text, text
        assert text.count("received SIGTERM, SIGINT; shut down") == 2, text
        assert "drained" not in text and "starting it again" not in text, text


def test_sigterm_while_hosts_start_stops_them_all(tmp_path):
    """A stop that comes while hosts are being forked reaches every one of them."""
    with serve(tmp_path, "--bind", f"ipc://{tmp_path}/h.sock", count=4) as served:
        wait_for(lambda: served.hosts(), "a first host forked")
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(DEADLINE_S) == 0, served.text()  # it waited for all
        assert running_with(f"ipc://{tmp_path}/h.sock") == []
        assert "starting it again" not in served.text()


def test_hosts_exit_when_the_parent_is_killed(tmp_path):
    with serve(tmp_path, "--bind", f"ipc://{tmp_path}/h.sock", count=2) as served:
        started(served, 2)
        hosts = served.hosts()
        served.process.kill()
        served.process.wait()
        wait_for(lambda: not any(alive(pid) for pid in hosts), "the orphaned hosts gone")


def test_hosts_that_cannot_start_stop_them_all_with_one_line_each(tmp_path):
    bind = f"ipc://{tmp_path}/missing/h.sock"  # no such directory: no host can bind
    with serve(tmp_path, "--bind", bind, count=2) as served:
        assert served.process.wait(DEADLINE_S) == 2
        wait_for(lambda: not served.hosts(), "no host left")
        text = served.text()
        assert "Traceback" not in text and "ResourceWarning" not in text
        # The first host that fails stops the others: one may be stopped before it tried to
        # bind, and then has nothing to say. Each that tried says so in one line, once.
        assert 1 <= text.count("cannot bind") <= 2 and text.count("could not start") == 1
        assert "starting it again" not in text


def test_tcp_hosts_each_pick_a_port(tmp_path):
    with serve(tmp_path, "--bind", "tcp://127.0.0.1:*", count=2) as served:
        endpoints = started(served, 2)
        assert len(set(endpoints)) == 2 and all(e.startswith("tcp://127.0.0.1:") for e in endpoints)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processes", "0"], "argument --processes: must be an integer of at least 1, got '0'"),
        (
            ["--processes", "2", "--bind", "inproc://x"],
            "envserver serve: --processes needs a tcp://ADDRESS:PORT or ipc:// --bind",
        ),
        (
            ["--processes", "3", "--bind", "tcp://127.0.0.1:65534"],
            "envserver serve: --bind's port 65534 and --processes 3 go past port 65535",
        ),
    ],
)
def test_refusals_are_one_line(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "envserver", "serve", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_host_binds_count_up():
    assert host_binds("tcp://0.0.0.0:5555", 3) == [
        "tcp://0.0.0.0:5555",
        "tcp://0.0.0.0:5556",
        "tcp://0.0.0.0:5557",
    ]
    assert host_binds("tcp://[::1]:7000", 2) == ["tcp://[::1]:7000", "tcp://[::1]:7001"]
    assert host_binds("tcp://*:*", 2) == ["tcp://*:*", "tcp://*:*"]
    assert host_binds("ipc:///run/h.sock", 2) == ["ipc:///run/h.sock.0", "ipc:///run/h.sock.1"]
    with pytest.raises(ValueError, match="tcp://ADDRESS:PORT"):
        host_binds("tcp://127.0.0.1", 2)
