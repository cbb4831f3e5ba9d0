"""Ray for real: env hosts as actors on Ray clusters of several nodes, found through ray://.

A cluster of a head and three worker nodes in this process (``ray.cluster_utils.Cluster``, each
worker node at an address of its own: 127.0.0.2-4), and one started with ``ray start --head``
for the command line. Needs the ``ray`` extra; run with ``make test-ray``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers import children, run_envserver, wait_for

ray = pytest.importorskip("ray")
from chaos import Tally  # noqa: E402
from ports import free_ports  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from envserver import client  # noqa: E402
from envserver.cli.ping import ping_all  # noqa: E402
from envserver.errors import HostUnavailableError  # noqa: E402

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
NUM_ENVS = 12
COUNTER = "chaos_envs:chaos/Counter-v0"


def hosts_running() -> list[str]:
    """The hosts Ray actors started (named ray-N), wherever they run."""
    done = subprocess.run(["pgrep", "-af", "envserver serve .*--name ray-"], capture_output=True)
    return [line for line in done.stdout.decode().splitlines() if "pgrep" not in line]


@pytest.fixture(scope="module")
def ray_environment(tmp_path_factory) -> Iterator[dict[str, str]]:
    """Ray's files under this test's temporary directory; the hosts import the chaos envs."""
    saved = dict(os.environ)
    os.environ.update(
        RAY_TMPDIR=str(tmp_path_factory.mktemp("ray")),
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_AUTO_CONNECT="0",
        PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "harness"), saved.get("PYTHONPATH", "")]),
    )
    os.environ.pop("RAY_ADDRESS", None)
    try:
        yield dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def cluster(ray_environment) -> Iterator[tuple[Cluster, list]]:
    """A head without CPUs (the trainer's node) and three worker nodes of 2 CPUs each."""
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    try:
        nodes = [cluster.add_node(num_cpus=2, node_ip_address=ip) for ip in WORKERS]
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    wait_for(lambda: not hosts_running(), "no host of ours left running", 30)


def test_hosts_spread_over_the_nodes_serve_exactly_what_sync_vector_env_gives(cluster):
    head, _ = cluster
    envs = client.make_vec("CartPole-v1", NUM_ENVS, hosts=f"ray://{head.address}")
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * NUM_ENVS)
    try:
        # one host per CPU (6), spread: every worker node holds some
        assert len(envs.hosts) == 6
        assert {h.split("//")[1].split(":")[0] for h in envs.hosts} == set(WORKERS)
        # the hosts are this trainer's: CURVE with its keys (on disk only while a host starts);
        # without them, no answer
        assert not glob.glob(os.path.join(tempfile.gettempdir(), "envserver-ray-*"))
        assert ping_all(envs.hosts[:1], None, 2.0)[0].info is None
        assert ping_all(envs.hosts[:1], envs._hosts.own_curve, 10.0)[0].info is not None
        rng = np.random.default_rng(3)
        ours, theirs = envs.reset(seed=5), sync.reset(seed=5)
        assert np.array_equal(ours[0], theirs[0])
        for _ in range(300):
            actions = rng.integers(0, 2, NUM_ENVS)
            ours, theirs = envs.step(actions), sync.step(actions)
            for a, b in zip(ours[:4], theirs[:4]):
                assert np.array_equal(a, b)
    finally:
        envs.close()
    # closed: the actors and the placement group are gone, every CPU free again
    wait_for(lambda: not hosts_running(), "no host of ours left running", 30)
    ray.init(address=head.address, ignore_reinit_error=True)  # closing leaves it connected
    wait_for(lambda: ray.available_resources().get("CPU", 0) == 6, "every CPU free after close", 30)


def test_factories_travel_pickled_where_the_trainer_allows_it(cluster):
    head, _ = cluster
    factories = [lambda: gym.wrappers.TimeLimit(gym.make("CartPole-v1"), 7)] * 2
    envs = client.RemoteVectorEnv(
        factories, hosts=f"ray://{head.address}?hosts=2", allow_pickle=True
    )
    try:
        envs.reset(seed=0)
        truncations = [envs.step(np.zeros(2, dtype=np.int64))[3] for _ in range(7)]
        assert truncations[-1].all() and not any(t.any() for t in truncations[:-1])
    finally:
        envs.close()


def crash(ip: str) -> None:
    """A node fails without a word: its raylet and every process under it (workers, their
    hosts), SIGKILL, all at once."""
    raylets = subprocess.run(
        ["pgrep", "-f", f"raylet.*--node_ip_address={ip} "], capture_output=True, text=True
    ).stdout.split()
    assert len(raylets) == 1, raylets
    doomed, todo = [], [int(raylets[0])]
    while todo:
        pid = todo.pop()
        doomed.append(pid)
        todo += children(pid)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["removed", "crashed"])
