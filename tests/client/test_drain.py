"""Hosts that drain (``envserver serve --drain-grace``): on SIGTERM a host tells its sessions,
each trainer moves those envs with their state to another host at its next step, and the host
stops once no session is left. The rollout equals SyncVectorEnv's step for step: no truncation,
no ``host_failure``.
"""

from __future__ import annotations

import functools
import itertools
import signal
import time

import gymnasium as gym
import pytest
from first_ready_oracles import PerEnvOracles
from gymnasium.vector import SyncVectorEnv
from helpers import assert_same, scrape, wait_for
from ports import free_ports

from envserver import client
from envserver.errors import HostUnavailableError
from envserver.testing import start_host

DRAINING = ("--drain-grace", "60", "--session-lease", "3")  # heartbeats every second
EPISODIC = "envserver.testing:envserver/Episodic-v0"
EPISODIC_KWARGS = {"terminate_prob": 0.0, "max_steps": 1000}  # no reset: every step slow


def tcp_host(tmp_path, *args: str):
    return start_host(tmp_path, *args, bind=f"tcp://127.0.0.1:{free_ports()}")


def metric(port: int, name: str) -> float:
    """A counter of the host's metrics (0 before it counted anything)."""
    return scrape(f"http://127.0.0.1:{port}/metrics").get((name, ()), 0.0)


@pytest.mark.parametrize("mode", ["restart", "restore"])
def test_a_draining_hosts_envs_move_to_a_spare_and_go_on_exactly(tmp_path, mode) -> None:
    draining = tcp_host(tmp_path, *DRAINING)
    other, spare = tcp_host(tmp_path, *DRAINING), tcp_host(tmp_path, *DRAINING)
    make = functools.partial(gym.make, "CartPole-v1", max_episode_steps=30)
    envs = client.RemoteVectorEnv(
        env_id="CartPole-v1", env_kwargs={"max_episode_steps": 30}, num_envs=4,
        hosts=[draining.endpoint, other.endpoint], spare_hosts=[spare.endpoint],
        on_host_failure=mode,
    )  # fmt: skip
    oracle = SyncVectorEnv([make] * 4)
    try:
        assert_same(envs.reset(seed=1), oracle.reset(seed=1))
        envs.action_space.seed(2)
        draining.process.send_signal(signal.SIGTERM)
        steps_after, deadline = 0, time.monotonic() + 60
        for t in itertools.count():  # until the envs moved (a heartbeat or two), and 20 more
            assert time.monotonic() < deadline, "the envs did not move"
            actions = envs.action_space.sample()
            got = envs.step(actions)
            assert "host_failure" not in got[4]
            assert_same(got, oracle.step(actions), f"step {t}")
            steps_after += envs.envs_moved > 0
            if steps_after > 20:
                break
        assert envs.envs_moved == 2 and envs.host_restarts == 0  # moved, not recovered
        assert list(envs.hosts) == [spare.endpoint, other.endpoint]
        wait_for(lambda: draining.process.poll() is not None, "the drained host stopped")
        assert draining.process.returncode == 0
        assert "moved 2 env" not in draining.log_text()  # (the client's words, not the host's)
        assert "draining: 1 session(s) holding 2 env(s)" in draining.log_text()
    finally:
        envs.close()
        oracle.close()
        for host in (draining, other, spare):
            host.stop()


