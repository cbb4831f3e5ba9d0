"""tests/harness/stress.py (make test-stress) runs pytest beside busy loops, names what failed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STRESS = Path(__file__).parents[1] / "harness" / "stress.py"


def stress(tmp_path, *args):
    return subprocess.run(
        [sys.executable, str(STRESS), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_lists_each_failed_test_and_in_how_many_runs(tmp_path):
    (tmp_path / "test_mixed.py").write_text(
        "def test_passes():\n    pass\n\n\ndef test_fails():\n    assert False\n"
    )
    result = stress(tmp_path, "--load", "1", "--runs", "2", "--", "-q", "-rfE", "test_mixed.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "stress: 2 run(s) of pytest beside 1 busy loop(s)" in result.stdout
    assert "run 2: exit 1, 1 failed, 1 passed in" in result.stdout, result.stdout
    assert "failed in 2 of 2 run(s): test_mixed.py::test_fails" in result.stdout
    assert "test_passes" not in result.stdout.split("stress:")[1]


def test_passes_when_every_run_passes(tmp_path):
    (tmp_path / "test_fine.py").write_text("def test_passes():\n    pass\n")
    result = stress(tmp_path, "--load", "1", "--runs", "1", "--", "-q", "test_fine.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "run 1: exit 0, 1 passed in" in result.stdout
    assert "failed in" not in result.stdout
