"""The agents layout: a PettingZoo Parallel env's values carried as one Gymnasium env's.

A host asked to make Parallel envs (MAKE ``"kind": "parallel"``) serves each as one env of its
session: sessions, steps (the raw step included), autoreset, recovery and infos then work as for
any env, and the client's multi-agent vector env reads every agent's values out of the batch.
With ``A`` agents (the env's ``possible_agents``, in that order), the env's spaces are::

    observation: Dict(agents=Dict({agent: that agent's observation space, ...}),
                      reward=Box(-inf, inf, (A,), float64),
                      terminated=Box(0, 1, (A,), bool),
                      truncated=Box(0, 1, (A,), bool),
                      active=Box(0, 1, (A,), bool))
    action:      Dict({agent: that agent's action space, ...})

Column ``j`` of ``reward``, ``terminated``, ``truncated`` and ``active`` is agent ``j``'s. An
agent is *active* on a reset or step whose results hold it (the step on which it leaves
included); an inactive agent's observation is zeros, its reward 0 and its flags false. The env's
own reward is the sum of its active agents' rewards; its episode ends once no agent is left to
act, terminated if an agent terminated on that step, else truncated. ``docs/protocol.md`` (Parallel
envs) is the normative text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from envserver.errors import ProtocolError

__all__ = ["ACTIVE", "AGENTS", "COLUMNS", "REWARD", "TERMINATED", "TRUNCATED", "AgentLayout"]

#: The observation's keys.
AGENTS, REWARD, TERMINATED, TRUNCATED, ACTIVE = (
    "agents",
    "reward",
    "terminated",
    "truncated",
    "active",
)
#: The per-agent columns, in the observation's order (after the agents' observations).
COLUMNS = (REWARD, TERMINATED, TRUNCATED, ACTIVE)


@dataclass(frozen=True)
class AgentLayout:
    """The agents of a Parallel env and their spaces; the one env's spaces built from them.

    Attributes:
        agents: The agents' names, in ``possible_agents`` order.
        observation_spaces: Each agent's observation space.
        action_spaces: Each agent's action space.
    """

    agents: tuple[str, ...]
    observation_spaces: dict[str, spaces.Space]
    action_spaces: dict[str, spaces.Space]

    @classmethod
    def of(
        cls,
        agents: Sequence[Any],
        observation_space: Callable[[Any], spaces.Space],
        action_space: Callable[[Any], spaces.Space],
    ) -> AgentLayout:
        """The layout of ``agents``, their spaces asked of the env's space methods.

        Raises:
            TypeError: If there are no agents, a name is not a string, or a name repeats.
        """
        names = tuple(agents)
        if not names:
            raise TypeError("the env's possible_agents is empty")
        odd = [a for a in names if not isinstance(a, str)]
        if odd:
            raise TypeError(f"agent names must be strings, got {odd[0]!r} in possible_agents")
        if len(set(names)) != len(names):
            raise TypeError(f"possible_agents names an agent twice: {list(names)}")
        return cls(
            names,
            {a: observation_space(a) for a in names},
            {a: action_space(a) for a in names},
        )

    @classmethod
    def from_spaces(cls, observation: spaces.Space, action: spaces.Space) -> AgentLayout:
        """Reads the layout back from the one env's spaces (as a client learns them).

        Raises:
            ProtocolError: If the spaces are not this layout's.
        """
        if not (
            isinstance(observation, spaces.Dict)
            and list(observation.spaces) == [AGENTS, *COLUMNS]
            and isinstance(observation[AGENTS], spaces.Dict)
            and isinstance(action, spaces.Dict)
            and list(action.spaces) == list(observation[AGENTS].spaces)
        ):
            raise ProtocolError("the host's spaces are not those of a Parallel env's agents")
        agents = tuple(observation[AGENTS].spaces)
        if observation.spaces[REWARD] != _column(len(agents), np.float64) or any(
            observation.spaces[key] != _column(len(agents), np.bool_) for key in COLUMNS[1:]
        ):
            raise ProtocolError("the host's per-agent columns are not the layout's")
        return cls(agents, dict(observation[AGENTS].spaces), dict(action.spaces))

    def observation_space(self) -> spaces.Dict:
        """The one env's observation space."""
        count = len(self.agents)
        return spaces.Dict(
            [
                (AGENTS, spaces.Dict([(a, self.observation_spaces[a]) for a in self.agents])),
                (REWARD, _column(count, np.float64)),
                *((key, _column(count, np.bool_)) for key in COLUMNS[1:]),
            ]
        )

    def action_space(self) -> spaces.Dict:
        """The one env's action space."""
        return spaces.Dict([(a, self.action_spaces[a]) for a in self.agents])


def _column(count: int, dtype: type) -> spaces.Box:
    if dtype is np.bool_:
        return spaces.Box(0, 1, (count,), np.bool_)
    return spaces.Box(-np.inf, np.inf, (count,), np.float64)
