"""Hosts that die, freeze, restart or hang: every wait ends with a clear error, never a hang.

Each test holds its own hosts (they get killed). The bounds here catch hangs; none measures.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest
from helpers import refused_port, wait_for

from envserver import client
from envserver.errors import HostUnavailableError, RequestTimeoutError
from envserver.testing import start_host

EPISODIC = "envserver.testing:envserver/Episodic-v0"
HOST_TIMEOUT_S = 2.0
RECOVERY_HINT = 'on_host_failure="restart" would make its envs anew and go on'


def tcp_host(tmp_path, *args, bind="tcp://127.0.0.1:*"):
    return start_host(tmp_path, *args, bind=bind)


def make(hosts, **kwargs):
    vector_kwargs = {"host_timeout_s": HOST_TIMEOUT_S, **kwargs.pop("vector_kwargs", {})}
    return client.make_vec(
        EPISODIC,
        num_envs=4,
        hosts=[h.endpoint for h in hosts],
        vector_kwargs=vector_kwargs,
        terminate_prob=0.0,
        **kwargs,
    )


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_killed_host_mid_step_is_reported(tmp_path, transport):
    bind = "tcp://127.0.0.1:*" if transport == "tcp" else None
    hosts = [start_host(tmp_path, bind=bind), start_host(tmp_path, bind=bind)]
    envs = make(hosts, step_delay_s=0.5)
    try:
        envs.reset(seed=0)
        envs.step_async(np.zeros(4, dtype=np.int64))
        hosts[1].process.kill()
        with pytest.raises(HostUnavailableError) as caught:
            envs.step_wait()  # no timeout: the liveness bound must end it
        assert hosts[1].endpoint in str(caught.value)
        assert "envs 2-3" in str(caught.value)
        assert isinstance(caught.value, ConnectionError)
        assert RECOVERY_HINT in str(caught.value)  # the default mode raises: how to go on
        # Later calls fail at once, naming the same host; close() still returns.
        with pytest.raises(HostUnavailableError, match="envs 2-3") as again:
            envs.step(np.zeros(4, dtype=np.int64))
        assert RECOVERY_HINT in str(again.value)
    finally:
        envs.close()
        for host in hosts:
            host.stop()


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_a_host_killed_between_steps_is_known_gone_at_the_next(tmp_path, transport):
    """Nothing listens where it was: the next step fails it (and a spare takes its envs) at
    once, not after ``host_timeout_s`` of waiting for a host that cannot come back with them."""
    bind = "tcp://127.0.0.1:*" if transport == "tcp" else None
    hosts = [start_host(tmp_path, bind=bind) for _ in range(3)]
    envs = make(
        hosts[:2],
        vector_kwargs={
            "host_timeout_s": 1000.0,  # a wait for it would outlast the step's timeout below
            "on_host_failure": "restart",
            "spare_hosts": [hosts[2].endpoint],
        },
    )
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        hosts[0].process.kill()
        hosts[0].process.wait()
        envs.step_async(np.zeros(4, dtype=np.int64))
        infos = envs.step_wait(timeout=60.0)[4]
        assert infos["_host_failure"].tolist() == [True, True, False, False]
        assert envs.hosts[0] == hosts[2].endpoint
    finally:
        envs.close()
        for host in hosts[1:]:
            host.stop()


def test_frozen_host_is_reported(tmp_path):
    hosts = [tcp_host(tmp_path)]
    envs = make(hosts)
    try:
        envs.reset(seed=0)
        hosts[0].process.send_signal(signal.SIGSTOP)
        with pytest.raises(HostUnavailableError, match="died, froze or became unreachable"):
            envs.step(np.zeros(4, dtype=np.int64))
    finally:
        hosts[0].process.send_signal(signal.SIGCONT)
        envs.close()
        hosts[0].stop()


def test_host_restarted_on_the_same_port(tmp_path):
    first = tcp_host(tmp_path)
    envs = make([first])
    second = None
    try:
        envs.reset(seed=0)
        first.process.kill()
        first.process.wait()
        second = tcp_host(tmp_path, bind=first.endpoint)
        # The request reaches the new host (or the connection loss is seen first): either way
        # the envs are known lost, never silently recreated.
        with pytest.raises(HostUnavailableError, match=r"restarted|died, froze"):
            envs.step(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()
        if second is not None:
            second.stop()


def test_hung_env_step_hits_the_request_deadline(tmp_path):
    hosts = [tcp_host(tmp_path, "--allow-pickle")]
    envs = make(hosts, vector_kwargs={"request_timeout_s": 1.0})
    try:
        envs.reset(seed=0)
        envs.set_attr("step_gate", str(tmp_path / "never"))
        with pytest.raises(RequestTimeoutError, match="alive but has not answered") as caught:
            envs.step(np.zeros(4, dtype=np.int64))
        assert not isinstance(caught.value, HostUnavailableError)
    finally:
        envs.close()
        (tmp_path / "never").touch()  # let the host finish the step, then stop
        hosts[0].stop()


def test_unreachable_host_at_connect(tmp_path):
    with refused_port() as port, pytest.raises(HostUnavailableError, match="could not be reached"):
        client.make_vec(
            "CartPole-v1",
            num_envs=1,
            hosts=[f"tcp://127.0.0.1:{port}"],
            vector_kwargs={"connect_timeout_s": 1.0},
        )


def test_first_ready_recv_reports_a_dead_host(tmp_path):
    hosts = [tcp_host(tmp_path), tcp_host(tmp_path)]
    envs = make(hosts, step_delay_s=0.3, vector_kwargs={"batch_size": 4})
    try:
        envs.reset(seed=0)
        envs.send(np.zeros(4, dtype=np.int64))
        hosts[0].process.kill()
        with pytest.raises(HostUnavailableError, match="envs 0-1"):
            envs.recv()
    finally:
        envs.close()
        for host in hosts:
            host.stop()


def test_a_host_stopped_mid_step_finishes_it_then_refuses(tmp_path):
    # The step is under way on the host when SIGTERM comes (its env has begun, and waits on a
    # gate the test opens): the host finishes it, answers it, and exits 0; later calls fail.
    started, gate = tmp_path / "started", tmp_path / "gate"
    host = tcp_host(tmp_path)
    envs = make([host], step_started=str(started), step_gate=str(gate))
    try:
        envs.reset(seed=0)
        envs.step_async(np.zeros(4, dtype=np.int64))
        wait_for(started.exists, "the host to begin the step")
        host.process.send_signal(signal.SIGTERM)
        gate.touch()
        obs, *_ = envs.step_wait()
        assert obs.shape == (4, 4)
        with pytest.raises(HostUnavailableError):
            envs.step(np.zeros(4, dtype=np.int64))
        assert host.process.wait(30) == 0
    finally:
        envs.close()
        host.stop()
