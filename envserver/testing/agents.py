"""A PettingZoo-style Parallel env for tests: agents that leave and join, each with its spaces.

:class:`ScriptedAgents` follows PettingZoo's Parallel API without importing PettingZoo (hosts
serve it as ``envserver.testing.agents`` or ``envserver.testing.agents:parallel_env``). Its four
agents have four kinds of spaces, and it checks what it is given as strictly as a real env:
an action for an agent that is not live, a missing action for a live one, or an action its
mask forbids raises. Everything it returns depends on its seed and on the actions taken.

- ``"a"``: Box(3,) float32 observations, Discrete(3) actions; it is the last to leave.
- ``"b"``: Box(2, 2) float64 observations, Box(2,) actions; leaves at ``leave["b"]``.
- ``"c"``: a Dict of an observation and its ``"action_mask"`` (int8), Discrete(3) actions.
- ``"d"``: Discrete(5) observations and Discrete(4) actions, its mask in its infos
  (``infos["d"]["action_mask"]``); it joins at ``join["d"]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

__all__ = ["ScriptedAgents", "parallel_env"]

#: The agents, in ``possible_agents`` order.
AGENTS = ("a", "b", "c", "d")


class ScriptedAgents:
    """A Parallel env whose agents leave (terminated or truncated) and join at chosen steps.

    Args:
        leave: ``{agent: [step, "terminated" | "truncated"]}``: the step (from 1) on which the
            agent leaves. By default ``"b"`` terminates on step 3, ``"a"`` on
            ``episode_steps``, and any other agent still there truncates then.
        join: ``{agent: step}``: agents that are not there at the reset and appear after that
            step (their first observation comes with its results).
        leave_p: The chance that a live agent other than ``"a"`` leaves on any step
            (terminated or truncated, drawn from the env's generator), on top of ``leave``.
        episode_steps: When ``"a"`` leaves (terminated), if ``leave`` does not say.
        common: Whether the infos carry a key that is not an agent's (``"common"``).
        enforce_masks: Whether an action a mask forbids raises (PettingZoo's API test reads
            masks in observations only, so ``"d"``'s would be broken by it).
        render_mode: ``"rgb_array"`` or None.
    """

    metadata: dict[str, Any] = {
        "name": "scripted_agents_v0",
        "render_modes": ["rgb_array"],
        "is_parallelizable": True,
    }

    def __init__(
        self,
        leave: dict[str, Any] | None = None,
        join: dict[str, int] | None = None,
        leave_p: float = 0.0,
        episode_steps: int = 8,
        common: bool = True,
        enforce_masks: bool = True,
        render_mode: str | None = None,
    ) -> None:
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self.render_mode = render_mode
        self._leave = {a: (episode_steps, "truncated") for a in AGENTS}  # at the latest
        self._leave.update({"b": (3, "terminated"), "a": (episode_steps, "terminated")})
        self._leave.update({a: (int(s), str(how)) for a, (s, how) in (leave or {}).items()})
        self._join = {"d": 2} if join is None else dict(join)
        self._leave_p = leave_p
        self._common = common
        self._enforce_masks = enforce_masks
        self._observation_spaces = {
            "a": spaces.Box(-1, 1, (3,), np.float32),
            "b": spaces.Box(0, 10, (2, 2), np.float64),
            "c": spaces.Dict(
                [
                    ("observation", spaces.Box(0, 1, (4,), np.float32)),
                    ("action_mask", spaces.Box(0, 1, (3,), np.int8)),
                ]
            ),
            "d": spaces.Discrete(5),
        }
        self._action_spaces = {
            "a": spaces.Discrete(3),
            "b": spaces.Box(-1, 1, (2,), np.float32),
            "c": spaces.Discrete(3),
            "d": spaces.Discrete(4),
        }
        self.state_space = spaces.Box(-np.inf, np.inf, (4,), np.float64)
        self._rng, _ = seeding.np_random()
        self._t = 0
        self._masks: dict[str, np.ndarray] = {}
        self._value = np.zeros(4)

    def observation_space(self, agent: str) -> spaces.Space:
        """The agent's observation space."""
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        """The agent's action space."""
        return self._action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Starts an episode: every agent but those that join later."""
        if seed is not None:
            self._rng, _ = seeding.np_random(seed)
        self._t = 0
        self._value = self._rng.uniform(0, 1, 4)
        if options and "value" in options:
            self._value[:] = float(options["value"])
        self.agents = [a for a in self.possible_agents if a not in self._join]
        return self._observations(self.agents), self._infos(self.agents)

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, float], dict[str, bool], dict[str, bool], dict]:
        """Steps the live agents; raises on an action it must not be given."""
        extra = [a for a in actions if a not in self.agents]
        if extra:
            raise ValueError(f"actions for agents that are not live: {extra}")
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise KeyError(f"no actions for live agents {missing}")
        for agent, action in actions.items():
            space = self._action_spaces[agent]
            if not space.contains(np.asarray(action, dtype=space.dtype)):
                raise ValueError(f"agent {agent!r}: {action!r} is not in its action space")
            mask = self._masks.get(agent) if self._enforce_masks else None
            if mask is not None and not mask[int(action)]:
                raise ValueError(f"agent {agent!r}: action {int(action)} is masked out")
        self._t += 1
        rewards, terminations, truncations = {}, {}, {}
        for j, agent in enumerate(AGENTS):
            if agent not in actions:
                continue
            push = float(np.sum(actions[agent])) if agent == "b" else float(actions[agent])
            self._value[j] += 0.1 * push + self._rng.normal(0, 0.05)
            rewards[agent] = float(self._value[j] - 0.5 * j)
            step, how = self._leave.get(agent, (None, ""))
            leaves = self._t == step
            if not leaves and agent != "a" and self._leave_p and self._rng.random() < self._leave_p:
                leaves, how = True, "terminated" if self._rng.random() < 0.5 else "truncated"
            terminations[agent] = leaves and how == "terminated"
            truncations[agent] = leaves and how == "truncated"
        stepped = list(actions)
        joined = [a for a, s in self._join.items() if self._t == s and a not in stepped]
        for agent in joined:
            rewards[agent], terminations[agent], truncations[agent] = 0.0, False, False
        present = [a for a in self.possible_agents if a in stepped or a in joined]
        observations = self._observations(present)
        infos = self._infos(present)
        self.agents = [a for a in present if not (terminations[a] or truncations[a])]
        if not self.agents:  # the masks of an ended episode mean nothing
            self._masks = {}
        return observations, rewards, terminations, truncations, infos

    def _observations(self, agents: list[str]) -> dict[str, Any]:
        t, value, rng = self._t, self._value, self._rng
        obs: dict[str, Any] = {}
        self._masks = {}
        for agent in agents:
            if agent == "a":
                obs[agent] = np.tanh(value[:3] + 0.01 * t).astype(np.float32)
            elif agent == "b":
                obs[agent] = np.clip(np.outer(value[:2], value[2:]) + t, 0, 10)
            elif agent == "c":
                mask = (rng.random(3) < 0.7).astype(np.int8)
                mask[int(t % 3)] = 1  # never all masked out
                self._masks[agent] = mask
                obs[agent] = {
                    "observation": np.clip(value, 0, 1).astype(np.float32),
                    "action_mask": mask,
                }
            else:
                obs[agent] = int(rng.integers(5))
                mask = (rng.random(4) < 0.6).astype(np.int8)
                mask[int(t % 4)] = 1
                self._masks[agent] = mask
        return obs

    def _infos(self, agents: list[str]) -> dict[str, Any]:
        infos: dict[str, Any] = {a: {} for a in agents}
        for agent in agents:
            if agent == "a":
                infos[agent] = {"t": self._t}
            elif agent == "b" and self._t % 2:
                infos[agent] = {"odd": True, "value": float(self._value[1])}
            elif agent == "d":
                infos[agent] = {"action_mask": self._masks[agent]}
        if self._common:
            infos["common"] = {"t": self._t, "live": len(agents)}
        return infos

    def get_state(self) -> dict[str, Any]:
        """Everything it keeps between steps, as plain data (for snapshots: envserver.state)."""
        return {
            "rng": self._rng.bit_generator.state,
            "t": self._t,
            "value": self._value.copy(),
            "agents": list(self.agents),
            "masks": {agent: mask.copy() for agent, mask in self._masks.items()},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Takes the state :meth:`get_state` gave."""
        self._rng.bit_generator.state = state["rng"]
        self._t, self._value = int(state["t"]), np.array(state["value"])
        self.agents = list(state["agents"])
        self._masks = {agent: np.array(mask) for agent, mask in state["masks"].items()}

    def state(self) -> np.ndarray:
        """The env's global state."""
        return self._value.copy()

    def render(self) -> np.ndarray | None:
        """A small frame that changes with the state."""
        if self.render_mode != "rgb_array":
            return None
        frame = np.zeros((4, 4, 3), dtype=np.uint8)
        frame[..., 0] = np.uint8(self._t % 256)
        frame[0, :, 1] = (np.clip(self._value, 0, 1) * 255).astype(np.uint8)
        return frame

    def close(self) -> None:
        """Nothing to release."""


def parallel_env(**kwargs: Any) -> ScriptedAgents:
    """A :class:`ScriptedAgents` (PettingZoo's name for a module's Parallel env factory)."""
    return ScriptedAgents(**kwargs)
