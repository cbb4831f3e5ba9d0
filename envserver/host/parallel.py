"""PettingZoo Parallel envs served as one Gymnasium env each, in the agents layout.

:class:`ParallelEnvAdapter` is what a host makes for MAKE ``"kind": "parallel"``: a
``gymnasium.Env`` whose observation and action hold every agent's, laid out as
:mod:`envserver.wire.agents` says. The session's block resets, steps and autoresets it as any
env; the adapter keeps the one thing PettingZoo leaves to its caller: which agents may act.

- Actions reach the env only for agents that are live: those in its ``agents`` list that have
  not terminated or truncated (an env that keeps a finished agent in that list never gets an
  action for it).
- The episode ends once no agent is live (PettingZoo's own end: an empty ``agents`` list).
- Agents outside ``possible_agents`` are refused: an env without that list cannot be served,
  since every batch has one slot per possible agent.

PettingZoo itself is not imported here unless an AEC env must be turned into a Parallel one.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, create_empty_array, iterate

from envserver.errors import StateMismatchError, UnsupportedStateError
from envserver.wire.agents import ACTIVE, AGENTS, REWARD, TERMINATED, TRUNCATED, AgentLayout

__all__ = ["DEFAULT_FACTORY", "ParallelEnvAdapter", "adapt", "adapted", "make_parallel_env"]

#: The callable a spec without ``:NAME`` names: PettingZoo's modules all have one.
DEFAULT_FACTORY = "parallel_env"


def make_parallel_env(
    spec: str, kwargs: dict[str, Any] | None = None, *, any_callable: bool = False
) -> ParallelEnvAdapter:
    """Makes the Parallel (or AEC) env ``spec`` names and adapts it.

    A peer names what the host calls, so the host calls only what was made to be called: an
    env PettingZoo's registry holds, or a module's :data:`DEFAULT_FACTORY` (every PettingZoo env
    module has one). Another callable of a module is called only where ``any_callable`` says
    (a host started with ``--allow-pickle`` trusts its clients with code anyway): a peer could
    otherwise name any function of any installed module (``os:system``).

    Args:
        spec: A PettingZoo registered id (``butterfly/pistonball-v6``, made with
            ``pettingzoo.make``), ``package.module:Id`` (an id the module registers on import),
            ``package.module`` (its :data:`DEFAULT_FACTORY`, as in ``mpe2.simple_spread_v3``),
            or ``package.module:callable``.
        kwargs: The keyword arguments of ``pettingzoo.make`` or of the callable.
        any_callable: Whether ``package.module:callable`` may name any callable.

    Raises:
        ImportError: If the module cannot be imported, or PettingZoo has no registry.
        AttributeError: If the module has no such callable.
        PermissionError: If ``spec`` names another callable than the default one and
            ``any_callable`` is false.
        TypeError: If what is made cannot be served (see :func:`adapt`).
    """
    kwargs = kwargs or {}
    module_name, colon, name = spec.partition(":")
    if not colon and not all(part.isidentifier() for part in spec.split(".")):
        return adapt(_registered(spec, kwargs))  # not a module's dotted name: an id
    if colon and not name.isidentifier():
        importlib.import_module(module_name)  # it registers the id
        return adapt(_registered(name, kwargs))
    name = name or DEFAULT_FACTORY
    if name != DEFAULT_FACTORY and not any_callable:
        raise PermissionError(
            f"{spec!r} names a callable other than a module's {DEFAULT_FACTORY}, which a host "
            "calls only when started with --allow-pickle: register the env with "
            f"pettingzoo.register and give its id, or name a module whose {DEFAULT_FACTORY} "
            "makes it"
        )
    factory = getattr(importlib.import_module(module_name), name, None)
    if not callable(factory):
        raise AttributeError(f"module {module_name!r} has no callable {name!r}")
    return adapt(factory(**kwargs))


def _registered(env_id: str, kwargs: dict[str, Any]) -> Any:
    """``pettingzoo.make``'s Parallel env ``env_id``, or its AEC env if it has only that."""
    import pettingzoo

    if not callable(getattr(pettingzoo, "make", None)):
        raise ImportError(
            f"PettingZoo {getattr(pettingzoo, '__version__', '')} has no registry to find "
            f"{env_id!r} in (1.27 added it): name the env's module instead, e.g. "
            "pettingzoo.butterfly.pistonball_v6"
        )
    from pettingzoo.env_registry.exceptions import NameNotFound

    kind = (
        "aec"
        if env_id not in pettingzoo.parallel_registry and env_id in pettingzoo.aec_registry
        else "parallel"
    )
    try:
        return pettingzoo.make(kind, env_id, **kwargs)
    except NameNotFound:  # its message lists the whole registry
        ids = sorted({*pettingzoo.parallel_registry, *pettingzoo.aec_registry})
        near = ", ".join(map(repr, difflib.get_close_matches(env_id, ids)))
        raise NameNotFound(
            f"{env_id!r} is not in PettingZoo's registry "
            + (f"(near matches: {near})" if near else f"(no near match among its {len(ids)} ids)")
        ) from None


