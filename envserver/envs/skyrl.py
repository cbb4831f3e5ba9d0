"""SkyRL-Gym's text envs for LLM agents (``skyrl-gym`` on PyPI) as Gymnasium envs.

SkyRL-Gym's envs (math, SQL, code, search tasks) speak their own API: ``init(prompt)``, then
``step(text)`` returning the messages to append to the conversation, a reward and ``done``.
:class:`SkyRLEnv` serves one as a Gymnasium env, so a host serves it and an
:class:`~envserver.client.aio.EnvPool` steps it as any other::

    async with aio.EnvPool("envserver.envs.skyrl:envserver/SkyRL-v0", hosts=[...]) as pool:
        env = await pool.make(env="gsm8k_multi_turn", prompt=prompt, extras=row)
        conversation, info = await env.reset()
        messages, reward, terminated, truncated, info = await env.step(completion)

Observations are the messages as JSON text (``json.loads`` gives the list of ``{"role",
"content"}`` maps; ASCII, so within the space's charset); actions are the model's text.
``terminated`` is SkyRL's ``done``; ``truncated`` is never set (a SkyRL env ends its episode
itself at its ``max_turns``). ``info`` is the step's metadata, with ``postprocessed_action``
where the env gave one.

An episode's state is its prompt and the actions since its reset: :meth:`SkyRLEnv.get_state`
gives them and :meth:`SkyRLEnv.set_state` makes the task anew and runs the actions again, so
snapshots, forks and restore-mode recovery hold for SkyRL's deterministic envs (math, SQL over
a database that does not change); an env whose tool answers differently each time (a live web
search) is given the same actions but may not reach the same state.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium import spaces

__all__ = ["MAX_TEXT", "SkyRLEnv"]

#: The longest text an observation or action may be (SkyRL's conversations are long).
MAX_TEXT = 1 << 20


class SkyRLEnv(gym.Env):
    """One SkyRL-Gym env, a task of it per episode.

    Args:
        env: The SkyRL-Gym env id (``"gsm8k"``, ``"gsm8k_multi_turn"``, ``"aime"``,
            ``"text2sql"``, ``"lcb"``, ``"search"``, ...).
        prompt: The task's prompt: a list of ``{"role", "content"}`` messages (or one text,
            taken as the user's message). Each reset starts the task from it.
        extras: The task's row, as SkyRL-Gym takes it (``reward_spec``, ``max_turns``, ...).
        env_config: The env's configuration (e.g. text2sql's ``{"db_path": ...}``), given to
            the env as an OmegaConf config, as SkyRL's trainer gives it.

    Raises:
        ImportError: If ``skyrl-gym`` is not installed.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        env: str,
        prompt: list[dict[str, str]] | str,
        extras: Mapping[str, Any] | None = None,
        env_config: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            import skyrl_gym
            from omegaconf import OmegaConf
        except ImportError as exc:  # pragma: no cover - the test extra installs it
            raise ImportError(
                "SkyRL-Gym's envs need skyrl-gym: pip install 'envserver[skyrl]'"
            ) from exc
        if env not in skyrl_gym.registry:
            raise gym.error.Error(
                f"no SkyRL-Gym env {env!r} (it has {', '.join(sorted(skyrl_gym.registry))})"
            )
        self._make = skyrl_gym.make
        self.env_name = env
        self.prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        self.extras = dict(extras or {})
        self.env_config = OmegaConf.create(dict(env_config or {}))
        charset = string.printable
        self.observation_space = spaces.Text(MAX_TEXT, min_length=0, charset=charset)
        self.action_space = spaces.Text(MAX_TEXT, min_length=0, charset=charset)
        self._task: Any = None
        self._actions: list[str] = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Starts the task anew: its prompt, and SkyRL's metadata as the info."""
        super().reset(seed=seed)
        if self._task is not None:
            self._task.close()
        self._task = self._make(self.env_name, env_config=self.env_config, extras=self.extras)
        self._actions = []
        conversation, metadata = self._task.init(self.prompt)
        return json.dumps(conversation), dict(metadata or {})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One turn: the model's text in, the messages it brings out."""
        if self._task is None:
            raise gym.error.ResetNeeded("reset the env before its first step")
        out = self._task.step(action)
        self._actions.append(action)
        info = dict(out.get("metadata") or {})
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]
        return json.dumps(out["observations"]), float(out["reward"]), bool(out["done"]), False, info

    def get_state(self) -> dict[str, Any]:
        """The episode so far: whether it started, and the actions since its reset."""
        return {"started": self._task is not None, "actions": list(self._actions)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Makes the task anew and runs the actions :meth:`get_state` gave again."""
        if not state["started"]:
            self.close()
            return
        self.reset()
        for action in state["actions"]:
            self.step(action)

    def close(self) -> None:
        """Closes the task's env (its tools' connections)."""
        if self._task is not None:
            self._task.close()
            self._task = None
            self._actions = []


gym.register("envserver/SkyRL-v0", entry_point=SkyRLEnv)