@pytest.mark.parametrize("mode", ["restart", "restore"])
def test_first_ready_envs_of_a_draining_host_move_between_their_steps(tmp_path, mode) -> None:
    """Batches of 3 of 4 envs, the draining host's two slow: one of them is in flight whenever
    the trainer sends the other, which waits (held) until it is back; then both move, and each
    env's results equal its own SyncVectorEnv's throughout."""
    pickling = (*DRAINING, "--allow-pickle")  # the test env's state is its attributes
    draining = tcp_host(tmp_path, *pickling)
    other, spare = tcp_host(tmp_path, *pickling), tcp_host(tmp_path, *pickling)
    envs = client.RemoteVectorEnv(
        env_id=EPISODIC, env_kwargs=EPISODIC_KWARGS, num_envs=4,
        hosts=[draining.endpoint, other.endpoint], spare_hosts=[spare.endpoint],
        on_host_failure=mode, batch_size=3, sub_batch_size=1,
    )  # fmt: skip
    envs.set_attr("step_delay_s", [0.05, 0.05, 0.0, 0.0])
    make = functools.partial(gym.make, "envserver/Episodic-v0", **EPISODIC_KWARGS)
    oracles = PerEnvOracles(make, 4, envs.autoreset_mode, seed=1)
    try:
        envs.async_reset(seed=1)
        for _ in range(10):
            oracles.send_next(envs, oracles.check(envs.recv()))
        draining.process.send_signal(signal.SIGTERM)
        batches_after, deadline = 0, time.monotonic() + 60
        while batches_after <= 30:  # until the envs moved (a heartbeat or two), and 30 more
            assert time.monotonic() < deadline, "the envs did not move"
            oracles.send_next(envs, oracles.check(envs.recv()))
            batches_after += envs.envs_moved > 0
        assert envs.envs_moved == 2 and envs.host_restarts == 0  # moved, not recovered
        assert list(envs.hosts) == [spare.endpoint, other.endpoint]
        wait_for(lambda: draining.process.poll() is not None, "the drained host stopped")
        assert draining.process.returncode == 0
    finally:
        envs.close()
        oracles.close()
        for host in (draining, other, spare):
            host.stop()


def test_a_draining_host_opens_no_session_and_counts_what_moved(tmp_path) -> None:
    """Its metrics count the drain and the envs moved; a new client is refused, clearly."""
    metrics_port = free_ports()
    draining = tcp_host(tmp_path, *DRAINING, "--metrics-port", str(metrics_port))
    on_it = {"hosts": [draining.endpoint]}
    first = client.make_vec("CartPole-v1", num_envs=2, vector_kwargs=on_it)
    second = client.make_vec("CartPole-v1", num_envs=1, vector_kwargs=on_it)
    try:
        first.reset(seed=0)
        draining.process.send_signal(signal.SIGTERM)
        wait_for(lambda: metric(metrics_port, "envserver_drains_total") == 1, "the drain began")
        with pytest.raises(HostUnavailableError, match="draining"):
            client.make_vec("CartPole-v1", num_envs=1, vector_kwargs=on_it)
        first.close()  # no other host: its envs stay to the end, then it closes
        wait_for(lambda: metric(metrics_port, "envserver_envs_moved_total") == 2, "counted")
        assert draining.process.poll() is None  # the second session holds it
        second.close()
        wait_for(lambda: draining.process.poll() is not None, "the drained host stopped")
    finally:
        first.close()
        second.close()
        draining.stop()


def test_a_host_without_sessions_stops_at_once_and_another_sigterm_changes_no_drain(
    tmp_path,
) -> None:
    """SIGTERM stops a host without sessions at once. A draining host sent SIGTERM again (as
    Slurm and its parent warn a host forked by ``serve --processes``) drains on: it says so
    once, serves its session, and stops once that is closed."""
    idle = tcp_host(tmp_path, *DRAINING)
    idle.process.send_signal(signal.SIGTERM)
    wait_for(lambda: idle.process.poll() is not None, "an idle host stopped at once", 20)
    assert idle.process.returncode == 0
    busy = tcp_host(tmp_path, *DRAINING)
    envs = client.make_vec("CartPole-v1", num_envs=1, vector_kwargs={"hosts": [busy.endpoint]})
    noted = "received SIGTERM while draining: the drain goes on (SIGINT stops the host at once)"
    try:
        envs.reset(seed=0)
        busy.process.send_signal(signal.SIGTERM)
        wait_for(lambda: "draining:" in busy.log_text(), "the drain began")
        busy.process.send_signal(signal.SIGTERM)
        wait_for(lambda: noted in busy.log_text(), "the second SIGTERM noted")
        busy.process.send_signal(signal.SIGTERM)
        for _ in range(20):  # still served
            envs.step(envs.action_space.sample())
        assert busy.process.poll() is None
        envs.close()
        wait_for(lambda: busy.process.poll() is not None, "the drained host stopped")
        assert busy.process.returncode == 0
        assert busy.log_text().count(noted) == 1
        assert "drained: no session left" in busy.log_text()
    finally:
        envs.close()
        busy.stop()