def adapt(env: Any) -> ParallelEnvAdapter:
    """Serves ``env``: a PettingZoo Parallel env, or an AEC env PettingZoo can run in parallel.

    Raises:
        TypeError: If ``env`` is neither, or is an AEC env whose agents take turns.
    """
    if callable(getattr(env, "agent_iter", None)) and callable(getattr(env, "last", None)):
        env = _aec_to_parallel(env)
    if not (
        callable(getattr(env, "step", None)) and callable(getattr(env, "observation_space", None))
    ):
        raise TypeError(
            f"{type(env).__qualname__} is not a PettingZoo Parallel env (no step() and "
            "observation_space(agent))"
        )
    return ParallelEnvAdapter(env)


def _aec_to_parallel(env: Any) -> Any:
    from pettingzoo.utils.conversions import aec_to_parallel

    if not env.metadata.get("is_parallelizable", False):
        raise TypeError(
            f"{_name(env)} is an AEC env whose agents take turns: "
            "PettingZoo's aec_to_parallel refuses it (its metadata does not set "
            "is_parallelizable). Register a factory that returns "
            "pettingzoo.utils.conversions.turn_based_aec_to_parallel(env) (every agent acts on "
            "each step, only the one whose turn it is counts) and serve its id"
        )
    return aec_to_parallel(env)


def _name(env: Any) -> str:
    """The env's name as its metadata gives it, else its class's."""
    return str(env.metadata.get("name") or type(env).__qualname__)


