"""``MultiAgentVectorEnv``: PettingZoo Parallel envs on env hosts, every agent batched over envs.

The hosts serve each Parallel env as one env in the agents layout
(:mod:`envserver.wire.agents`), so the transport, sessions, the raw step, autoreset, recovery
and infos are those of :class:`RemoteVectorEnv`, which this class holds. It reads the layout
back out: one batch per agent, keyed by ``possible_agents``.
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from envserver.wire.agents import AGENTS, AgentLayout
from envserver.wire.bodies import PARALLEL

from ._agent_rows import AgentRows
from ._flat import FlatAgentsVectorEnv
from ._infos import add_env_info
from ._options import FromPart
from ._vector import RemoteVectorEnv

__all__ = ["MultiAgentVectorEnv"]

#: RemoteVectorEnv's options that this class sets itself.
_FIXED_OPTIONS = frozenset(
    {"env_kind", "info_format", "observation_mode", "batch_size", "sub_batch_size"}
)


class MultiAgentVectorEnv:
    """A vector of PettingZoo Parallel envs whose envs run on env hosts.

    Every value is a dict keyed by the envs' ``possible_agents``, each a batch over the envs:
    ``obs[agent]`` has the shape ``(num_envs, *observation_space(agent).shape)`` (Dict and
    Tuple spaces batched as Gymnasium batches them), ``rewards[agent]`` (float64),
    ``terminations[agent]``, ``truncations[agent]`` and :attr:`active` ``[agent]`` (bool) the
    shape ``(num_envs,)``. Agents may have different spaces.

    An agent is *active* in an env while the env gives it an observation: from the reset (or
    the step) on which it appears to the step on which it terminates or truncates, which
    reports its real last observation and reward. After that it is inactive: its
    observation is zeros, its reward 0 and its flags false, so no trainer sees a second end.
    Actions are given for every possible agent; the env receives only its live agents'. An
    env's episode ends once none of its agents is left to act (PettingZoo's end), and it is
    reset as ``autoreset_mode`` says, as in Gymnasium's vector envs (``SAME_STEP``:
    ``infos["final_obs"][agent]`` with its mask ``infos["final_obs"]["_" + agent]``, and
    ``infos["final_info"]``).

    Infos are batched as Gymnasium batches them (a dict of arrays, ``_key`` masks), each
    agent's under its name, and each key of the env's infos that is not an agent at the top
    level under its own name. An env lost with its host (``on_host_failure="restart"``) reports
    every agent that was live as truncated, once, with ``infos["host_failure"]``.

    Examples:
        >>> envs = MultiAgentVectorEnv("mpe2.simple_spread_v3", num_envs=4, env_kwargs={"N": 3})
        >>> obs, infos = envs.reset(seed=42)
        >>> actions = {a: envs.action_space(a).sample() for a in envs.possible_agents}
        >>> obs, rewards, terminations, truncations, infos = envs.step(actions)
        >>> envs.close()

    Args:
        env: What makes one env on a host: ``package.module`` (its ``parallel_env``) or
            ``package.module:callable``, called with ``env_kwargs``; it returns a Parallel
            env, or an AEC env PettingZoo can run in parallel. Leave out when ``env_fns``
            are given.
        num_envs: The number of envs (with ``env``).
        env_kwargs: The callable's keyword arguments.
        env_fns: One factory per env returning a Parallel env, shipped with cloudpickle (hosts
            must allow pickle; local hosts do).
        **options: :class:`RemoteVectorEnv`'s options (``hosts``, ``autoreset_mode``,
            ``on_host_failure``, CURVE keys, timeouts, ...), but for those that shape its
            batches, which this class sets.

    Raises:
        TypeError: If an option is one this class sets.
    """

    def __init__(
        self,
        env: str | None = None,
        *,
        num_envs: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        env_fns: Sequence[Callable[[], Any]] | None = None,
        **options: Any,
    ) -> None:
        fixed = sorted(_FIXED_OPTIONS.intersection(options))
        if fixed:
            raise TypeError(f"MultiAgentVectorEnv sets {', '.join(fixed)} itself")
        self.vector = RemoteVectorEnv(
            env_fns,
            env_id=env,
            env_kwargs=env_kwargs,
            num_envs=num_envs,
            env_kind=PARALLEL,
            **options,
        )
        try:
            layout = AgentLayout.from_spaces(
                self.vector.single_observation_space, self.vector.single_action_space
            )
        except BaseException:
            self.vector.close()
            raise
        self._layout = layout
        #: The number of envs.
        self.num_envs = self.vector.num_envs
        #: Every agent an env may have, in the order of the envs' ``possible_agents``.
        self.possible_agents: list[str] = list(layout.agents)
        #: The envs' metadata, with the vector env's ``autoreset_mode``.
        self.metadata = self.vector.metadata
        self.render_mode = self.vector.render_mode
        self.autoreset_mode: AutoresetMode = self.vector.autoreset_mode
        self._observation_spaces = {
            a: batch_space(s, self.num_envs) for a, s in layout.observation_spaces.items()
        }
        self._action_spaces = {
            a: batch_space(s, self.num_envs) for a, s in layout.action_spaces.items()
        }
        self._rows = AgentRows(layout, self.num_envs, self.autoreset_mode)

    # ------------------------------------------------------------------ spaces

    def single_observation_space(self, agent: str) -> spaces.Space:
        """The observation space of ``agent`` in one env."""
        return self._layout.observation_spaces[agent]

    def single_action_space(self, agent: str) -> spaces.Space:
        """The action space of ``agent`` in one env."""
        return self._layout.action_spaces[agent]

    def observation_space(self, agent: str) -> spaces.Space:
        """The observation space of ``agent``, batched over the envs."""
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        """The action space of ``agent``, batched over the envs."""
        return self._action_spaces[agent]

    # ------------------------------------------------------------------ reset and step

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Resets the envs (env ``i`` seeded ``seed + i``, as in Gymnasium's vector envs).

        Args:
            seed: None, an int, or one seed per env.
            options: Passed to every env's reset; ``options["reset_mask"]`` resets only the
                envs it marks (as in Gymnasium's vector envs).

        Returns:
            Each agent's batched observations, and the infos.
        """
        mask = (options or {}).get("reset_mask")
        batch, infos = self.vector.reset(seed=seed, options=options)
        if mask is None:
            self._rows.take(batch, infos)
        else:  # the envs not reset keep their infos' masks (a lost host's envs are all reset)
            reset = np.asarray(mask, dtype=np.bool_) | infos.get("_host_failure", False)
            self._rows.take(batch, infos, np.flatnonzero(reset))
        return self._rows.obs, infos

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[
        dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray], dict
    ]:
        """Steps every env with its live agents' actions.

        Args:
            actions: For every possible agent, a batch of ``num_envs`` actions from its
                :meth:`action_space` (an inactive agent's are not sent to its env).

        Returns:
            Each agent's batched observations, rewards, terminations and truncations, and the
            infos.

        Raises:
            ValueError: If an agent's actions are missing, or an agent is not one of the envs'.
        """
        unknown = sorted(set(actions) - set(self.possible_agents), key=str)
        missing = [a for a in self.possible_agents if a not in actions]
        if unknown or missing:
            raise ValueError(
                "actions must hold a batch for every possible agent "
                + (f"(missing: {missing})" if missing else f"(not an agent: {unknown})")
            )
        rows = self._rows
        live = rows.live
        batch, _, _, _, infos = self.vector.step({a: actions[a] for a in self.possible_agents})
        columns = rows.take(batch, infos)
        if self.autoreset_mode == AutoresetMode.SAME_STEP and "final_obs" in infos:
            columns = rows.final(columns, infos)
        if "host_failure" in infos:
            columns = rows.lost(columns, infos, live)
        reward, terminated, truncated, _ = columns
        agents = self.possible_agents
        return (
            rows.obs,
            {a: reward[:, j] for j, a in enumerate(agents)},
            {a: terminated[:, j] for j, a in enumerate(agents)},
            {a: truncated[:, j] for j, a in enumerate(agents)},
            infos,
        )

    def get_state(self, env_ids: Sequence[int] | None = None) -> list[bytes]:
        """A snapshot of each env (all, or ``env_ids``), as :meth:`RemoteVectorEnv.get_state`.

        The Parallel env needs ``get_state()`` and ``set_state(state)`` methods (plain data);
        PettingZoo's own envs have none (``UnsupportedStateError``).
        """
        return self.vector.get_state(env_ids)

    def set_state(
        self, states: Sequence[bytes], env_ids: Sequence[int] | None = None
    ) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
        """Restores envs from snapshots, as :meth:`RemoteVectorEnv.set_state` does.

        Returns:
            Each agent's observations of the snapshots' moment, batched in ``env_ids`` order,
            and each env's infos of that moment (as the Parallel env gave them).
        """
        batch, infos = self.vector.set_state(states, env_ids)
        infos = tuple(map(self._rows.parallel_infos, infos))
        ids = list(range(self.num_envs) if env_ids is None else env_ids)
        batched: dict[str, Any] = {}
        for i, info in zip(ids, infos):
            add_env_info(batched, info, i, self.num_envs)
        self._rows.take(copy_module.deepcopy(self.vector.observations), batched, np.asarray(ids))
        return batch[AGENTS], infos

    # ------------------------------------------------------------------ per agent

    active: dict[str, np.ndarray] = FromPart("_rows")
    """Per agent, the envs where it has an observation now.

    On the step it leaves an env, an agent is active there (that observation is its last).
    With ``SAME_STEP``, an env whose episode ended was reset on that step: ``active`` is
    then its new episode's agents, and ``infos["final_obs"]["_" + agent]`` the ended one's.
    """

    ended: np.ndarray = FromPart("_rows")
    """Per env, whether none of its agents is left to act: its episode ended, not reset since.

    With ``DISABLED``, the envs to reset (``reset(options={"reset_mask": envs.ended})``).
    With ``SAME_STEP`` it is never set: such an env was reset on the step it ended.
    """

    def action_masks(self) -> dict[str, np.ndarray]:
        """Per agent that has one, its action masks (bool), all false where it is inactive.

        A mask is read from the agent's observation (``obs[agent]["action_mask"]``, as
        PettingZoo's classic envs give it) or its infos (``infos[agent]["action_mask"]``, as
        Shimmy's OpenSpiel envs do).
        """
        return self._rows.action_masks()

    def flat(self) -> FlatAgentsVectorEnv:
        """This vector env as a Gymnasium vector env of one row per (env, agent).

        For trainers written for SuperSuit (parameter sharing): see
        :class:`FlatAgentsVectorEnv`. Closing either closes both.

        Raises:
            ValueError: If the agents' spaces differ (the error names those that differ).
        """
        return FlatAgentsVectorEnv(self)

    # ------------------------------------------------------------------ the envs

    def state(self) -> np.ndarray:
        """Every env's global state (``state()``), stacked (envs that have a ``state_space``)."""
        return np.stack(self.vector.call("state"))

    def render(self) -> tuple[Any, ...]:
        """Every env's rendered frame."""
        return self.vector.render()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) of every env."""
        return self.vector.call(name, *args, **kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Reads attribute ``name`` of every env."""
        return self.vector.get_attr(name)

    def close(self) -> None:
        """Closes the envs and what the vector env started (local hosts, sessions)."""
        self.vector.close()

    def __enter__(self) -> MultiAgentVectorEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MultiAgentVectorEnv(num_envs={self.num_envs}, agents={self.possible_agents})"
