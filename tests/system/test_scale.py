"""The scale benchmark stays runnable: one trainer on hosts in namespaces of their own, beside
the raw floor (benchmarks/scale.py --quick; its numbers are not checked), and it leaves no
namespace, link or bridge behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCALE = Path(__file__).parents[2] / "benchmarks" / "scale.py"
sys.path.insert(0, str(SCALE.parent))
from scale import Fabric  # noqa: E402

from envserver.testing import ip, netns_unavailable  # noqa: E402

SKIP_REASON = netns_unavailable()
pytestmark = [
    pytest.mark.long,  # a whole program: `make test-long` (CI) runs it
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
    pytest.mark.xdist_group("netns"),  # one namespace user at a time (make test's workers)
]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_scale_run_reports_ours_beside_the_floor(tmp_path):
    out = tmp_path / "scale.md"
    result = subprocess.run(
        [sys.executable, str(SCALE), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    measured_table, model = text.split("## The model, with this run's constants")
    rows = [line for line in measured_table.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| hosts | ours, lockstep (env steps/s) |")
    measured = [row.split("|")[1:-1] for row in rows[1:]]
    assert [int(cells[0]) for cells in measured] == [1, 4]
    for cells in measured:  # every variant stepped: a rate above zero, a CPU cost
        assert all(float(cell.replace(",", "")) > 0 for cell in cells[1:])
    assert "| hosts on their own machines |" in model and "| 1000 |" in model


def test_the_fabric_is_removed_whatever_happens():
    fabric = Fabric(3)
    with pytest.raises(RuntimeError, match="inside"), fabric.made():
        assert ip("netns", "exec", fabric.namespaces[2], "true").returncode == 0
        assert len(fabric.leftovers()) == 4  # three namespaces and the bridge, while made
        raise RuntimeError("inside")
    assert fabric.leftovers() == []