class ParallelEnvAdapter(gym.Env):
    """A PettingZoo Parallel env as one Gymnasium env, in the agents layout.

    Args:
        env: The Parallel env; its ``possible_agents`` and their spaces are read once.

    Raises:
        TypeError: If the env has no ``possible_agents``, or its names are not distinct strings.
    """

    def __init__(self, env: Any) -> None:
        agents = getattr(env, "possible_agents", None)
        if agents is None:
            raise TypeError(
                f"{type(env).__qualname__} has no possible_agents: its batches have one slot "
                "per possible agent, so an env that adds agents it never listed cannot be served"
            )
        self.env = env
        self.layout = AgentLayout.of(agents, env.observation_space, env.action_space)
        self.observation_space = self.layout.observation_space()
        self.action_space = self.layout.action_space()
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self.render_mode = getattr(env, "render_mode", None)
        self.possible_agents = list(self.layout.agents)
        self._index = {a: j for j, a in enumerate(self.layout.agents)}
        self._zeros = {a: _zeros(s) for a, s in self.layout.observation_spaces.items()}
        self._live: list[str] = []

    @property
    def agents(self) -> list[str]:
        """The agents that act on the next step."""
        return list(self._live)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Resets the env; every agent it gives an observation is active."""
        observations, infos = self.env.reset(seed=seed, options=options)
        count = len(self.layout.agents)
        obs = self._observation(observations, np.zeros(count), *_flags(count, 2))
        self._live = list(self.env.agents)
        return obs, _infos(infos)

    def step(self, action: dict[str, Any]) -> tuple[dict[str, Any], float, bool, bool, dict]:
        """Steps the live agents with their actions (the others' are not sent)."""
        observations, rewards, terminations, truncations, infos = self.env.step(
            {a: action[a] for a in self._live}
        )
        count = len(self.layout.agents)
        reward, terminated, truncated = np.zeros(count), *_flags(count, 2)
        for agent in observations:
            j = self._slot(agent)
            reward[j] = rewards.get(agent, 0.0)
            terminated[j] = bool(terminations.get(agent, False))
            truncated[j] = bool(truncations.get(agent, False))
        obs = self._observation(observations, reward, terminated, truncated)
        self._live = [a for a in self.env.agents if not (terminations.get(a) or truncations.get(a))]
        ended = not self._live
        any_terminated = ended and bool(terminated.any())
        return (
            obs,
            float(reward.sum()),
            any_terminated,
            ended and not any_terminated,
            _infos(infos),
        )

    def get_state(self) -> dict[str, Any]:
        """The Parallel env's state (its own ``get_state()``) and which agents act next.

        Raises:
            UnsupportedStateError: If the Parallel env has no ``get_state``/``set_state``
                (PettingZoo's envs have none: their state is not taken).
        """
        get = getattr(self.env, "get_state", None)
        if not callable(get) or not callable(getattr(self.env, "set_state", None)):
            raise UnsupportedStateError(
                f"{type(self.env).__module__}.{type(self.env).__qualname__}, a Parallel env, has "
                "no get_state() and set_state(state) methods: its state cannot be taken"
            )
        return {"agents": self.possible_agents, "live": list(self._live), "env": get()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Gives the Parallel env the state :meth:`get_state` took, and the agents acting.

        Raises:
            StateMismatchError: If the snapshot's env had other possible agents.
        """
        if list(state["agents"]) != self.possible_agents:
            raise StateMismatchError(
                f"the snapshot's env has the agents {list(state['agents'])}, this one "
                f"{self.possible_agents}"
            )
        self.env.set_state(state["env"])
        self._live = [str(agent) for agent in state["live"]]

    def _slot(self, agent: Any) -> int:
        j = self._index.get(agent)
        if j is None:
            raise KeyError(
                f"the env gave results for agent {agent!r}, which is not in its possible_agents "
                f"{list(self.layout.agents)}"
            )
        return j

    def _observation(
        self,
        observations: dict[str, Any],
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> dict[str, Any]:
        active = np.zeros(len(self.layout.agents), dtype=np.bool_)
        for agent in observations:
            active[self._slot(agent)] = True
        agents = {
            a: observations[a] if active[j] else self._zeros[a]
            for j, a in enumerate(self.layout.agents)
        }
        return {
            AGENTS: agents,
            REWARD: reward,
            TERMINATED: terminated,
            TRUNCATED: truncated,
            ACTIVE: active,
        }

    def render(self) -> Any:
        """The env's render."""
        return self.env.render()

    def state(self) -> Any:
        """The env's global state (where it has one: see its ``state_space``)."""
        return self.env.state()

    @property
    def state_space(self) -> gym.Space:
        """The env's global state space."""
        return self.env.state_space

    def close(self) -> None:
        """Closes the env."""
        self.env.close()

    def get_wrapper_attr(self, name: str) -> Any:
        """The adapter's attribute ``name``, else the env's (what ``call`` reaches)."""
        if hasattr(type(self), name) or name in vars(self):
            return getattr(self, name)
        return getattr(self.env, name)

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> None:
        """Sets the env's attribute ``name``, or the adapter's own where it has one."""
        if hasattr(type(self), name) or name in vars(self):
            setattr(self, name, value)
        else:
            setattr(self.env, name, value)


def _flags(count: int, number: int) -> list[np.ndarray]:
    return [np.zeros(count, dtype=np.bool_) for _ in range(number)]


def _infos(infos: dict[str, Any] | None) -> dict[str, Any]:
    """The env's infos, each agent's empty dict left out (it would only be merged)."""
    return {k: v for k, v in (infos or {}).items() if not (isinstance(v, dict) and not v)}


def _zeros(space: gym.Space) -> Any:
    """One value of ``space``, all zeros (an inactive agent's observation)."""
    return next(iter(iterate(batch_space(space, 1), create_empty_array(space, 1, fn=np.zeros))))


def adapted(factory: Callable[[], Any]) -> ParallelEnvAdapter:
    """Calls ``factory`` and adapts what it returns."""
    return adapt(factory())
