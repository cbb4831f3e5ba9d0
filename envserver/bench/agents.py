"""The multi-agent workload: PettingZoo Parallel envs with many agents, in agent-steps per second.

MPE's ``simple_spread`` with 8 agents (they share their spaces and none leaves, so SuperSuit can
run it), 16 envs: :class:`~envserver.client.MultiAgentVectorEnv` (through its flat view, one row
per agent, so every variant takes the same actions) on local hosts and on spawned hosts, against
SuperSuit's ``concat_vec_envs_v1`` over processes and in this process, and the reference loop: the
Parallel envs stepped in turn with plain dicts, as a trainer without a vector env would. A row is
an agent, so the rates are agent-steps per second.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from envserver.bench.variants import Extra, Hosts, Variant, Workload
from envserver.client import MultiAgentVectorEnv

__all__ = [
    "AGENTS",
    "AGENTS_LOCAL",
    "AGENTS_LOOP",
    "AGENTS_REFERENCE",
    "AGENTS_TITLE",
    "ParallelLoop",
    "agents_workload",
]

#: The env: MPE's simple_spread, as its module names it, with 8 agents.
SPREAD = "mpe2.simple_spread_v3"
SPREAD_KWARGS: dict[str, Any] = {"N": 8, "max_cycles": 25}
AGENTS_TITLE = "multi-agent: MPE simple_spread, 8 agents (agent-steps)"
#: The ratios' reference: SuperSuit with a process per core.
AGENTS_REFERENCE = "SuperSuit concat_vec_envs_v1, 2 processes"
#: The variant of the target (ours, on local hosts) and the reference loop's.
AGENTS_LOCAL = "MultiAgentVectorEnv, local hosts"
AGENTS_LOOP = "reference loop (in process)"


#: What the workload needs: PettingZoo's MPE and SuperSuit.
AGENTS = Extra("bench", ("mpe2", "supersuit"), "mpe2 and supersuit")


def _parallel_env() -> Any:
    return importlib.import_module(SPREAD).parallel_env(**SPREAD_KWARGS)


class ParallelLoop:
    """Parallel envs stepped in turn in this process, each given its live agents' actions.

    Takes flat actions, one row per (env, agent), env-major as the other variants do.
    """

    def __init__(self, num_envs: int) -> None:
        self.envs = [_parallel_env() for _ in range(num_envs)]
        self.agents = list(self.envs[0].possible_agents)

    def reset(self, seed: int | None = None) -> None:
        """Resets env ``i`` with ``seed + i``."""
        for i, env in enumerate(self.envs):
            env.reset(seed=None if seed is None else seed + i)

    def step(self, actions: Any) -> None:
        """Steps every env; one whose agents are all gone is reset."""
        count = len(self.agents)
        for i, env in enumerate(self.envs):
            live = set(env.agents)
            row = i * count
            env.step({a: actions[row + j] for j, a in enumerate(self.agents) if a in live})
            if not env.agents:
                env.reset()

    def close(self) -> None:
        """Closes the envs."""
        for env in self.envs:
            env.close()


def _supersuit(num_envs: int, num_cpus: int) -> Any:
    import supersuit

    vector = supersuit.pettingzoo_env_to_vec_env_v1(_parallel_env())
    return supersuit.concat_vec_envs_v1(vector, num_envs, num_cpus=num_cpus)


def agents_workload(directory: Path, num_envs: int = 16) -> Workload:
    """The multi-agent workload of ``num_envs`` envs (its rows: envs times agents).

    Skipped where :data:`AGENTS` are not installed.
    """
    hosts = Hosts(directory)
    title = f"{AGENTS_TITLE}, {num_envs} envs"
    references = (AGENTS_REFERENCE, AGENTS_LOOP)
    if (why := AGENTS.missing()) is not None:
        rows = num_envs * SPREAD_KWARGS["N"]
        return Workload(title, SPREAD, SPREAD_KWARGS, rows, [], references, hosts, skipped=why)
    agents = len(_parallel_env().possible_agents)

    def remote(**options: Any) -> Any:
        return MultiAgentVectorEnv(
            SPREAD, num_envs=num_envs, env_kwargs=SPREAD_KWARGS, **options
        ).flat()

    variants = [
        Variant(AGENTS_LOOP, lambda: ParallelLoop(num_envs)),
        Variant("SuperSuit concat_vec_envs_v1, in process", lambda: _supersuit(num_envs, 0)),
        Variant(AGENTS_REFERENCE, lambda: _supersuit(num_envs, 2)),
        Variant(AGENTS_LOCAL, lambda: remote()),
        Variant(
            "MultiAgentVectorEnv, ipc 2 hosts",
            lambda: remote(hosts=hosts.endpoints(2, "ipc")),
        ),
    ]
    action = _parallel_env().action_space("agent_0")
    assert isinstance(action, spaces.Discrete)
    return Workload(
        title,
        SPREAD,
        SPREAD_KWARGS,
        num_envs * agents,
        variants,
        references,
        hosts,
        action_space=batch_space(action, num_envs * agents),
    )
