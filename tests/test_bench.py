"""The benchmark stays runnable: a seconds-long smoke run of benchmarks/bench.py (its numbers are
not checked: timing assertions have no place in a test on a shared machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "benchmarks" / "bench.py"


def test_quick_benchmark_writes_its_report(tmp_path):
    out = tmp_path / "report.md"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = out.read_text()
    for heading in (
        "**Echo floor this run:",
        "### One env: step round trip",
        "### CartPole-v1, 4 envs",
        "| Remote ipc 1 host |",
        "| AsyncVectorEnv shm |",
        "| raw ZeroMQ floor ipc 1 host |",
        "peak RSS of each env host (MB) |",
        "Remote first-ready, batches of 2",
        "### Soak:",
        "### Targets",
    ):
        assert heading in report, heading


def test_quick_benchmark_of_a_users_own_env(tmp_path):
    out = tmp_path / "own.md"
    result = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--out",
            str(out),
            "--env",
            "envserver.testing:envserver/Pixels-v0",
            "--env-kwargs",
            '{"episode_steps": 5}',
            "--num-envs",
            "3",
            "--hosts",
            "1,2",
            "--transports",
            "tcp",
            "--batch-size",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = out.read_text()
    for line in (
        "### envserver.testing:envserver/Pixels-v0, 3 envs",
        "| SyncVectorEnv |",
        "| Remote tcp 1 host |",
        "| Remote tcp 2 hosts |",
        "| Remote tcp 2 hosts, first-ready batches of 2 |",
    ):
        assert line in report, line
    for absent in ("### CartPole-v1", "Remote ipc", "raw ZeroMQ floor ipc", "### Soak:"):
        assert absent not in report, absent


def test_targets_whose_variants_were_left_out_read_n_a(tmp_path):
    out = tmp_path / "some.md"
    options = ["--num-envs", "16", "--hosts", "1", "--transports", "tcp", "--only", "CartPole"]
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out), *options],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = out.read_text()
    assert "| CartPole 16 envs, Remote ipc 2 hosts / SyncVectorEnv | n/a | >= 0.7 | - |" in report
    assert "| Remote tcp 1 host |" in report
    assert "| client RSS growth over the soak (MB) |" in report


def test_benchmark_refuses_a_bad_option(tmp_path):
    for option in (
        ["--transports", "udp"],
        ["--hosts", "0"],
        ["--env-kwargs", "{oops"],
        ["--env-kwargs", "[1]"],
        ["--num-envs", "4", "--batch-size", "5"],
    ):
        result = subprocess.run(
            [sys.executable, str(BENCH), "--env", "CartPole-v1", *option],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, (option, result.stderr)
        assert "error:" in result.stderr, option
