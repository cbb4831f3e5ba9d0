"""The Compose cluster for real: the image, scaled hosts found through DNS, a killed host, CURVE.

Needs a Docker engine and Compose v2 (``.ci/provision-docker`` sets both up on Debian, with a
base image built without a registry); run with ``make test-cluster``. ``ENVSERVER_BASE_IMAGE``
names the base image (default: the Dockerfile's). Every container, volume and network a test
starts belongs to a Compose project of its own, and is removed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CURVE_FILE = "deploy/compose.curve.yml"
COMMAND_TIMEOUT_S = 600
# `docker compose run` options that blank the trainer's CURVE key variables: a client without keys.
NO_KEYS = ["-e", "ENVSERVER_CURVE_SERVER_KEY=", "-e", "ENVSERVER_CURVE_CLIENT_KEY="]
# A trainer script as users write it: no hosts, no keys (the container's environment has them).
TRAIN_PY = """
import json
from envserver import client

envs = client.make_vec("CartPole-v1", 8)
envs.reset(seed=0)
for _ in range(100):
    envs.step(envs.action_space.sample())
print(json.dumps({"hosts": list(envs.hosts), "num_envs": envs.num_envs}))
envs.close()
"""

if shutil.which("docker") is None:
    pytest.skip("the cluster tests need docker (see make test-cluster)", allow_module_level=True)


class Cluster:
    """One Compose project of the repository's docker-compose.yml (plus override files)."""

    def __init__(self, *files: str) -> None:
        self.project = f"envserver-test-{uuid.uuid4().hex[:8]}"
        self.files = ["docker-compose.yml", *files]
        self.env = {**os.environ, "ENVSERVER_IMAGE": "envserver:cluster-test"}

    def compose(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess:
        command = ["docker", "compose", "-p", self.project]
        for file in self.files:
            command += ["-f", file]
        result = subprocess.run(
            [*command, *args],
            cwd=ROOT,
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{args} failed ({result.returncode}):\n{result.stderr}")
        return result

    def run_trainer(
        self, *args: str, options: Sequence[str] = (), input: str | None = None
    ) -> tuple[int, str, str]:
        """Runs the trainer with ``args`` (``options`` go to ``docker compose run``, ``input``
        to its stdin); returns its exit status (read from the container: some Compose and
        engine versions do not pass it on), stdout and stderr."""
        name = f"{self.project}-trainer-{uuid.uuid4().hex[:6]}"
        result = self.compose(
            "run", "--name", name, "--no-deps", "-T", *options, "trainer", *args,
            check=False, input=input,
        )  # fmt: skip
        return self.finish_run(name, result.stdout, result.stderr)

    def start_trainer(self, *args: str) -> tuple[str, subprocess.Popen]:
        name = f"{self.project}-trainer-{uuid.uuid4().hex[:6]}"
        command = ["docker", "compose", "-p", self.project]
        for file in self.files:
            command += ["-f", file]
        process = subprocess.Popen(
            [*command, "run", "--name", name, "--no-deps", "-T", "trainer", *args],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return name, process

    @staticmethod
    def finish_run(name: str, stdout: str, stderr: str) -> tuple[int, str, str]:
        status = docker("inspect", "-f", "{{.State.ExitCode}}", name).strip()
        docker("rm", "-f", name)
        return int(status), stdout, stderr

    def containers(self, service: str) -> list[str]:
        output = self.compose("ps", "-q", service).stdout
        return sorted(output.split())

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "10", check=False)


def docker(*args: str) -> str:
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    assert result.returncode == 0, f"docker {args}: {result.stderr}"
    return result.stdout


def address_of(container: str) -> str:
    return docker(
        "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container
    ).strip()


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def last_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON in the output:\n{stdout}"
    return json.loads(lines[-1])


@contextlib.contextmanager
def cluster(*files: str) -> Iterator[Cluster]:
    running = Cluster(*files)
    try:
        yield running
    finally:
        running.down()
        label = f"label=com.docker.compose.project={running.project}"
        assert docker("ps", "-aq", "--filter", label).split() == []
        assert docker("volume", "ls", "-q", "--filter", label).split() == []
        assert docker("network", "ls", "-q", "--filter", label).split() == []


@pytest.fixture(scope="module")
def plain() -> Iterator[Cluster]:
    """Three host replicas of the plain cluster, healthy."""
    with cluster() as running:
        running.compose("build")
        running.compose("up", "-d", "--scale", "envhost=3", "--wait", "envhost")
        yield running


def test_image_runs_as_a_non_root_user_without_build_tools(plain):
    image = plain.env["ENVSERVER_IMAGE"]
    assert docker("run", "--rm", "--entrypoint", "id", image, "-u").strip() == "10001"
    tools = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", image, "-c", "command -v gcc cc make"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert tools.stdout.strip() == ""


def test_trainer_finds_every_replica_through_dns(plain):
    addresses = sorted(address_of(c) for c in plain.containers("envhost"))
    assert len(addresses) == 3
    status, stdout, stderr = plain.run_trainer(
        "rollout", "CartPole-v1", "--hosts", "dns://envhost:5555", "--min-hosts", "3",
        "--num-envs", "7", "--steps", "300", "--json",
    )  # fmt: skip
    assert status == 0, stderr
    summary = last_json(stdout)
    assert summary["env_steps"] == 7 * 300
    assert sorted(h["endpoint"] for h in summary["hosts"]) == sorted(
        f"tcp://{a}:5555" for a in addresses
    )
    assert sorted(h["num_envs"] for h in summary["hosts"]) == [2, 2, 3]
    assert summary["episodes"] > 0 and summary["host_restarts"] == 0
    # Each replica's Prometheus counter, read inside its container: together, every env step.
    assert sum(env_steps_served(c) for c in plain.containers("envhost")) == 7 * 300


CHATTY_PY = """
from envserver import client

envs = client.make_vec(
    "envserver.testing:envserver/Chatty-v0", 4, vector_kwargs={"min_hosts": 3}, out_of_space=True
)
envs.reset(seed=0)
envs.step(envs.action_space.sample())
envs.close()
"""


def test_the_trainer_hears_what_the_envs_on_the_replicas_say(plain):
    """Warnings (Gymnasium's env checker's too) and output of envs on 3 replicas reach the
    trainer's stderr, each said once with where it came from."""
    status, _, stderr = plain.run_trainer("python", "-", input=CHATTY_PY)
    assert status == 0, stderr
    assert "UserWarning: [envs 0-3 on 3 hosts, 4x] ChattyEnv was reset" in stderr
    assert "is not within the observation space" in stderr
    assert "(envs 0-3 on 3 hosts) hello from every env [repeated 4x]" in stderr
    assert "(3 hosts) native 1 [repeated 4x]" in stderr
    assert sum(f") reset {i}" in stderr for i in range(4)) == 4


def env_steps_served(container: str) -> float:
    code = (
        "import urllib.request as u; t = u.urlopen('http://127.0.0.1:9100/metrics').read();"
        "name = 'envserver_env_steps_total';"
        "print([l for l in t.decode().splitlines() if l.startswith(name)][0])"
    )
    line = docker("exec", container, "python3", "-c", code)
    return float(line.split()[-1])


def sessions(container: str) -> int:
    result = subprocess.run(
        ["docker", "exec", container, "envserver", "ping", "tcp://127.0.0.1:5555", "--json"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    if result.returncode != 0:
        return -1
    return int(json.loads(result.stdout)[0]["sessions"])


def test_a_killed_host_comes_back_and_the_rollout_loses_no_step(plain):
    hosts = plain.containers("envhost")
    name, trainer = plain.start_trainer(
        "rollout", "CartPole-v1", "--hosts", "dns://envhost:5555", "--min-hosts", "3",
        "--num-envs", "6", "--steps", "30000", "--on-host-failure", "restart", "--json",
    )  # fmt: skip
    try:
        wait_for(lambda: all(sessions(c) == 1 for c in hosts), 120, "every host to hold a session")
        victim = hosts[0]
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", victim))
        os.kill(pid, signal.SIGKILL)  # the host's main process crashes
        stdout, stderr = trainer.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    status, stdout, stderr = Cluster.finish_run(name, stdout, stderr)
    assert status == 0, stderr
    summary = last_json(stdout)
    assert summary["env_steps"] == 6 * 30000  # every step returned for every env
    assert summary["host_restarts"] >= 1
    # Each env of the killed host (2 of 6) reports the loss exactly once per re-make.
    assert summary["host_failures"] == 2 * summary["host_restarts"]
    assert sum(h["num_envs"] for h in summary["hosts"]) == 6

    def back() -> bool:
        state = json.loads(docker("inspect", "-f", "{{json .}}", victim))
        return state["RestartCount"] >= 1 and state["State"]["Health"]["Status"] == "healthy"

    wait_for(back, 120, "the killed replica to be restarted and healthy")


def test_a_stopped_replica_drains_and_the_rollout_sees_nothing(plain):
    """`docker stop` of a replica (SIGTERM, as a scale-down or a rollout sends): it drains, the
    trainer moves its envs with their state to a replica it did not use, and no env is reported
    lost; the drained replica exits before Compose's grace is over (it would be killed: 137)."""
    plain.compose("up", "-d", "--scale", "envhost=3", "--no-recreate", "--wait", "envhost")
    hosts = plain.containers("envhost")
    name, trainer = plain.start_trainer(
        "rollout", "CartPole-v1", "--hosts", "dns://envhost:5555", "--min-hosts", "3",
        "--num-envs", "6", "--steps", "20000", "--on-host-failure", "restore", "--json",
    )  # fmt: skip
    try:
        wait_for(lambda: all(sessions(c) == 1 for c in hosts), 120, "every host to hold a session")
        plain.compose("up", "-d", "--scale", "envhost=4", "--no-recreate", "--wait", "envhost")
        victim = hosts[0]
        docker("stop", "--time", "60", victim)  # SIGTERM; returns once the container exited
        stdout, stderr = trainer.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if trainer.poll() is None:
            trainer.kill()
        plain.compose("up", "-d", "--scale", "envhost=3", "--wait", "envhost", check=False)
    status, stdout, stderr = Cluster.finish_run(name, stdout, stderr)
    assert status == 0, stderr
    summary = last_json(stdout)
    assert summary["env_steps"] == 6 * 20000
    assert summary["envs_moved"] == 2 and summary["host_failures"] == 0
    assert summary["host_restarts"] == 0
    assert docker("inspect", "-f", "{{.State.ExitCode}}", victim).strip() == "0"
    logs = subprocess.run(["docker", "logs", victim], capture_output=True, text=True, check=True)
    assert "draining: 1 session(s) holding 2 env(s)" in logs.stdout + logs.stderr


def test_curve_cluster_serves_key_holders_only():
    with cluster(CURVE_FILE) as running:
        running.compose("build")
        running.compose("up", "-d", "--wait", "envhost")
        addresses = sorted(f"tcp://{address_of(c)}:5555" for c in running.containers("envhost"))
        # Hosts, their count and the keys come from the trainer's environment: no flags.
        status, stdout, stderr = running.run_trainer(
            "rollout", "CartPole-v1", "--num-envs", "4", "--steps", "200", "--json"
        )
        assert status == 0, stderr
        summary = last_json(stdout)
        assert len(summary["hosts"]) == 2 and summary["env_steps"] == 800
        # A user's unmodified script, run as `docker compose run trainer python train.py`.
        status, stdout, stderr = running.run_trainer("python", "-", input=TRAIN_PY)
        assert status == 0, stderr
        result = last_json(stdout)
        assert sorted(result["hosts"]) == addresses and result["num_envs"] == 8
        status, stdout, stderr = running.run_trainer("ping")  # every replica, with the keys
        assert status == 0, stderr
        assert sorted(line.split(": ")[0] for line in stdout.splitlines()) == addresses

        status, _, stderr = running.run_trainer(
            "ping", "tcp://envhost:5555", "--timeout", "3", options=NO_KEYS
        )
        assert status == 1 and "uses CURVE and this client does not" in stderr, stderr

        status, stdout, stderr = running.run_trainer(
            "rollout", "CartPole-v1", "--connect-timeout", "5", "--json", options=NO_KEYS
        )
        assert status == 1 and "{" not in stdout
        assert "envserver rollout: HostUnavailableError: too few env hosts answered" in stderr
        assert "Traceback" not in stderr


def test_an_image_with_your_own_envs_serves_them(plain, tmp_path):
    """The deployment page's way (docs/deployment/compose.md): FROM the image, pip install a
    local env package, serve it."""
    package = tmp_path / "my-envs"
    (package / "my_envs").mkdir(parents=True)
    (package / "pyproject.toml").write_text(
        '[project]\nname = "my-envs"\nversion = "1.0"\n'
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    (package / "my_envs" / "__init__.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('MyEnv-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',"
        " max_episode_steps=20)\n"
    )
    (tmp_path / "Dockerfile").write_text(
        f"FROM {plain.env['ENVSERVER_IMAGE']}\n"
        "USER root\n"
        "COPY my-envs /src/my-envs\n"
        "RUN pip install --no-cache-dir /src/my-envs && rm -rf /src\n"
        "USER 10001:10001\n"
    )
    image = "envserver:cluster-test-my-envs"
    docker("build", "-q", "-t", image, str(tmp_path))
    try:
        with cluster() as running:
            running.env["ENVSERVER_IMAGE"] = image
            running.compose("up", "-d", "--wait", "envhost")
            status, stdout, stderr = running.run_trainer(
                "rollout", "my_envs:MyEnv-v0", "--hosts", "dns://envhost:5555",
                "--num-envs", "4", "--steps", "100", "--json",
            )  # fmt: skip
            assert status == 0, stderr
            summary = last_json(stdout)
            assert summary["env_steps"] == 400 and len(summary["hosts"]) == 2
            assert summary["episodes"] >= 4 * 100 // 20  # MyEnv-v0's episodes end by step 20
    finally:
        docker("rmi", "-f", image)
