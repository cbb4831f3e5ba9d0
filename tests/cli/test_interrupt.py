"""Ctrl-C and SIGTERM: one line, the partial summary, the shell's exit status, nothing left behind.

Real subprocesses (``envserver rollout``, ``envserver bench``, a trainer script) get real
signals mid-run; each runs with its own TMPDIR, so "nothing left behind" is an empty directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envserver.cli.interrupts import Interrupted, exit_status, signals_interrupt

DEADLINE_S = 90.0
BENCH = [sys.executable, "-m", "envserver", "bench"]


def wait_for(
    condition, what: str, process: subprocess.Popen | None = None, log: Path | None = None
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        output = log.read_text()[-3000:] if log is not None else ""
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {output}"
        if process is not None:
            assert process.poll() is None, f"exited ({process.returncode}) before {what}: {output}"
        time.sleep(0.05)


@pytest.fixture
def tmpdir_env(monkeypatch) -> Iterator[Path]:
    """A TMPDIR for the command (short: ipc paths are at most 107 bytes), removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="envserver-test-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(directory))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def start(args: list[str], tmp_path: Path, **kwargs) -> tuple[subprocess.Popen, Path, Path]:
    """Starts a command in a session of its own, its output under ``tmp_path``."""
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # like a terminal's foreground job: killpg reaches it all
            **kwargs,
        )
    return process, stdout, stderr


def send(process: subprocess.Popen, signum: int) -> None:
    """SIGINT as a terminal's Ctrl-C sends it (to the whole job); SIGTERM to the process only."""
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)


def progressed(stderr: Path) -> bool:
    """Whether tqdm's bar shows some env steps done."""
    counts = re.findall(r"\| *(\d+(?:\.\d+)?)[kMG]?/", stderr.read_text(errors="replace"))
    return any(float(count) > 0 for count in counts)


def assert_left_nothing(tmpdir: Path) -> None:
    try:
        wait_for(lambda: not any(tmpdir.iterdir()), "the temporary files to go")
    except AssertionError:
        left = sorted(str(path) for path in tmpdir.rglob("*"))
        logs = [path.read_text(errors="replace") for path in tmpdir.rglob("*.log")]
        raise AssertionError(f"left behind: {left}; logs: {logs}") from None


def the_line(stderr: str, prefix: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, stderr
    return lines[0]


ROLLOUT = [sys.executable, "-m", "envserver", "--log-level", "WARNING", "rollout", "CartPole-v1"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_rollout_prints_one_line_and_its_partial_summary(tmp_path, tmpdir_env, signum):
    process, stdout, stderr = start([*ROLLOUT, "--num-envs", "2", "--steps", "10000000"], tmp_path)
    try:
        wait_for(lambda: progressed(stderr), "progress", process)
        send(process, signum)
        assert process.wait(DEADLINE_S) == 128 + signum
    finally:
        process.kill()
        process.wait()
    name = signal.Signals(signum).name
    line = the_line(stderr.read_text(), "envserver rollout:")
    match = re.fullmatch(rf"envserver rollout: interrupted \({name}\) after (\d+) env steps", line)
    assert match, line
    steps = int(match.group(1))
    assert steps > 0
    summary = stdout.read_text()
    assert f"env steps:           {steps} in " in summary
    assert "episodes finished:" in summary and "on 2 host(s)" in summary
    assert_left_nothing(tmpdir_env)  # the local hosts' sockets and logs


MARK_ENV = textwrap.dedent(
    """
    import os

    import gymnasium as gym
    from gymnasium.envs.classic_control import CartPoleEnv


    class MarkEnv(CartPoleEnv):
        \"\"\"CartPole that leaves a file after its 50th step: the rollout is under way.\"\"\"

        steps = 0

        def step(self, action):
            MarkEnv.steps += 1
            if MarkEnv.steps == 50:
                open(os.environ["MARK_FILE"], "w").close()
            return super().step(action)


    gym.register("Mark-v0", entry_point=MarkEnv, max_episode_steps=500)
    """
)


def test_interrupted_rollout_json_is_one_valid_object(tmp_path, tmpdir_env, monkeypatch):
    (tmp_path / "markenv.py").write_text(MARK_ENV)  # found in the working directory
    monkeypatch.setenv("MARK_FILE", str(tmp_path / "mark"))
    process, stdout, stderr = start(
        [*ROLLOUT[:-1], "markenv:Mark-v0", "--num-envs", "2", "--steps", "10000000", "--json"],
        tmp_path,
        cwd=tmp_path,
    )
    try:
        wait_for((tmp_path / "mark").exists, "50 steps", process)
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE_S) == 143
    finally:
        process.kill()
        process.wait()
    summary = json.loads(stdout.read_text())
    assert summary["interrupted"] is True and summary["signal"] == "SIGTERM"
    assert summary["env_id"] == "markenv:Mark-v0" and summary["num_envs"] == 2
    assert summary["env_steps"] >= 50 and len(summary["hosts"]) == 2
    line = the_line(stderr.read_text(), "envserver rollout:")
    assert (
        line == f"envserver rollout: interrupted (SIGTERM) after {summary['env_steps']} env steps"
    )
    assert_left_nothing(tmpdir_env)


def test_rollout_interrupted_while_connecting(tmp_path):
    import zmq

    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)  # takes the client's hello and never answers
    try:
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        process, stdout, stderr = start(
            [*ROLLOUT, "--hosts", f"tcp://127.0.0.1:{port}", "--json", "--connect-timeout", "600"],
            tmp_path,
        )
        try:
            assert silent.poll(DEADLINE_S * 1000), "the rollout never connected"
            process.send_signal(signal.SIGINT)
            assert process.wait(DEADLINE_S) == 130
        finally:
            process.kill()
            process.wait()
    finally:
        silent.close(linger=0)
        context.term()
    assert json.loads(stdout.read_text()) == {
        "env_id": "CartPole-v1",
        "num_envs": 8,
        "interrupted": True,
        "signal": "SIGINT",
    }
    line = the_line(stderr.read_text(), "envserver rollout:")
    assert line == "envserver rollout: interrupted (SIGINT) after 0 env steps"


