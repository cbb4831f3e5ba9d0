"""The agent-loop benchmark stays runnable: benchmarks/agent_loops.py, one short round, prints
each table with a number in every cell (its numbers are not checked: timing assertions have no
place in a test on a shared machine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks" / "agent_loops.py"
#: A whole program that keeps both cores busy for a while: `make test-long`.
pytestmark = pytest.mark.long
CELL = re.compile(r"^[\d,.]+( \([\d,.]+-[\d,.]+\))?$")


@pytest.mark.timeout(300)
def test_one_short_round_prints_every_table(tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", "1", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert " failed:" not in out.stderr, out.stderr[-3000:]  # a measurement that failed
    rows = {
        line.split(" | ")[0].strip("| "): [c.strip() for c in line.strip("| ").split(" | ")[1:]]
        for line in out.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("|---")
    }
    assert set(rows) >= {
        "envserver aio pool",
        "envserver vector env (lockstep)",
        "CartPole",
        "Hopper",
        "100 KB state",
    }, out.stdout
    for name, cells in rows.items():
        if name.startswith(("256 rollouts", "CartPole, 16", "fork(1)")):
            continue  # the headers
        assert cells and all(CELL.match(c) for c in cells), (name, cells)
