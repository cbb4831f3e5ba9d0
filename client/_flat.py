"""``FlatAgentsVectorEnv``: a multi-agent vector env as one Gymnasium row per (env, agent).

For trainers written for SuperSuit's ``pettingzoo_env_to_vec_env_v1`` + ``concat_vec_envs_v1``
(parameter sharing): rows are env-major, agents in ``possible_agents`` order, so row
``i * num_agents + j`` is agent ``j`` of env ``i``, as in SuperSuit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, iterate

if TYPE_CHECKING:
    from ._multiagent import MultiAgentVectorEnv

__all__ = ["FlatAgentsVectorEnv"]

#: Infos keys the flat view builds itself, from the multi-agent ones.
_FINAL = ("final_obs", "final_info")


class FlatAgentsVectorEnv(VectorEnv):
    """A :class:`MultiAgentVectorEnv` whose agents share spaces, one row per (env, agent).

    A real ``gymnasium.vector.VectorEnv`` of ``num_envs * num_agents`` rows. A row whose agent
    is inactive has a zero observation, reward 0 and false flags (SuperSuit's "black death",
    without losing the deaths: each agent's last step is reported once, with its flags kept
    apart); ``infos["active"]`` marks the rows whose agent is active. Actions of inactive rows
    are not sent. An env's rows are reset together, when its last agent leaves, as the
    autoreset mode says (``SAME_STEP``: ``infos["final_obs"]``, an object array with each
    row's last observation, and its mask ``infos["_final_obs"]``, as Gymnasium gives them).

    Made by :meth:`MultiAgentVectorEnv.flat`; closing it closes the multi-agent vector env.

    Raises:
        ValueError: If the agents' spaces differ (the error names the agents that differ).
    """

    def __init__(self, envs: MultiAgentVectorEnv) -> None:
        agents = envs.possible_agents
        first = agents[0]
        observation = envs.single_observation_space(first)
        action = envs.single_action_space(first)
        differ = [
            f"{a} ({what} {space})"
            for a in agents[1:]
            for what, space, shared in (
                ("observation space", envs.single_observation_space(a), observation),
                ("action space", envs.single_action_space(a), action),
            )
            if space != shared
        ]
        if differ:
            raise ValueError(
                "a flat view needs agents that share their spaces, but these differ from "
                f"{first}'s ({observation}, {action}): {', '.join(differ)}"
            )
        self.multi_agent = envs
        self.num_agents = len(agents)
        self.num_envs = envs.num_envs * self.num_agents
        self.single_observation_space = observation
        self.single_action_space = action
        self.observation_space = batch_space(observation, self.num_envs)
        self.action_space = batch_space(action, self.num_envs)
        self.metadata = envs.metadata
        self.render_mode = envs.render_mode

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (env ``i``, rows ``i * num_agents ...``, seeded ``seed + i``)."""
        obs, infos = self.multi_agent.reset(seed=seed, options=options)
        return self._rows(obs), self._infos(infos)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Steps every env with its rows' actions (only active agents' reach the env)."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions (one per row), got {len(actions)}")
        agents = self.multi_agent.possible_agents
        per_agent = {a: _column(actions, j, self.num_agents) for j, a in enumerate(agents)}
        obs, rewards, terminations, truncations, infos = self.multi_agent.step(per_agent)
        return (
            self._rows(obs),
            self._rows(rewards),
            self._rows(terminations),
            self._rows(truncations),
            self._infos(infos),
        )

    def _rows(self, per_agent: dict[str, Any]) -> Any:
        """Per-agent batches ``(num_envs, ...)`` as rows ``(num_envs * num_agents, ...)``."""
        return _interleave([per_agent[a] for a in self.multi_agent.possible_agents])

    def _infos(self, infos: dict[str, Any]) -> dict[str, Any]:
        """Each agent's batched infos as rows; the env's other keys repeated on its rows."""
        agents = self.multi_agent.possible_agents
        count = self.num_agents
        flat = _merge_rows([_of(infos, a) for a in agents])
        for key, value in infos.items():
            if key.removeprefix("_") in (*_FINAL, *agents):
                continue
            flat[key] = _repeat(value, count)
        active = self.multi_agent.active
        flat["active"] = _interleave([active[a] for a in agents])
        flat["_active"] = np.ones(self.num_envs, dtype=np.bool_)
        if "final_obs" in infos:
            self._final(infos, flat)
        return flat

    def _final(self, infos: dict[str, Any], flat: dict[str, Any]) -> None:
        """SAME_STEP's final observations and infos, one per row, as Gymnasium gives them."""
        agents = self.multi_agent.possible_agents
        final = infos["final_obs"]
        mask = _interleave([final[f"_{a}"] for a in agents])
        observations = np.full(self.num_envs, None, dtype=object)
        rows = _interleave([final[a] for a in agents])
        for r, value in enumerate(iterate(self.observation_space, rows)):
            if mask[r]:
                observations[r] = value
        flat["final_obs"], flat["_final_obs"] = observations, mask
        final_infos = infos.get("final_info", {})
        if final_infos:
            flat["final_info"] = _merge_rows([_of(final_infos, a) for a in agents])
            flat["_final_info"] = mask

    def render(self) -> tuple[Any, ...]:
        """Every env's frame (one per env, not per row)."""
        return self.multi_agent.render()

    def close_extras(self, **kwargs: Any) -> None:
        """Closes the multi-agent vector env."""
        self.multi_agent.close()

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """The multi-agent vector env's autoreset mode."""
        return self.multi_agent.autoreset_mode