TRAINER = textwrap.dedent(
    """
    from envserver import client

    envs = client.make_vec("CartPole-v1", num_envs=2)
    envs.reset(seed=0)
    print(envs.hosts[0], flush=True)
    while True:
        envs.step(envs.action_space.sample())
    """
)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_trainers_local_hosts_remove_their_directory(tmp_path, tmpdir_env, signum):
    """A user's trainer that handles no signal: its hosts exit, the last one removes the dir."""
    process, stdout, _ = start([sys.executable, "-c", TRAINER], tmp_path)
    try:
        wait_for(lambda: stdout.read_text().startswith("ipc://"), "the hosts", process)
        directory = Path(stdout.read_text().split()[0][len("ipc://") :]).parent
        assert directory.parent == tmpdir_env and any(directory.iterdir())
        assert process.poll() is None, "the trainer must still be stepping"
        process.send_signal(signum)
        process.wait(DEADLINE_S)
    finally:
        process.kill()
        process.wait()
    assert_left_nothing(tmpdir_env)


# SIGTERM takes the same path (envserver.cli.interrupts, tested with rollout); one run is enough.
@pytest.mark.parametrize("signum", [signal.SIGINT], ids=["SIGINT"])
@pytest.mark.slow
def test_interrupted_benchmark_writes_its_partial_report(tmp_path, tmpdir_env, signum):
    report = tmp_path / "report.md"
    # The first table comes sooner: the jittery env's (five variants; CartPole's, first in a
    # whole run, is left out), then the envs that sleep, long enough to be interrupted in.
    short = ["--rounds", "1", "--round-seconds", "0.05", "--only", "jittery,sleeps"]
    process, stdout, stderr = start(
        [*BENCH, "--quick", "--out", str(report), *short], tmp_path, cwd=tmp_path
    )
    try:
        wait_for(lambda: "| Remote lockstep |" in stdout.read_text(), "a table", process, stderr)
        send(process, signum)
        assert process.wait(DEADLINE_S) == 128 + signum
    finally:
        process.kill()
        process.wait()
    name = signal.Signals(signum).name
    assert "Traceback" not in stderr.read_text(), stderr.read_text()
    assert stdout.read_text().splitlines()[-1] == (
        f"bench: interrupted ({name}); the partial report is in {report}"
    )
    text = report.read_text()
    assert "| Remote lockstep |" in text and f"**Interrupted ({name}): a partial report.**" in text
    assert "### CartPole-v1" not in text  # the first section, left out by --only
    assert report.with_suffix(".png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")  # its chart
    assert_left_nothing(tmpdir_env)  # hosts stopped, the benchmark's temporary directory removed


def test_signals_interrupt_restores_the_previous_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as caught, signals_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(DEADLINE_S)  # the handler raises as soon as the signal is taken
    assert caught.value.signal_name == "SIGTERM" and exit_status(caught.value) == 143
    assert isinstance(caught.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is before
    assert exit_status(KeyboardInterrupt()) == 130


def test_a_signal_whose_exception_was_lost_stops_the_next_check():
    # pyzmq drops an exception raised while it frees a message (Frame.__dealloc__): the
    # rollout's loop checks after each step, so one Ctrl-C stops it all the same.
    with signals_interrupt() as interrupts:
        interrupts.check()  # nothing received yet
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the handler raises as the call returns
            pytest.fail("the handler did not raise")
        except Interrupted:
            pass  # lost, as in a __dealloc__
        with pytest.raises(Interrupted) as raised:
            interrupts.check()
    assert raised.value.signum == signal.SIGINT


SLOW_ENV = textwrap.dedent(
    """
    import os
    import time

    import gymnasium as gym
    from gymnasium.envs.classic_control import CartPoleEnv


    class SlowEnv(CartPoleEnv):
        # CartPole whose steps take 0.5 s, leaving a file at its first: a step is under way.

        def step(self, action):
            open(os.environ["MARK_FILE"], "w").close()
            time.sleep(0.5)
            return super().step(action)


    gym.register("Slow-v0", entry_point=SlowEnv, max_episode_steps=500)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_rollout_interrupted_in_a_step_says_its_line_and_no_warning(
    tmp_path, tmpdir_env, monkeypatch, signum
):
    """The step the signal interrupted is pending when the rollout closes its envs: that close
    is the command's own doing, not worth Gymnasium's (coloured) warning about closing mid-call."""
    (tmp_path / "slowenv.py").write_text(SLOW_ENV)
    monkeypatch.setenv("MARK_FILE", str(tmp_path / "mark"))
    process, stdout, stderr = start(
        [*ROLLOUT[:-1], "slowenv:Slow-v0", "--num-envs", "2", "--steps", "1000", "--no-progress"],
        tmp_path,
        cwd=tmp_path,
    )
    try:
        wait_for((tmp_path / "mark").exists, "a step under way", process)
        send(process, signum)
        assert process.wait(DEADLINE_S) == 128 + signum
    finally:
        process.kill()
        process.wait()
    said = stderr.read_text()
    name = signal.Signals(signum).name
    assert re.fullmatch(rf"envserver rollout: interrupted \({name}\) after \d+ env steps\n", said)
    assert "steps/s:" in stdout.read_text()
    assert_left_nothing(tmpdir_env)
