"""What every host of a vector env is asked to make: the HELLO and MAKE request bodies."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from envserver.launch.environment import FORWARD_ENV_OUTPUT_VARIABLE, switch
from envserver.wire.bodies import GYM, Hello, Make
from envserver.wire.messages import MAX_RETRY_WINDOW

from ._options import VectorOptions

__all__ = ["EnvRecipe"]


@dataclass(frozen=True)
class EnvRecipe:
    """How a host makes its block of envs: at set-up, and again after a host failure.

    Attributes:
        env_fns: One factory per env (shipped pickled), or None.
        env_id: A registered env id (made with ``gymnasium.make``), or None.
        env_kwargs: Keyword arguments for ``gymnasium.make``.
        autoreset_mode: The autoreset mode the hosts apply.
        env_threads: How many envs each host steps at once (1: one after another), or None
            for the hosts to choose.
        allow_pickle: Whether this client accepts values that only travel pickled.
        hear_envs: Whether the hosts send what the envs say (warnings, output).
        sub_batch_size: How many envs a first-ready request steps, at most: a host keeps
            the replies of as many requests as it may have under way at once, for retries
            (MAKE's ``"retry_window"``); None before the host count is known.
        kind: What the hosts make: Gymnasium envs (``"gym"``) or PettingZoo Parallel envs
            (``"parallel"``), each served as one env in the agents layout.
    """

    env_fns: list[Callable[[], gym.Env]] | None
    env_id: str | None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP
    env_threads: int | None = None
    allow_pickle: bool = False
    hear_envs: bool = True
    sub_batch_size: int | None = None
    kind: str = GYM

    @classmethod
    def of(
        cls,
        env_fns: list[Callable[[], gym.Env]] | None,
        env_id: str | None,
        env_kwargs: dict[str, Any] | None,
        options: VectorOptions,
        *,
        local: bool,
        kind: str = GYM,
    ) -> EnvRecipe:
        """The recipe of a vector env with these options (``local``: on embedded local hosts).

        Pickle is allowed where ``options.allow_pickle`` says, by default on local hosts only;
        the hosts send what the envs say unless ``options.forward_env_output`` (or
        ``$ENVSERVER_FORWARD_ENV_OUTPUT``) says not to.

        Raises:
            ValueError: If ``$ENVSERVER_FORWARD_ENV_OUTPUT`` is neither a yes nor a no.
        """
        allow_pickle = local if options.allow_pickle is None else bool(options.allow_pickle)
        hear = switch(options.forward_env_output, FORWARD_ENV_OUTPUT_VARIABLE, default=True)
        return cls(
            env_fns,
            env_id,
            env_kwargs or {},
            options.autoreset_mode,
            options.env_threads,
            allow_pickle,
            hear,
            kind=kind,
        )

    def hello(self) -> Hello:
        """The HELLO body: who this client is, whether it takes pickle and what envs say."""
        return Hello(f"RemoteVectorEnv pid {os.getpid()}", self.allow_pickle, self.hear_envs)

    def make(self, start: int, stop: int) -> Make:
        """The MAKE body for the block of envs ``start..stop-1``."""
        window = 1
        if self.sub_batch_size is not None:  # first-ready sub-batches under way at once
            window = min(-(-(stop - start) // self.sub_batch_size), MAX_RETRY_WINDOW)
        return Make(
            self.autoreset_mode,
            stop - start,
            env_id=None if self.env_fns is not None else self.env_id,
            kwargs=self.env_kwargs,
            factories=None if self.env_fns is None else self.env_fns[start:stop],
            env_threads=self.env_threads,  # None: the host chooses
            retry_window=window,
            kind=self.kind,
        )
