"""The wake-up benchmark stays runnable: benchmarks/wakeups.py --quick prints a row for every way
and a number in every cell of both tables, and sees a child that exits in the middle of a round
trip (its numbers are not checked: timing assertions have no place in a test on a shared
machine)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

WAKEUPS = Path(__file__).parents[2] / "benchmarks" / "wakeups.py"
#: Whole programs under test (this one keeps every core busy for seconds): `make test-long`.
pytestmark = pytest.mark.long

BLOCKING = ["pipe", "eventfd", "semaphore"]
if platform.machine() in ("x86_64", "aarch64"):
    BLOCKING.append("futex")
SPINS = [
    ", no spin",
    ", spin 20 µs",
    ", spin 20 µs + yield",
    ", spin 100 µs",
    ", spin 100 µs + yield",
]
WAYS = [kind + spin for kind in BLOCKING for spin in SPINS]
WAYS += [
    "eventfd, the child polling it with a ROUTER socket",
    "spin (PufferLib's way)",
    "spin + sched_yield",
    "zeromq ipc, DEALER/ROUTER",
]
BUSY = os.cpu_count() or 1
HEADER = f"| way | 1 child | 1 child, {BUSY} busy | 2 children | 16 children |"
#: A median (min-max) cell.
CELL = re.compile(r"(\d+(?:\.\d)?) \((\d+(?:\.\d)?)-(\d+(?:\.\d)?)\)")


def table(report: str, title: str) -> list[list[str]]:
    """The cells of the table under ``## title``, a list per row, its header checked."""
    lines = report.split(f"## {title}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert lines[0] == HEADER
    return [line.strip("| ").split(" | ") for line in lines[2:]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_quick_run_measures_every_way_in_every_column_and_sees_a_dead_child():
    result = subprocess.run(
        [sys.executable, str(WAKEUPS), "--quick"], capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout
    for title in ("Wall µs per round trip", "CPU µs per round trip, trainer and children"):
        rows = table(report, title)
        assert [row[0] for row in rows] == WAYS
        for row in rows:
            assert len(row) == 5, row
            for text in row[1:]:
                match = CELL.fullmatch(text)
                assert match, (row[0], text)
                median, low, high = (float(value) for value in match.groups())
                assert 0 < low <= median <= high, (row[0], text)
    seen = re.search(
        r"A child that exits in the middle of a round trip is seen after: (.*) \(", report
    )
    assert seen, report[-2000:]
    kinds = [part.split(" ")[0] for part in seen.group(1).split(", ")]
    assert kinds == [*BLOCKING, "spin", "zeromq"]
    assert all(re.fullmatch(r"\w+ \d+\.\d ms", part) for part in seen.group(1).split(", "))
    assert "Traceback" not in result.stderr
