"""Which envs were lost with a host re-made, until each has reported its loss once.

A lost env reports one truncated step (``infos["host_failure"]``) at its next step, or the flag
with its next reset; lockstep calls and first-ready batches ask the :class:`Ledger` which envs
are lost and for the report where they merge results.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envserver.wire.replies import ResetReply, StepReply

from .._env_results import EnvResults
from .._transport.connection import HostConnection

__all__ = ["Ledger"]


class Ledger:
    """The lost envs, and in SAME_STEP mode the fresh reset each one reports.

    Args:
        num_envs: The number of envs.
        results: The envs' last results (a lost env reports its last observation).
        autoreset_mode: The envs' autoreset mode (SAME_STEP reports a fresh observation).
    """

    def __init__(self, num_envs: int, results: EnvResults, autoreset_mode: AutoresetMode) -> None:
        self._results = results
        self._same_step = autoreset_mode == AutoresetMode.SAME_STEP
        self._lost = np.zeros(num_envs, dtype=np.bool_)
        self._fresh: dict[int, tuple[Any, dict[str, Any]]] = {}  # SAME_STEP: (obs, info) per env
        #: Whether some envs have yet to report their loss (read on every step: no call).
        self.any_lost = False

    def lost_mask(self, ids: np.ndarray) -> np.ndarray:
        """Which of the envs ``ids`` have yet to report their loss (a mask over ``ids``)."""
        return self._lost[ids]

    def lost_in(self, connection: HostConnection) -> list[int]:
        """The envs of ``connection``'s block (indices in it) that have yet to report."""
        return np.flatnonzero(self._lost[connection.block.start : connection.block.stop]).tolist()

    def mark_lost(self, connection: HostConnection) -> None:
        """Marks the envs of ``connection``'s block lost (re-created, fresh)."""
        self._lost[connection.block.start : connection.block.stop] = True
        self.any_lost = True

    def keep_fresh(self, connection: HostConnection, reset: ResetReply) -> None:
        """Keeps the reset of re-created envs (SAME_STEP), for each one's report."""
        infos = dict(reset.infos)
        each = iterate(batch_space(self._results.space, connection.block.count), reset.obs)
        for i, obs in enumerate(each):
            self._fresh[connection.block.start + i] = (copy.deepcopy(obs), infos.get(i, {}))

    def lost_step(self, connection: HostConnection, local: list[int]) -> StepReply:
        """:meth:`loss_report` for the lost envs ``local``, which have then reported it."""
        report = self.loss_report(connection, local)
        self.reported(connection, local)
        return report

    def loss_report(self, connection: HostConnection, local: list[int]) -> StepReply:
        """Host-shaped step results for lost envs (by index in the block): truncated episodes.

        NEXT_STEP and DISABLED report the last observation the client saw; SAME_STEP reports
        the fresh reset observation, with the last one as ``final_obs``. Nothing changes until
        :meth:`reported` says the report was handed out.
        """
        count = len(local)
        space = self._results.space
        positions = [connection.block.start + i for i in local]
        last = self._results.last_observations(positions)
        if self._same_step:
            fresh = [self._fresh[p] for p in positions]
            obs = concatenate(
                space, [o for o, _ in fresh], create_empty_array(space, count, fn=np.zeros)
            )
            entries = []
            for i, final, (_, info) in zip(local, iterate(batch_space(space, count), last), fresh):
                entries.append([i, {"final_obs": final, "final_info": {}}])
                entries.append([i, {**info, "host_failure": True}])
        else:
            obs, entries = last, [[i, {"host_failure": True}] for i in local]
        return StepReply(
            obs,
            np.zeros(count),
            np.zeros(count, dtype=np.bool_),
            np.ones(count, dtype=np.bool_),
            entries,
        )

    def found(self, connection: HostConnection, local: Sequence[int]) -> list[list[Any]]:
        """The info entries that flag lost envs a reset just brought back (``host_failure``).

        Nothing changes until :meth:`reported` says they were handed out.
        """
        start = connection.block.start
        return [[int(i), {"host_failure": True}] for i in local if self._lost[start + i]]

    def reported(self, connection: HostConnection, local: Sequence[int]) -> None:
        """Notes that the envs ``local`` of ``connection``'s block reported their loss."""
        for i in local:
            position = connection.block.start + i
            self._lost[position] = False
            self._fresh.pop(position, None)
        self.any_lost = b"\x01" in self._lost.tobytes()  # cheaper than ndarray.any