def test_a_node_lost_mid_rollout_is_recovered_with_every_step_accounted_for(cluster, how):
    head, nodes = cluster
    envs = client.make_vec(
        COUNTER,
        NUM_ENVS,
        hosts=f"ray://{head.address}?hosts=4",  # 4 of 6 CPUs: room to move a lost node's hosts
        vector_kwargs={"on_host_failure": "restart", "host_timeout_s": 2.0},
    )
    tally = Tally(NUM_ENVS)
    try:
        _, infos = envs.reset(seed=1)
        tally.batch(range(NUM_ENVS), infos)
        before = list(envs.hosts)
        lost_ip = before[0].split("//")[1].split(":")[0]
        on_lost_node = [i for i, h in enumerate(before) if lost_ip in h]
        # the node lost at step 20; on until its hosts are recovered (80 steps at least)
        steps, deadline = 0, time.monotonic() + 180
        while steps < 80 or envs.host_restarts < len(on_lost_node):
            assert time.monotonic() < deadline, f"{envs.host_restarts} hosts recovered in time"
            steps += 1
            if steps == 20:
                if how == "removed":  # its raylet, its workers, their hosts; the GCS is told
                    head.remove_node(nodes[WORKERS.index(lost_ip)])
                else:  # the GCS finds out by its health checks, seconds later
                    crash(lost_ip)
            *_, infos = envs.step(np.ones(NUM_ENVS, dtype=np.int64))
            tally.batch(range(NUM_ENVS), infos)
        after = list(envs.hosts)
        restarts = envs.host_restarts
    finally:
        envs.close()
    assert tally.problems == []
    assert tally.results == NUM_ENVS * (1 + steps)
    assert restarts == len(on_lost_node) >= 1
    assert all(lost_ip not in h for h in after), after
    lost_envs = [i for i, n in enumerate(tally.reports) if n]
    assert len(lost_envs) >= 1 and set(tally.reports.tolist()) <= {0, 1}


def test_a_cluster_without_room_or_out_of_reach_is_one_clear_error(cluster):
    head, _ = cluster
    with pytest.raises(HostUnavailableError, match=r"no room for 9 env host\(s\) of 1 CPU each"):
        client.make_vec(
            "CartPole-v1",
            NUM_ENVS,
            hosts=f"ray://{head.address}?hosts=9&strategy=STRICT_SPREAD",
            vector_kwargs={"connect_timeout_s": 3.0},
        )
    ray.init(address=head.address, ignore_reinit_error=True)  # closing leaves it connected
    assert ray.available_resources().get("CPU", 0) == 6  # nothing kept


def test_a_trainer_killed_leaves_nothing_on_the_cluster(cluster):
    head, _ = cluster
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from envserver import client; import time\n"
            f"envs = client.make_vec('CartPole-v1', 2, hosts='ray://{head.address}?hosts=2')\n"
            "print('ready', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert driver.stdout.readline().strip() == "ready"
        assert len(hosts_running()) == 2
    finally:
        driver.kill()  # SIGKILL: no close, no atexit
        driver.wait()
    wait_for(lambda: not hosts_running(), "the killed trainer's hosts gone", 60)
    ray.init(address=head.address, ignore_reinit_error=True)  # closing leaves it connected
    wait_for(lambda: ray.available_resources().get("CPU", 0) == 6, "every CPU free again", 60)


def test_a_cluster_out_of_reach_is_one_line_at_once(ray_environment):
    result = run_envserver(
        "rollout", "CartPole-v1", "--hosts", "ray://127.0.0.1:1", env=ray_environment, timeout_s=60
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "envserver rollout: HostUnavailableError: no Ray cluster reached at 127.0.0.1:1 "
        "(the spec's address): Connection refused"
    )


def test_the_command_line_finds_a_ray_start_cluster_from_ray_address(ray_environment):
    ray_bin = Path(sys.executable).parent / "ray"
    port = free_ports()
    start = [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=2"]
    start += ["--node-ip-address=127.0.0.1", "--include-dashboard=false"]
    # --block: the command holds the cluster, and takes it down when it is stopped (ray stop
    # would stop every Ray cluster of this user on the machine)
    head = subprocess.Popen(start, env=ray_environment, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: answers("127.0.0.1", port), "the head's GCS listening", 120)
        rollout = ["rollout", "CartPole-v1", "--num-envs", "4", "--steps", "50", "--json"]
        result = run_envserver(
            *rollout,
            "--hosts",
            "ray://",
            env={**ray_environment, "RAY_ADDRESS": f"127.0.0.1:{port}"},
            timeout_s=300,
        )
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert len(summary["hosts"]) == 2
    finally:
        head.terminate()
        head.wait(120)
    wait_for(lambda: not hosts_running(), "no host of ours left running", 30)


def test_a_trainer_off_the_cluster_connects_through_ray_client(ray_environment):
    """RAY_ADDRESS=ray://HEAD:PORT (Ray Client, the ray extra's ray[client]): the hosts start on
    the cluster, and the trainer steps them directly."""
    ray_bin = Path(sys.executable).parent / "ray"
    port = free_ports(2)
    client_port = port + 1
    start = [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=2"]
    start += [f"--ray-client-server-port={client_port}", "--node-ip-address=127.0.0.1"]
    start += ["--include-dashboard=false"]
    head = subprocess.Popen(start, env=ray_environment, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: answers("127.0.0.1", client_port), "the head's Ray Client server", 120)
        rollout = ["rollout", "CartPole-v1", "--num-envs", "4", "--steps", "50", "--json"]
        result = run_envserver(
            *rollout,
            "--hosts",
            "ray://",
            env={**ray_environment, "RAY_ADDRESS": f"ray://127.0.0.1:{client_port}"},
            timeout_s=300,
        )
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert len(summary["hosts"]) == 2 and summary["env_steps"] == 200, summary
    finally:
        head.terminate()
        head.wait(120)
    wait_for(lambda: not hosts_running(), "no host of ours left running", 30)


def answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True
