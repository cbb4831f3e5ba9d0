"""The multi-agent oracle: PettingZoo Parallel envs stepped in a plain loop, in this process.

:class:`AgentLoop` steps the same envs a :class:`~envserver.client.MultiAgentVectorEnv` serves
(same seeds, same actions) and lays its results out as that vector env promises to, written from
the promise (its docstring) and PettingZoo's API, not from the host's code: one batch per
possible agent; an agent without results in an env has zeros, reward 0 and false flags; actions
go to an env's live agents only; an env whose agents are all gone is reset as the autoreset
mode says. Infos stay per env (a list of dicts), each agent's empty dict left out, for
:func:`env_infos` to compare with the vector env's batched infos.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import create_empty_array

__all__ = ["AgentLoop", "Results", "env_infos", "masked_actions", "row", "same", "set_row"]


class Results:
    """One reset's or step's results, laid out per agent (rewards and flags only for a step)."""

    def __init__(self, agents: Sequence[str], num_envs: int, spaces: dict[str, Any]) -> None:
        self.obs = {a: create_empty_array(spaces[a], num_envs, fn=np.zeros) for a in agents}
        self.rewards = {a: np.zeros(num_envs) for a in agents}
        self.terminations = {a: np.zeros(num_envs, dtype=bool) for a in agents}
        self.truncations = {a: np.zeros(num_envs, dtype=bool) for a in agents}
        self.active = {a: np.zeros(num_envs, dtype=bool) for a in agents}
        self.infos: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        #: SAME_STEP: per env whose episode ended, its final observations and infos.
        self.final_obs: dict[int, dict[str, Any]] = {}
        self.final_infos: dict[int, dict[str, Any]] = {}


class AgentLoop:
    """Parallel envs stepped one after another, as the reference for a multi-agent vector env.

    Args:
        env_fns: One factory per env, returning a PettingZoo Parallel env.
        autoreset_mode: Gymnasium's autoreset mode, applied per env.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], autoreset_mode: AutoresetMode) -> None:
        self.envs = [fn() for fn in env_fns]
        self.agents = list(self.envs[0].possible_agents)
        self.spaces = {a: self.envs[0].observation_space(a) for a in self.agents}
        self.mode = autoreset_mode
        self.live: list[list[str]] = [[] for _ in self.envs]
        self.ended = [False] * len(self.envs)

    def reset(self, seed: int | None = None, mask: Sequence[bool] | None = None) -> Results:
        """Resets every env (or those ``mask`` marks), env ``i`` with ``seed + i``."""
        results = Results(self.agents, len(self.envs), self.spaces)
        for i, env in enumerate(self.envs):
            if mask is not None and not mask[i]:
                continue
            obs, infos = env.reset(seed=None if seed is None else seed + i)
            self._put(results, i, obs, infos)
            self.live[i], self.ended[i] = list(env.agents), False
        return results

    def step(self, actions: dict[str, Any]) -> Results:
        """Steps every env with its live agents' actions (row ``i`` of each agent's batch)."""
        results = Results(self.agents, len(self.envs), self.spaces)
        for i, env in enumerate(self.envs):
            if self.ended[i] and self.mode == AutoresetMode.NEXT_STEP:
                obs, infos = env.reset()
                self._put(results, i, obs, infos)
                self.live[i], self.ended[i] = list(env.agents), False
                continue
            assert not self.ended[i], "the test steps an env whose episode ended (DISABLED)"
            given = {a: row(actions[a], i) for a in self.live[i]}
            obs, rewards, terminations, truncations, infos = env.step(given)
            self.live[i] = [
                a for a in env.agents if not (terminations.get(a) or truncations.get(a))
            ]
            self.ended[i] = not self.live[i]
            if self.ended[i] and self.mode == AutoresetMode.SAME_STEP:
                results.final_obs[i] = obs
                results.final_infos[i] = _kept(infos)
                for agent in obs:
                    results.rewards[agent][i] = rewards.get(agent, 0.0)
                    results.terminations[agent][i] = bool(terminations.get(agent))
                    results.truncations[agent][i] = bool(truncations.get(agent))
                obs, infos = env.reset()
                self._put(results, i, obs, infos)
                self.live[i], self.ended[i] = list(env.agents), False
                continue
            self._put(results, i, obs, infos, (rewards, terminations, truncations))
        return results

    def _put(
        self,
        results: Results,
        i: int,
        obs: dict[str, Any],
        infos: dict[str, Any],
        values: tuple[dict, dict, dict] | None = None,
    ) -> None:
        """Env ``i``'s observations and infos; its agents' rewards and flags where given."""
        for agent, value in obs.items():
            set_row(results.obs[agent], i, value)
            results.active[agent][i] = True
            if values is not None:
                rewards, terminations, truncations = values
                results.rewards[agent][i] = rewards.get(agent, 0.0)
                results.terminations[agent][i] = bool(terminations.get(agent))
                results.truncations[agent][i] = bool(truncations.get(agent))
        results.infos[i] = _kept(infos)

    def masks(self, results: Results) -> dict[str, np.ndarray]:
        """Each agent's action masks from its observations or infos; false where inactive."""
        masks: dict[str, np.ndarray] = {}
        for agent in self.agents:
            obs = results.obs[agent]
            if isinstance(obs, dict) and "action_mask" in obs:
                masks[agent] = obs["action_mask"].astype(bool) & results.active[agent][:, None]
                continue
            rows = [info.get(agent, {}).get("action_mask") for info in results.infos]
            if any(row is not None for row in rows):
                size = next(len(row) for row in rows if row is not None)
                masks[agent] = np.array(
                    [np.zeros(size, bool) if row is None else np.asarray(row, bool) for row in rows]
                )
        return masks

    def close(self) -> None:
        for env in self.envs:
            env.close()


