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
