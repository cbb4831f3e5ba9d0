"""One env of a MultiAgentVectorEnv seen as a PettingZoo Parallel env, for PettingZoo's API test.

:class:`OneRemoteEnv` holds a vector env of one env (autoreset DISABLED) and answers as the env
itself would: results only for the agents active in it, ``agents`` the live ones. Actions of
agents that are not live are filled in with samples, which the vector env does not send.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from agent_loop import env_infos, row
from gymnasium.vector.utils import concatenate, create_empty_array

from envserver.client import MultiAgentVectorEnv

__all__ = ["OneRemoteEnv"]


class OneRemoteEnv:
    """A served Parallel env, one at a time: ``envs`` must hold one env, autoreset DISABLED."""

    def __init__(self, envs: MultiAgentVectorEnv) -> None:
        assert envs.num_envs == 1
        self.envs = envs
        self.possible_agents = list(envs.possible_agents)
        self.agents: list[str] = []
        self.metadata = envs.metadata
        self.render_mode = envs.render_mode

    @property
    def unwrapped(self) -> OneRemoteEnv:
        return self

    def observation_space(self, agent: str) -> Any:
        return self.envs.single_observation_space(agent)

    def action_space(self, agent: str) -> Any:
        return self.envs.single_action_space(agent)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, infos = self.envs.reset(seed=seed, options=options)
        present = self._present()
        self.agents = present
        return self._of(obs, present), self._infos(infos, present)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        batch = {}
        for agent in self.possible_agents:
            space = self.action_space(agent)
            value = actions[agent] if agent in actions else space.sample()
            batch[agent] = concatenate(space, [value], create_empty_array(space, 1, fn=np.zeros))
        obs, rewards, terminations, truncations, infos = self.envs.step(batch)
        present = self._present()
        flags = {a: (bool(terminations[a][0]), bool(truncations[a][0])) for a in present}
        self.agents = [a for a in present if not any(flags[a])]
        return (
            self._of(obs, present),
            {a: float(rewards[a][0]) for a in present},
            {a: flags[a][0] for a in present},
            {a: flags[a][1] for a in present},
            self._infos(infos, present),
        )

    def _present(self) -> list[str]:
        return [a for a in self.possible_agents if self.envs.active[a][0]]

    @staticmethod
    def _of(obs: dict[str, Any], agents: list[str]) -> dict[str, Any]:
        return {a: row(obs[a], 0) for a in agents}

    @staticmethod
    def _infos(infos: dict[str, Any], agents: list[str]) -> dict[str, Any]:
        mine = env_infos(infos, 0)
        return {a: mine.get(a, {}) for a in agents}

    def close(self) -> None:
        self.envs.close()