def _column(actions: Any, j: int, count: int) -> Any:
    """Agent ``j``'s actions out of rows ``j, j + count, ...`` (Dict and Tuple batches too)."""
    if isinstance(actions, dict):
        return {k: _column(v, j, count) for k, v in actions.items()}
    if isinstance(actions, tuple):
        return tuple(_column(v, j, count) for v in actions)
    return np.asarray(actions)[j::count]


def _interleave(batches: list[Any]) -> Any:
    """Batches ``(N, ...)``, one per agent, as ``(N * A, ...)`` rows, env-major."""
    first = batches[0]
    if isinstance(first, dict):
        return {k: _interleave([b[k] for b in batches]) for k in first}
    if isinstance(first, tuple):
        return tuple(_interleave([b[i] for b in batches]) for i in range(len(first)))
    stacked = np.stack([np.asarray(b) for b in batches], axis=1)
    return stacked.reshape(-1, *stacked.shape[2:])


def _repeat(value: Any, count: int) -> Any:
    """An env's batched info value on each of its ``count`` rows."""
    if isinstance(value, dict):
        return {k: _repeat(v, count) for k, v in value.items()}
    return np.repeat(np.asarray(value), count, axis=0)


def _of(infos: dict[str, Any], agent: str) -> dict[str, Any]:
    """An agent's batched infos (each key with its mask), empty where the agent has none."""
    info = infos.get(agent)
    return info if isinstance(info, dict) else {}


def _merge_rows(per_agent: list[dict[str, Any]]) -> dict[str, Any]:
    """Agents' batched infos (Gymnasium's form) merged into rows: key by key, with masks.

    An agent without a key has zeros (``None`` in object arrays) and a false mask there.
    """
    keys: list[str] = []
    for info in per_agent:
        keys += [k for k in info if k not in keys]
    merged: dict[str, Any] = {}
    for key in keys:
        present = [info for info in per_agent if key in info]
        template = present[0][key]
        if isinstance(template, dict):
            merged[key] = _merge_rows([info.get(key, {}) for info in per_agent])
            continue
        parts = [info[key] if key in info else _blank(template) for info in per_agent]
        merged[key] = _interleave(parts)
    return merged


def _blank(template: Any) -> Any:
    """An all-empty batch shaped as ``template``: zeros, false masks, ``None`` objects."""
    array = np.asarray(template)
    if array.dtype == object:
        return np.full(array.shape, None, dtype=object)
    return np.zeros_like(array)
