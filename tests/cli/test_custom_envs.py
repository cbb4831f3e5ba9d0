"""Serving your own envs: the console script finds the working directory's modules as
``python -m envserver`` does, ``--import MODULE`` (or ``$ENVSERVER_IMPORT``) registers them, and
the envs served give what ``SyncVectorEnv`` gives."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers import assert_same

from envserver import client

#: The console script pip made for this venv (not ``python -m envserver``).
ENVSERVER = Path(sys.executable).parent / "envserver"
TIMEOUT_S = 90.0

MYENVS = textwrap.dedent(
    """
    import gymnasium as gym
    import numpy as np


    class Drift(gym.Env):
        # A random walk the agent pushes: seeded noise, episodes of `length` steps.

        def __init__(self, length=7):
            self.length = length
            self.observation_space = gym.spaces.Box(-100.0, 100.0, (3,), np.float32)
            self.action_space = gym.spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            self.x = self.np_random.normal(size=3).astype(np.float32)
            return self.x.copy(), {"t": self.t}

        def step(self, action):
            self.t += 1
            self.x += (int(action) - 1) + self.np_random.normal(size=3).astype(np.float32)
            reward = float(-np.abs(self.x).sum())
            return self.x.copy(), reward, False, self.t >= self.length, {"t": self.t}


    gym.register("MyEnvs/Drift-v0", entry_point=Drift)
    """
)


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding the user's ``myenvs.py`` (importable by this test process too)."""
    (tmp_path / "myenvs.py").write_text(MYENVS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def serve(directory: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    log = directory / "host.log"
    with open(log, "wb") as stderr:
        return subprocess.Popen(
            [str(ENVSERVER), "serve", "--bind", "tcp://127.0.0.1:*", *args],
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, **(env or {})},
        )


@pytest.fixture
def hosts() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.terminate()
        try:
            process.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def endpoint_of(process: subprocess.Popen, directory: Path) -> str:
    deadline = time.monotonic() + TIMEOUT_S
    log = directory / "host.log"
    while not (match := re.search(r"serving on (\S+)", log.read_text())):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return match.group(1)


def assert_like_sync_vector_env(env_id: str, endpoint: str, num_envs: int = 3) -> None:
    """Same seeds and actions: the remote envs and SyncVectorEnv agree, step for step."""
    remote = client.make_vec(env_id, num_envs=num_envs, hosts=[endpoint])
    # The oracle imports the user's module itself: no earlier test need have imported it here.
    oracle_id = env_id if ":" in env_id else f"myenvs:{env_id}"
    local = gym.vector.SyncVectorEnv([lambda: gym.make(oracle_id)] * num_envs)
    try:
        assert_same(remote.reset(seed=11), local.reset(seed=11))
        actions = np.random.default_rng(0).integers(0, 3, size=(20, num_envs))
        for action in actions:
            assert_same(remote.step(action), local.step(action))
    finally:
        remote.close()
        local.close()


def test_console_script_serves_envs_of_its_working_directory(user_dir, hosts):
    assert ENVSERVER.is_file(), "the venv has no envserver console script"
    hosts.append(serve(user_dir))
    assert_like_sync_vector_env("myenvs:MyEnvs/Drift-v0", endpoint_of(hosts[0], user_dir))


@pytest.mark.parametrize("how", ["option", "environment"])
def test_import_registers_the_users_envs(user_dir, hosts, how):
    if how == "option":
        hosts.append(serve(user_dir, "--import", "myenvs"))
    else:
        hosts.append(serve(user_dir, env={"ENVSERVER_IMPORT": "json, myenvs"}))
    assert_like_sync_vector_env("MyEnvs/Drift-v0", endpoint_of(hosts[0], user_dir))


@pytest.mark.slow
def test_rollout_imports_for_its_local_hosts(user_dir):
    result = subprocess.run(
        [str(ENVSERVER), "--log-level", "WARNING", "rollout", "MyEnvs/Drift-v0", "--import",
         "myenvs", "--num-envs", "2", "--steps", "16", "--json"],
        cwd=user_dir, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["env_steps"] == 32  # episodes of 7 steps, and a reset step after each:
    assert summary["episodes"] == 4 and summary["mean_return"] is not None


@pytest.mark.parametrize(
    ("command", "status"),
    [(["serve", "--bind", "tcp://127.0.0.1:*"], 2), (["rollout", "CartPole-v1"], 1)],
    ids=["serve", "rollout"],
)
def test_an_import_error_is_one_line_naming_the_module(tmp_path, command, status):
    (tmp_path / "broken.py").write_text("raise RuntimeError('the module itself failed')\n")
    for module, why in [
        ("nosuchmodule", "ModuleNotFoundError: No module named 'nosuchmodule'"),
        ("broken", "RuntimeError: the module itself failed"),
    ]:
        result = subprocess.run(
            [str(ENVSERVER), *command, "--import", module],
            cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
        assert result.returncode == status
        assert "Traceback" not in result.stderr
        assert result.stderr.strip() == (
            f"envserver {command[0]}: cannot import {module} (--import): {why}"
        )


def test_rollout_import_with_remote_hosts_is_refused():
    result = subprocess.run(
        [str(ENVSERVER), "rollout", "CartPole-v1", "--import", "json", "--hosts",
         "tcp://127.0.0.1:1"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("envserver rollout: --import applies to this")


GRUMPY = textwrap.dedent(
    """
    import gymnasium as gym
    from gymnasium.envs.classic_control import CartPoleEnv


    class Grumpy(CartPoleEnv):
        def reset(self, *, seed=None, options=None):
            gym.logger.warn("Grumpy was reset")  # coloured, as Gymnasium's own warnings are
            return super().reset(seed=seed, options=options)


    gym.register("Grumpy-v0", entry_point=Grumpy)
    """
)


def test_a_coloured_env_warning_reaches_the_command_without_its_colour_codes(tmp_path):
    (tmp_path / "grumpy.py").write_text(GRUMPY)
    result = subprocess.run(
        [str(ENVSERVER), "--log-level", "WARNING", "rollout", "grumpy:Grumpy-v0", "--num-envs",
         "1", "--steps", "3", "--no-progress"],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "UserWarning: [env 0, local host 0] WARN: Grumpy was reset" in result.stderr
    assert "\x1b" not in result.stderr, result.stderr
