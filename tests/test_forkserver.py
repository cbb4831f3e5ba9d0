"""The fork server that starts embedded local hosts: hosts forked from it get the trainer's
environment, working directory and import path as they are when each host starts; a host that
cannot start says why; a dead fork server is replaced; bad requests get an error, not a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
from helpers import wait_for
from test_local_hosts import alive

from envserver import client
from envserver.cli.forkserver import LOST, ForkServer, ForkServerError
from envserver.client._local import LocalHosts

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
TIMEOUT_S = 60.0


class EnvironmentEnv(gym.Env):
    """Reports, by ``call``, what the host process sees."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def seen(self, name: str) -> list:
        import importlib

        return [os.environ.get(name), os.getcwd(), importlib.import_module("late_module").VALUE]


def test_hosts_see_the_trainer_as_it_is_when_they_start(tmp_path, monkeypatch):
    ForkServer.shared()  # started before any of what follows
    (tmp_path / "late_module.py").write_text("VALUE = 'from the trainer path'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ENVSERVER_TEST_LATE", "set after the fork server started")
    monkeypatch.chdir(tmp_path)
    envs = client.RemoteVectorEnv([EnvironmentEnv] * 2, num_local_hosts=1)
    try:
        assert envs._hosts.local.start_method == "forkserver"
        assert (
            envs.call("seen", "ENVSERVER_TEST_LATE")
            == (["set after the fork server started", str(tmp_path), "from the trainer path"],) * 2
        )
    finally:
        envs.close()


def test_a_host_that_cannot_start_says_why(tmp_path):
    server = ForkServer.shared()
    log = tmp_path / "host.log"
    host = server.spawn(
        ["serve", "--bind", "nonsense://x"], str(log), dict(os.environ), list(sys.path)
    )
    assert host.wait(TIMEOUT_S) != 0
    text = log.read_text()
    assert "envserver serve:" in text and "Traceback" not in text


def test_a_dead_fork_server_is_replaced_and_its_hosts_exit(tmp_path):
    hosts = LocalHosts(1)
    try:
        server = ForkServer.shared()
        (host,) = hosts.processes
        os.kill(server.pid, signal.SIGKILL)
        assert host.wait(TIMEOUT_S) == LOST  # its status is gone with its parent
        wait_for(lambda: not alive(host.pid), "the host outlived its parent")
        assert ForkServer.shared().pid != server.pid
        hosts.respawn(0)  # on the new fork server
        assert hosts.running(0)
    finally:
        hosts.close()


def test_bad_requests_get_an_error_and_the_server_goes_on():
    server = ForkServer.shared()
    bad = [
        ({"op": "poll", "pid": os.getpid()}, "no child with pid"),  # not one of its children
        ({"op": "dance"}, "unknown request 'dance'"),
        ({"op": "signal", "pid": "x", "signal": 9}, "no child with pid 'x'"),
        ({"op": "spawn", "args": ["serve"]}, "spawn needs args and path"),
    ]
    for request, error in bad:
        with pytest.raises(ForkServerError, match=error):
            server.request(request)
    assert ForkServer.shared() is server and server.alive()


def test_unreadable_lines_get_an_error_and_the_server_goes_on():
    server = ForkServer(dict(os.environ))
    try:
        assert server.process.stdin is not None
        os.write(server.process.stdin.fileno(), b"not json\n[1, 2]\n")
        for _ in range(2):
            reply = server._replies.read(TIMEOUT_S)
            assert "error" in reply
        with pytest.raises(ForkServerError, match="no child"):
            server.request({"op": "poll", "pid": 1})
    finally:
        server.close()
    assert server.process.returncode == 0


def test_a_trainer_that_forks_does_not_share_its_fork_server(tmp_path):
    """A forked trainer process starts its own fork server (the pipes are not shared)."""
    script = textwrap.dedent(
        """
        import os, sys
        from envserver.cli.forkserver import ForkServer
        first = ForkServer.shared().pid
        pid = os.fork()
        if pid == 0:
            os._exit(0 if ForkServer.shared().pid != first else 1)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], timeout=TIMEOUT_S)
    assert result.returncode == 0