def masked_actions(
    rng: np.random.Generator,
    spaces: dict[str, Any],
    masks: dict[str, np.ndarray],
    num_envs: int,
) -> dict[str, Any]:
    """A batch of actions per agent drawn from its space, only allowed actions where masked."""
    actions: dict[str, Any] = {}
    for agent, space in spaces.items():
        rows = []
        for i in range(num_envs):
            mask = masks.get(agent)
            if mask is not None and mask[i].any():
                rows.append(np.int64(rng.choice(np.flatnonzero(mask[i]))))
            else:
                space.seed(int(rng.integers(2**31)))
                rows.append(space.sample())
        actions[agent] = np.stack([np.asarray(row) for row in rows]).astype(space.dtype)
    return actions


def env_infos(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s infos out of Gymnasium's batched form (a dict of arrays and ``_key`` masks)."""
    out = {}
    for key, value in infos.items():
        if key.startswith("_") or not infos[f"_{key}"][i]:
            continue
        out[key] = env_infos(value, i) if isinstance(value, dict) else value[i]
    return out


def same(a: Any, b: Any) -> bool:
    """Whether two nested values hold the same data (numpy scalars equal to Python numbers)."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(same(a[k], b[k]) for k in a)
        )
    x, y = np.asarray(a), np.asarray(b)
    return x.shape == y.shape and bool(np.array_equal(x, y))


def _kept(infos: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (infos or {}).items() if not (isinstance(v, dict) and not v)}


def row(batch: Any, i: int) -> Any:
    """Row ``i`` of a batch (nested as Gymnasium batches Dict spaces)."""
    if isinstance(batch, dict):
        return {k: row(v, i) for k, v in batch.items()}
    return batch[i]


def set_row(batch: Any, i: int, value: Any) -> None:
    """Writes one env's value into row ``i`` of a batch."""
    if isinstance(batch, dict):
        for key, part in batch.items():
            set_row(part, i, value[key])
    else:
        batch[i] = value
