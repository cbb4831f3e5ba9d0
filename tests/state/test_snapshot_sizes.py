"""The size table of docs/guides/env-state.md ("What it costs") is measured, and stays true.

The test takes each row's snapshot as a host takes it (``EnvBlock.get_states``: the bytes
``envs.get_state()`` returns) and checks the page's Bytes column against it, within
:data:`TOLERANCE`; the page lists exactly the rows measured here. Run as a script, this file
measures the whole table (bytes, and the best of :data:`REPEATS` times to take and to restore a
snapshot, the least disturbed by other work) and prints it, to paste into the page::

    .venv/bin/python tests/state/test_snapshot_sizes.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from envserver.host.worker import EnvBlock
from envserver.state import Snapshot

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "env-state.md"
#: How far the page's figure may be from the measured one (a fraction of it).
TOLERANCE = 0.01
#: How many times the script takes and restores each snapshot (it prints the best times).
REPEATS = 30


def _pong(**kwargs: object) -> gym.Env:
    return gym.make("ALE/Pong-v5", **kwargs)


def _pong_dqn() -> gym.Env:
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0)
    return gym.wrappers.FrameStackObservation(gym.wrappers.AtariPreprocessing(env), 4)


class Row(NamedTuple):
    """A row of the table: its label, its env stack, and how many actions before the snapshot."""

    label: str
    make: Callable[[], gym.Env]
    actions: int
    needs: str | None = None


ROWS = [
    Row("CartPole-v1", lambda: gym.make("CartPole-v1"), 50),
    Row("Hopper-v5", lambda: gym.make("Hopper-v5"), 50, "mujoco"),
    Row("Ant-v5", lambda: gym.make("Ant-v5"), 50, "mujoco"),
    Row("Humanoid-v5", lambda: gym.make("Humanoid-v5"), 50, "mujoco"),
    Row("Pong-v5, no sticky actions", lambda: _pong(repeat_action_probability=0.0), 50, "ale_py"),
    Row("Pong behind the DQN wrappers (4 frames stacked)", _pong_dqn, 50, "ale_py"),
    Row("Pong-v5, sticky, 100 actions into the episode", _pong, 100, "ale_py"),
    Row("Pong-v5, sticky, 500 actions into the episode", _pong, 500, "ale_py"),
    Row("LunarLander-v3 (its reset replayed), right after its reset",
        lambda: gym.make("LunarLander-v3"), 0, "Box2D"),
    Row("LunarLander-v3 (its reset replayed), 50 actions into the episode",
        lambda: gym.make("LunarLander-v3"), 50, "Box2D"),
]  # fmt: skip


def taken(row: Row) -> tuple[EnvBlock, bytes]:
    """The row's env in a block, reset (seed 0) and stepped (sampled actions), and its snapshot."""
    if row.needs == "ale_py":
        import ale_py

        gym.register_envs(ale_py)
    block = EnvBlock([row.make()], AutoresetMode.NEXT_STEP)
    block.reset([0], None)
    block.single_action_space.seed(1)
    for _ in range(row.actions):
        block.step(np.array([block.single_action_space.sample()]))
    return block, block.get_states()[0]


def page_sizes() -> dict[str, int]:
    """The Bytes column of the page's table, by its Env column."""
    text = PAGE.read_text()
    table = text[text.index("| Env | Bytes |") :].split("\n\n")[0]
    sizes = {}
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        sizes[cells[0]] = int(cells[1].replace(",", ""))
    return sizes


def test_the_pages_table_lists_the_rows_measured() -> None:
    assert list(page_sizes()) == [row.label for row in ROWS]


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.label)
def test_the_pages_snapshot_sizes_are_measured_ones(row: Row) -> None:
    if row.needs is not None:
        pytest.importorskip(row.needs)
    block, snapshot = taken(row)
    block.close()
    replay = Snapshot.from_bytes(snapshot).replay
    if replay is not None:  # its episode is as many actions in as the label says
        assert len(replay.actions) == row.actions
    written = page_sizes()[row.label]
    assert abs(written - len(snapshot)) <= TOLERANCE * len(snapshot), (
        f"the page says {written:,} bytes for {row.label!r}, a host takes {len(snapshot):,}: "
        f"run {Path(__file__).relative_to(PAGE.parents[2])} and paste its table"
    )


def _best_ms(run: Callable[[], object]) -> str:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    ms = min(times) * 1e3
    return f"{ms:.2f} ms" if ms < 1 else f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def measured_table() -> str:
    """The page's table, measured: bytes, and the best times to take and to restore."""
    lines = ["| Env | Bytes | Take | Restore |", "| --- | ---: | ---: | ---: |"]
    for row in ROWS:
        block, snapshot = taken(row)
        other = EnvBlock([row.make()], AutoresetMode.NEXT_STEP)
        other.reset([1], None)
        take = _best_ms(block.get_states)
        restore = _best_ms(lambda: other.set_states([snapshot]))  # noqa: B023 (run at once)
        lines.append(f"| {row.label} | {len(snapshot):,} | {take} | {restore} |")
        block.close()
        other.close()
    return "\n".join(lines)


if __name__ == "__main__":
    print(measured_table())
