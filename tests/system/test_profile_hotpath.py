"""The hot-path profile stays runnable: a short run of benchmarks/profile_hotpath.py (its numbers
are not checked: timing assertions have no place in a test on a shared machine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PROFILE = Path(__file__).parents[2] / "benchmarks" / "profile_hotpath.py"


def run(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(PROFILE), "--steps", "40", "--rounds", "1", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_table_has_a_number_for_every_row_of_the_sections_asked():
    table = run("--only", "host", "--only", "send", "--only", "step1")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split(" | ")[0] for row in rows] == [
        "| what (CartPole)",
        "| host handle, STEP 1 envs",
        "| - of which EnvBlock.step",
        "| - protocol overhead",
        "| host handle, STEP 8 envs",
        "| - of which EnvBlock.step",
        "| - protocol overhead",
        "| client step_async CPU, 1 env",
        "| client step_wait CPU, 1 env",
        "| client CPU per step, 1 env / 1 host",
        "| host CPU per step (all hosts), 1 env / 1 host",
        "| wall per step, 1 env / 1 host",
    ]
    for row in rows[1:]:
        assert re.fullmatch(r"\| .+ \| -?\d+\.\d \|", row), row


def test_a_host_profile_shows_where_the_host_spends_its_time():
    out = run("--profile", "host")
    assert "function calls" in out
    assert "envserver/" in out  # the host's own functions are among the costliest
