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
from helpers import alive

from envserver import client
from envserver.client._transport.local import LocalHosts
from envserver.launch.forkserver import LOST, ForkServer, ForkServerError, Lines

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

    def global_random(self) -> float:
        return float(np.random.random())

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
        ["serve", "--bind", "nonsense://x"], str(log), dict(os.environ), list(sys.path), None
    )
    assert host.wait(TIMEOUT_S) != 0
    text = log.read_text()
    assert "envserver serve:" in text and "Traceback" not in text


def test_a_dead_fork_server_is_replaced_and_its_hosts_exit(tmp_path):
    hosts = LocalHosts(2)
    try:
        server = ForkServer.shared()
        os.kill(server.pid, signal.SIGKILL)
        orphan = hosts.processes[0]
        assert orphan.wait(TIMEOUT_S) == LOST  # once gone: its status went with its parent
        assert not alive(orphan.pid)
        # The other orphan may still be running (and about to remove its files): respawning
        # it ends it first, so that it cannot remove its successor's socket.
        hosts.respawn(1)
        assert ForkServer.shared().pid != server.pid
        hosts.respawn(0)
        envs = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=2, hosts=hosts.endpoints)
        try:
            envs.reset(seed=0)
            envs.step(np.zeros(2, dtype=np.int64))
        finally:
            envs.close()
    finally:
        hosts.close()


def test_a_forked_trainer_leaves_its_parents_hosts_alone():
    """A child forked from the trainer that exits (running its atexit handlers) or closes the
    hosts does not stop them, nor talk to its parent's fork server."""
    script = textwrap.dedent(
        """
        import os, sys
        from envserver.launch.forkserver import ForkServer, ForkServerError
        from envserver.client._transport.local import LocalHosts
        hosts = LocalHosts(1)
        server = ForkServer.shared()
        pid = os.fork()
        if pid == 0:
            try:
                server.request({"op": "poll", "pid": hosts.processes[0].pid})
                os._exit(3)
            except ForkServerError:
                pass
            hosts.close()
            sys.exit(0)  # runs the atexit handlers too
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert hosts.running(0) and os.path.isdir(hosts.directory)
        assert ForkServer.shared() is server
        hosts.close()
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_forked_hosts_do_not_share_numpys_global_random_state(tmp_path):
    envs = client.RemoteVectorEnv([EnvironmentEnv] * 2, num_local_hosts=2)
    try:
        first, second = envs.call("global_random")
        assert first != second
    finally:
        envs.close()


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
    assert ForkServer.shared() is server and server.usable()


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


def test_a_reply_whose_wait_was_interrupted_does_not_answer_the_next_request(monkeypatch):
    """Ctrl-C between a request and its reply leaves the reply in the pipe: the next request
    passes over it (they carry numbers) and gets its own."""
    server = ForkServer(dict(os.environ))
    read = Lines.read

    def interrupted(self, timeout_s):
        monkeypatch.setattr(Lines, "read", read)  # once
        raise KeyboardInterrupt

    try:
        monkeypatch.setattr(Lines, "read", interrupted)
        with pytest.raises(KeyboardInterrupt):
            server.request({"op": "dance"})  # its reply, an error, comes after the interrupt
        with pytest.raises(ForkServerError, match="no child with pid 1"):
            server.request({"op": "poll", "pid": 1})  # not "unknown request 'dance'"
        assert server.usable()
    finally:
        server.close()


def test_a_trainer_that_forks_does_not_share_its_fork_server(tmp_path):
    """A forked trainer process starts its own fork server (the pipes are not shared)."""
    script = textwrap.dedent(
        """
        import os, sys
        from envserver.launch.forkserver import ForkServer
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
