"""The rows of a multi-agent vector env: its envs' batches read back out per agent.

A reset's or step's batch comes in the agents layout (:mod:`envserver.wire.agents`): per env,
the agents' columns and who is active. :class:`AgentRows` keeps what the next step needs from
it (the observations, who is active and who acts next, the action masks infos gave) and writes
what Gymnasium's vector envs give for an end step (``SAME_STEP``'s final observations per agent)
and for envs lost with their host.
"""

from __future__ import annotations

import copy as copy_module
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate

from envserver.wire.agents import ACTIVE, AGENTS, COLUMNS, AgentLayout
from envserver.wire.batching import empty_batch, merge

__all__ = ["ACTION_MASK", "AgentRows"]

#: The key of an action mask in an observation dict or in an agent's infos.
ACTION_MASK = "action_mask"


class AgentRows:
    """Per env and agent: the last observations, who is active, who acts next, its masks.

    Args:
        layout: The envs' agents layout.
        num_envs: The number of envs.
        autoreset_mode: The vector env's autoreset mode.
    """

    def __init__(self, layout: AgentLayout, num_envs: int, autoreset_mode: AutoresetMode) -> None:
        self._layout = layout
        self._agents = list(layout.agents)
        self.num_envs = num_envs
        self.autoreset_mode = autoreset_mode
        count = (num_envs, len(self._agents))
        #: Per env and agent: whether it acts on the next step.
        self.live = np.zeros(count, dtype=np.bool_)
        self._active = np.zeros(count, dtype=np.bool_)
        #: Each agent's batched observations of the last reset or step.
        self.obs: dict[str, Any] = {}
        #: Per agent whose infos hold action masks: each env's last (false where none).
        self._info_masks: dict[str, np.ndarray] = {}

    def parallel_infos(self, info: dict[str, Any]) -> dict[str, Any]:
        """One env's infos, with an end step's ``final_obs`` as the Parallel env gave it.

        That is each agent's last observation, of the agents that had one (``SAME_STEP``).
        """
        final = info.get("final_obs")
        if not isinstance(final, dict) or AGENTS not in final:
            return info
        active = final[ACTIVE]
        obs = {a: final[AGENTS][a] for j, a in enumerate(self._agents) if active[j]}
        return {**info, "final_obs": obs}

    def take(
        self, batch: dict[str, Any], infos: dict[str, Any], rows: np.ndarray | None = None
    ) -> list[np.ndarray]:
        """Takes a reset's or step's batch: the observations, who is active and live next.

        The masks of the infos are taken for the envs ``rows`` (default: all).
        """
        columns = [batch[key] for key in COLUMNS]
        _, terminated, truncated, active = columns
        self.obs = batch[AGENTS]
        self._active = active
        self.live = active & ~terminated & ~truncated
        self._take_info_masks(infos, rows)
        return columns

    def _take_info_masks(self, infos: dict[str, Any], rows: np.ndarray | None) -> None:
        """Notes the action masks each agent's infos hold, for the envs ``rows`` (default: all).

        The other envs keep theirs: a masked reset's infos hold only the envs it reset.
        """
        masks = {} if rows is None else self._info_masks
        for agent in self._agents:
            info = infos.get(agent)
            if isinstance(info, dict) and ACTION_MASK in info:
                given = info[ACTION_MASK].astype(np.bool_)
                given[~info[f"_{ACTION_MASK}"]] = False
            elif agent in masks:
                given = np.zeros_like(masks[agent])
            else:
                continue
            if rows is None or agent not in masks:
                masks[agent] = given  # false in the envs its infos left out
            else:
                masks[agent][rows] = given[rows]
        self._info_masks = masks

    def final(self, columns: list[np.ndarray], infos: dict[str, Any]) -> list[np.ndarray]:
        """SAME_STEP: the step's values of envs that were reset come from their final obs.

        Gymnasium gives each env's final observation in an object array; here each agent's
        are batched (zeros where the env did not end or the agent had none), with a mask.
        """
        ended = infos.pop("_final_obs")
        final = infos.pop("final_obs")
        rows = np.flatnonzero(ended)
        columns = [column.copy() for column in columns]
        for key, column in zip(COLUMNS, columns):
            for i in rows:
                column[i] = final[i][key]
        active = columns[3]
        per_agent: dict[str, Any] = {}
        for j, agent in enumerate(self._agents):
            space = self._layout.observation_spaces[agent]
            block = concatenate(
                space, [final[i][AGENTS][agent] for i in rows], empty_batch(space, len(rows))
            )
            per_agent[agent] = merge(space, empty_batch(space, self.num_envs), block, rows)
            per_agent[f"_{agent}"] = ended & active[:, j]
        infos["final_obs"], infos["_final_obs"] = per_agent, ended
        return columns

    def lost(
        self, columns: list[np.ndarray], infos: dict[str, Any], live: np.ndarray
    ) -> list[np.ndarray]:
        """Envs lost with their host: every agent that was live truncated, once.

        The last observations stand for the lost envs' (in ``final_obs`` with SAME_STEP); an
        agent that had left before is inactive there, so its row is zeros.
        """
        lost = infos["_host_failure"]
        reward, terminated, truncated, active = (column.copy() for column in columns)
        reward[lost] = 0.0
        terminated[lost] = False
        truncated[lost] = live[lost]
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            final = infos["final_obs"] = self._zeroed(infos["final_obs"], lost, live)
            for j, agent in enumerate(self._agents):
                final[f"_{agent}"][lost] = live[lost, j]
        else:  # they end here
            self.obs = self._zeroed(self.obs, lost, live)
            active[lost] = live[lost]
            self._active = active
            self.live[lost] = False
        return [reward, terminated, truncated, active]

    def _zeroed(self, batches: dict[str, Any], lost: np.ndarray, live: np.ndarray) -> dict:
        """``batches`` (per agent), zeros in the rows of lost envs where the agent is not live."""
        batches = dict(batches)
        for j, agent in enumerate(self._agents):
            rows = np.flatnonzero(lost & ~live[:, j])
            if len(rows):
                space = self._layout.observation_spaces[agent]
                zeros = empty_batch(space, len(rows))
                batches[agent] = merge(space, copy_module.deepcopy(batches[agent]), zeros, rows)
        return batches

    @property
    def active(self) -> dict[str, np.ndarray]:
        """Per agent, the envs where it has an observation now (``MultiAgentVectorEnv.active``)."""
        return {a: self._active[:, j] for j, a in enumerate(self._agents)}

    @property
    def ended(self) -> np.ndarray:
        """Per env, whether none of its agents is left to act (``MultiAgentVectorEnv.ended``)."""
        return ~self.live.any(axis=1)

    def action_masks(self) -> dict[str, np.ndarray]:
        """Per agent that has one, its action masks, from its observation or else its infos."""
        masks = {}
        for j, agent in enumerate(self._agents):
            obs = self.obs.get(agent)
            if isinstance(obs, dict) and ACTION_MASK in obs:
                mask = obs[ACTION_MASK].astype(np.bool_)
            elif agent in self._info_masks:
                mask = self._info_masks[agent].copy()
            else:
                continue
            mask[~self._active[:, j]] = False
            masks[agent] = mask
        return masks
