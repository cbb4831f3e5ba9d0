"""The examples run (short versions of them; docs/guides/trainers.md gives the full runs'
results), and a trainer's own env module next to its script reaches the embedded hosts."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envserver.testing import start_host

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300

# Each test runs a trainer script (torch, SB3) in a process, one of them twice: the suite's 120 s
# per test is too little on a loaded machine, and every run has its own bound (TIMEOUT_S).
pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.timeout(2 * TIMEOUT_S + 60)]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def mean_return(stdout: str) -> float:
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("mean_return="), stdout[-2000:]
    return float(last.removeprefix("mean_return="))


@pytest.fixture(scope="module")
def tcp_hosts(tmp_path_factory):
    directory = tmp_path_factory.mktemp("example-hosts")
    hosts = [start_host(directory, bind="tcp://127.0.0.1:*") for _ in range(2)]
    yield [h.endpoint for h in hosts]
    for host in hosts:
        host.stop()


def test_cleanrl_style_ppo_runs_on_tcp_hosts(tcp_hosts):
    # On embedded hosts, the next test runs it (and compares it with SyncVectorEnv's run).
    args = ["examples/ppo.py", "--total-timesteps", "1024", "--num-envs", "4", "--num-steps", "64"]
    result = run(*args, "--hosts", *tcp_hosts)
    assert "steps=1024 " in result.stdout
    assert 5 < mean_return(result.stdout) <= 500


def test_cleanrl_style_ppo_learns_exactly_as_on_sync_vector_env():
    args = ["examples/ppo.py", "--total-timesteps", "2048", "--num-envs", "2", "--log-every", "1"]
    outputs = []
    for vector in ("remote", "sync"):
        stdout = run(*args, "--vector", vector).stdout
        outputs.append(re.sub(r" steps_per_s=\d+", "", stdout).splitlines())
    assert len(outputs[0]) == 2048 // (2 * 128) + 1
    assert outputs[0] == outputs[1]  # same returns and losses, update for update


@pytest.mark.parametrize("remote", [False, True], ids=["embedded-hosts", "tcp-hosts"])
def test_sb3_ppo_runs(remote, tcp_hosts):
    args = ["examples/sb3_ppo.py", "--total-timesteps", "512", "--num-envs", "4"]
    if remote:
        args += ["--hosts", *tcp_hosts]
    result = run(*args)
    assert "ep_rew_mean" in result.stdout
    assert 5 < mean_return(result.stdout) <= 500


def test_env_classes_next_to_the_trainer_script_reach_embedded_hosts(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_envs.py").write_text(
        textwrap.dedent(
            """
            import gymnasium as gym
            import numpy as np

            class Walk(gym.Env):
                observation_space = gym.spaces.Box(-100, 100, shape=(1,), dtype=np.float64)
                action_space = gym.spaces.Discrete(2)

                def reset(self, *, seed=None, options=None):
                    super().reset(seed=seed)
                    self.x = 0.0
                    return np.array([self.x]), {}

                def step(self, action):
                    self.x += 1.0 if action else -1.0
                    return np.array([self.x]), 1.0, abs(self.x) >= 3, False, {}
            """
        )
    )
    (project / "train.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            from envserver import client
            from envserver.client.sb3 import RemoteVecEnv
            from my_envs import Walk

            envs = client.RemoteVectorEnv([Walk] * 2)
            envs.reset(seed=0)
            obs = envs.step(np.ones(2, dtype=np.int64))[0]
            envs.close()
            sb3 = RemoteVecEnv([Walk] * 2)
            sb3.reset()
            sb3_obs = sb3.step(np.zeros(2, dtype=np.int64))[0]
            sb3.close()
            print(obs.tolist(), sb3_obs.tolist())
            """
        )
    )
    # Started from elsewhere: only the script's own directory makes my_envs importable.
    result = run(str(project / "train.py"), cwd=tmp_path)
    assert result.stdout.split() == ["[[1.0],", "[1.0]]", "[[-1.0],", "[-1.0]]"]


def test_multiagent_ppo_learns_the_same_on_one_host_as_on_two():
    """Parameter-shared PPO on MPE simple_spread: where the envs run changes nothing."""
    args = ["examples/ppo_multiagent.py", "--total-timesteps", "512", "--num-envs", "4"]
    args += ["--num-steps", "32", "--log-every", "1"]
    outputs = []
    for hosts in ("1", "2"):
        stdout = run(*args, "--num-local-hosts", hosts).stdout
        outputs.append(re.sub(r" steps_per_s=\d+", "", stdout).splitlines())
    assert len(outputs[0]) == 512 // (4 * 32) + 1
    assert -100 < mean_return("\n".join(outputs[0])) < 0  # MPE's rewards are distances, < 0
    assert outputs[0] == outputs[1]  # same returns and losses, update for update
