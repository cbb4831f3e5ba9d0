"""What every host of a vector env is asked to make: the HELLO and MAKE request bodies."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, load_env_creator
from gymnasium.vector import AutoresetMode

from envserver.launch.environment import FORWARD_ENV_OUTPUT_VARIABLE, switch
from envserver.wire.bodies import GYM, Hello, MainEntryPoint, Make
from envserver.wire.messages import MAX_RETRY_WINDOW

from ._options import VectorOptions

__all__ = ["EnvRecipe", "trainer_specs"]


def trainer_specs(env_ids: Iterable[str] | None) -> tuple[EnvSpec, ...]:
    """The specs of this process's registry, to travel (pickled) with MAKE.

    Ids naming their module (``module:EnvId``) are left out: the host imports the module. An
    entry point in ``__main__`` travels with the callable it names (cloudpickle sends it by
    value); a spec that cannot be pickled stays behind (``EnvSpecs``).

    Args:
        env_ids: The ids made (their specs, where this process has them); None: every spec
            (factories may make any id).
    """
    registry = gym.envs.registration.registry
    if env_ids is None:
        specs = list(registry.values())
    else:
        specs = [registry[i] for i in dict.fromkeys(env_ids) if ":" not in i and i in registry]
    return tuple(_with_main_creator(spec) for spec in specs)


def _with_main_creator(spec: EnvSpec) -> EnvSpec:
    """``spec``, with an entry point ``"__main__:Name"`` carrying the callable it names."""
    entry_point = spec.entry_point
    if not isinstance(entry_point, str) or not entry_point.startswith("__main__:"):
        return spec
    try:
        creator = load_env_creator(entry_point)
    except (ImportError, AttributeError):  # not in this __main__: the host will say so
        return spec
    return dataclasses.replace(spec, entry_point=MainEntryPoint(entry_point, creator))


@dataclass(frozen=True)
class EnvRecipe:
    """How a host makes its block of envs: at set-up, and again after a host failure.

    Attributes:
        env_fns: One factory per env (shipped pickled), or None.
        env_id: A registered env id (made with ``gymnasium.make``), one per env (a tuple), or
            None.
        env_kwargs: Keyword arguments for ``gymnasium.make``, or one such dict per env (a
            tuple).
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
        specs: The specs this process registered that travel with MAKE (see
            :func:`trainer_specs`).
    """

    env_fns: list[Callable[[], gym.Env]] | None
    env_id: str | tuple[str, ...] | None
    env_kwargs: dict[str, Any] | tuple[dict[str, Any], ...] = field(default_factory=dict)
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP
    env_threads: int | None = None
    allow_pickle: bool = False
    hear_envs: bool = True
    sub_batch_size: int | None = None
    kind: str = GYM
    specs: tuple[EnvSpec, ...] = ()

    @classmethod
    def of(
        cls,
        env_fns: list[Callable[[], gym.Env]] | None,
        env_id: str | tuple[str, ...] | None,
        env_kwargs: dict[str, Any] | tuple[dict[str, Any], ...] | None,
        options: VectorOptions,
        *,
        local: bool,
        kind: str = GYM,
    ) -> EnvRecipe:
        """The recipe of a vector env with these options (``local``: on embedded local hosts).

        Pickle is allowed where ``options.allow_pickle`` says, by default on local hosts only;
        the hosts send what the envs say unless ``options.forward_env_output`` (or
        ``$ENVSERVER_FORWARD_ENV_OUTPUT``) says not to. The specs this process registered
        travel with factories, and to local hosts that allow pickle.

        Raises:
            ValueError: If ``$ENVSERVER_FORWARD_ENV_OUTPUT`` is neither a yes nor a no.
        """
        allow_pickle = local if options.allow_pickle is None else bool(options.allow_pickle)
        hear = switch(options.forward_env_output, FORWARD_ENV_OUTPUT_VARIABLE, default=True)
        specs: tuple[EnvSpec, ...] = ()
        if kind == GYM and env_fns is not None:
            specs = trainer_specs(None)
        elif kind == GYM and local and allow_pickle:
            specs = trainer_specs([env_id] if isinstance(env_id, str) else env_id)
        return cls(
            env_fns,
            env_id,
            env_kwargs or {},
            options.autoreset_mode,
            options.env_threads,
            allow_pickle,
            hear,
            kind=kind,
            specs=specs,
        )

    def hello(self) -> Hello:
        """The HELLO body: who this client is, whether it takes pickle and what envs say."""
        return Hello(f"RemoteVectorEnv pid {os.getpid()}", self.allow_pickle, self.hear_envs)

    def make(self, start: int, stop: int) -> Make:
        """The MAKE body for the block of envs ``start..stop-1``."""
        window = 1
        if self.sub_batch_size is not None:  # first-ready sub-batches under way at once
            window = min(-(-(stop - start) // self.sub_batch_size), MAX_RETRY_WINDOW)
        env_id, kwargs, envs = None, {}, None
        if self.env_fns is None:
            envs = self._envs(start, stop)
            if all(made == envs[0] for made in envs):  # the same envs: one id and kwargs
                (env_id, kwargs), envs = envs[0], None
        return Make(
            self.autoreset_mode,
            stop - start,
            env_id=env_id,
            kwargs=kwargs,
            factories=None if self.env_fns is None else self.env_fns[start:stop],
            env_threads=self.env_threads,  # None: the host chooses
            retry_window=window,
            kind=self.kind,
            envs=envs,
            specs=self.specs,
        )

    def _envs(self, start: int, stop: int) -> tuple[tuple[str, dict[str, Any]], ...]:
        """The id and kwargs of each env ``start..stop-1``."""
        count = stop - start
        ids = self.env_id[start:stop] if isinstance(self.env_id, tuple) else (self.env_id,) * count
        kwargs = self.env_kwargs
        kwargs = kwargs[start:stop] if isinstance(kwargs, tuple) else (kwargs,) * count
        return tuple(zip(ids, kwargs))
