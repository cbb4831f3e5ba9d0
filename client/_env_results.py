"""The last results of every env: the buffers lockstep calls fill and hand out."""

from __future__ import annotations

import copy as copy_module
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate

from envserver.wire.batching import Index, empty_batch, merge, select
from envserver.wire.replies import ResetReply, StepReply

from ._infos import InfoBatch
from ._results import Ready, add_infos, copied, merged
from ._transport.connection import HostConnection

__all__ = ["EnvResults"]


class EnvResults:
    """Every env's last observation, reward and flags, merged from the hosts' replies.

    It owns the observation batch (the buffer ``copy=False`` hands out), the rewards, the
    termination and truncation flags, and which envs ended their episodes (the envs an autoreset
    resets, and that DISABLED mode refuses to step). Lockstep calls merge whole host blocks or
    parts of them; first-ready batches write the envs they hand out.

    Args:
        num_envs: The number of envs.
        space: One env's observation space.
        autoreset_mode: The vector env's autoreset mode.
        info_format: ``"dict"`` or ``"list"`` (see :class:`~envserver.client._infos.InfoBatch`).
        copy: Whether the observation batch is handed out as a copy.
    """

    def __init__(
        self,
        num_envs: int,
        space: gym.Space,
        autoreset_mode: AutoresetMode,
        info_format: str,
        copy: bool,
    ) -> None:
        self.space = space
        self.autoreset_mode = autoreset_mode
        self.copy = copy
        #: The last observation of every env (the batch handed out when ``copy`` is False).
        self.observations = empty_batch(space, num_envs)
        self.rewards = np.zeros(num_envs, dtype=np.float64)
        #: Every env's termination (row 0) and truncation (row 1) flags, in one array.
        self.flags = np.zeros((2, num_envs), dtype=np.bool_)
        self.terminations, self.truncations = self.flags  # views of its rows
        #: Which envs ended their episodes at their last step (and were not reset since).
        self.autoreset_envs = np.zeros(num_envs, dtype=np.bool_)
        self.infos = InfoBatch(num_envs, info_format)

    def merge_reset(
        self,
        infos: Any,
        connection: HostConnection,
        env_ids: list[int] | None,
        reply: ResetReply,
    ) -> Any:
        """Writes one host's reset results (for ``env_ids`` of its block, or all).

        Returns:
            The infos, with the host's added.
        """
        index = _index(connection, env_ids)
        reset = Ready.of(connection, np.arange(connection.block.count), reply)
        self.clear_ended(index)
        self.observations = merged(connection, self.space, self.observations, reset.obs, index)
        return add_infos(self.infos, infos, connection, reset.entries)

    def merge_step(
        self,
        infos: Any,
        connection: HostConnection,
        env_ids: list[int] | None,
        reply: StepReply,
    ) -> Any:
        """Writes one host's step results (for ``env_ids`` of its block, or all).

        Returns:
            The infos, with the host's added.
        """
        index = _index(connection, env_ids)
        count = connection.block.count if env_ids is None else len(env_ids)
        step = Ready.of(connection, np.arange(count), reply)
        self.rewards[index] = step.rewards
        self.terminations[index] = step.terminations
        self.truncations[index] = step.truncations
        self.observations = merged(connection, self.space, self.observations, step.obs, index)
        return add_infos(self.infos, infos, connection, step.entries)

    def step_result(self, infos: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """What ``step`` returns, once every host's results are merged.

        It also marks the envs whose episodes just ended, for the next step.
        """
        self.autoreset_envs = np.logical_or(self.terminations, self.truncations)
        return (
            self.hand_out(self.observations),
            self.rewards.copy(),
            self.terminations.copy(),
            self.truncations.copy(),
            infos,
        )

    def note_batch(self, env_ids: np.ndarray, observations: Any, ended: np.ndarray) -> None:
        """Notes the envs of a first-ready batch handed out (sorted ids): observations, flags."""
        self.autoreset_envs[env_ids] = ended
        self.observations = merge(self.space, self.observations, observations, env_ids.tolist())

    def restored(self, env_ids: list[int], observations: list[Any], ended: list[bool]) -> None:
        """Notes envs restored from snapshots: their observations and whether they ended."""
        block = concatenate(self.space, observations, empty_batch(self.space, len(env_ids)))
        self.observations = merge(self.space, self.observations, block, env_ids)
        self.autoreset_envs[env_ids] = ended

    def clear_ended(self, index: Index) -> None:
        """Notes that the envs at ``index`` are being reset: their episodes start anew."""
        self.autoreset_envs[index] = False

    def observation_batch(self) -> Any:
        """The observation batch, as handed out (see :meth:`hand_out`)."""
        return self.hand_out(self.observations)

    def hand_out(self, observations: Any) -> Any:
        """``observations`` as handed out: copied if the vector env hands out copies."""
        return copied(observations) if self.copy else observations

    def last_observations(self, positions: Sequence[int]) -> Any:
        """A copy of the last observations of the envs at ``positions``."""
        return copy_module.deepcopy(select(self.space, self.observations, list(positions)))

    def refuse_finished(self, ids: np.ndarray | None, how: str) -> None:
        """In DISABLED mode, refuses to step envs whose episodes ended, as SyncVectorEnv does.

        Args:
            ids: The envs to be stepped (None: all).
            how: How to reset them, for the message.

        Raises:
            AssertionError: Naming the envs and how to reset them.
        """
        if self.autoreset_mode != AutoresetMode.DISABLED:
            return
        ids = np.arange(len(self.autoreset_envs)) if ids is None else ids
        if self.autoreset_envs[ids].any():
            finished = ids[self.autoreset_envs[ids]].tolist()
            raise AssertionError(
                f"envs {finished} ended their episodes and autoreset_mode is DISABLED: reset "
                f"them ({how}) before stepping them again"
            )


def _index(connection: HostConnection, env_ids: list[int] | None) -> Index:
    """Where a host's envs (``env_ids`` of its block, or all) sit in the batch."""
    if env_ids is None:
        return slice(connection.block.start, connection.block.stop)
    return [connection.block.start + i for i in env_ids]
