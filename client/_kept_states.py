"""What ``on_host_failure="restore"`` keeps to bring lost envs back as they were.

Every env's last snapshot (taken after every reset, and every ``snapshot_every`` steps) and the
batched actions of every step since, and of the step under way. A recovery restores a block's
snapshots on the host that replaces it and takes those steps again (see ``Recovery``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["KeptStates"]


class KeptStates:
    """Every env's last snapshot, and the actions since.

    Args:
        num_envs: The number of envs.
        every: How many steps apart snapshots are taken.
    """

    def __init__(self, num_envs: int, every: int) -> None:
        self.every = every
        self._states: list[bytes | None] = [None] * num_envs
        self._steps: list[Any] = []  # the batched actions of each step since the snapshots
        self._in_flight: Any = None  # those of the step under way

    @property
    def due(self) -> bool:
        """Whether snapshots are to be taken now (none yet, or ``every`` steps since)."""
        return len(self._steps) >= self.every or None in self._states

    @property
    def size(self) -> int:
        """How many bytes the snapshots kept take."""
        return sum(len(state) for state in self._states if state is not None)

    def taken(self, states: Sequence[bytes]) -> None:
        """Keeps every env's snapshot just taken; no step since."""
        self._states = list(states)
        self._steps.clear()

    def forget(self, start: int, stop: int) -> None:
        """Forgets the snapshots of envs ``start:stop`` (they lost their state: reset anew)."""
        self._states[start:stop] = [None] * (stop - start)

    def stepping(self, actions: Any) -> None:
        """Notes the actions of the step being sent (a batch the caller will not change)."""
        self._in_flight = actions

    def stepped(self) -> None:
        """Notes that the step sent was taken by every env."""
        self._steps.append(self._in_flight)
        self._in_flight = None

    def of_block(self, start: int, stop: int) -> tuple[list[bytes], list[Any], Any] | None:
        """What a recovery of envs ``start:stop`` needs; None if a snapshot is missing.

        Returns:
            Their snapshots, the batched actions (of all envs) of every step since, and those
            of the step under way (None between steps).
        """
        states = self._states[start:stop]
        if any(state is None for state in states):
            return None
        return states, list(self._steps), self._in_flight  # type: ignore[return-value]
