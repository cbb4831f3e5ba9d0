"""The options of a :class:`~envserver.client.RemoteVectorEnv`, in one frozen dataclass, checked.

Also the checks of its other arguments: the ``AsyncVectorEnv`` ones it accepts, the env count,
how the envs spread over the hosts, and env indices.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import zmq
from gymnasium.vector import AutoresetMode

from envserver.wire.endpoints import HostSpec

from ._infos import check_info_format
from ._transport.local import default_host_count
from ._transport.settings import ConnectionSettings

__all__ = [
    "DEFAULT_OPTIONS",
    "FromOptions",
    "VectorOptions",
    "call_rounds",
    "checked_async_arguments",
    "checked_env_ids",
    "count_envs",
    "per_env",
    "split_envs",
    "values_by_env",
]


@dataclasses.dataclass(frozen=True)
class VectorOptions:
    """How a vector env lays out, batches, waits for and recovers its envs.

    The fields are :class:`~envserver.client.RemoteVectorEnv`'s keyword arguments of the same
    names (see there); its signature takes their defaults from :data:`DEFAULT_OPTIONS`.
    Construction checks ``on_host_failure``, ``env_threads``, ``info_format`` and
    ``autoreset_mode`` and normalizes ``autoreset_mode``, ``spare_hosts`` and ``envs_per_host``;
    the sizes are checked against the env and host counts once those are known
    (:meth:`batch_size_for`, :meth:`sub_batch_size_for`, ``split_envs``), and the observation
    mode against the envs' spaces.

    Raises:
        ValueError: For an invalid value.
    """

    copy: bool = True
    observation_mode: str | tuple[gym.Space, gym.Space] = "same"
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP
    info_format: str = "dict"
    batch_size: int | None = None
    sub_batch_size: int | None = None
    env_threads: int | None = None
    envs_per_host: Sequence[int] | None = None
    num_local_hosts: int | None = None
    allow_pickle: bool | None = None
    min_hosts: int | None = None
    connect_timeout_s: float = 60.0
    host_timeout_s: float = 5.0
    request_timeout_s: float | None = None
    on_host_failure: str = "raise"
    spare_hosts: Sequence[str] = ()
    restart_timeout_s: float = 60.0
    snapshot_every: int = 100
    forward_env_output: bool | None = None
    shared_memory: bool = True

    def __post_init__(self) -> None:
        if self.on_host_failure not in ("raise", "restart", "restore"):
            raise ValueError(
                "on_host_failure must be 'raise', 'restart' or 'restore', got "
                f"{self.on_host_failure!r}"
            )
        if type(self.snapshot_every) is not int or self.snapshot_every < 1:
            raise ValueError(
                f"snapshot_every must be a positive integer, got {self.snapshot_every!r}"
            )
        if self.env_threads is not None and (
            type(self.env_threads) is not int or self.env_threads < 1
        ):
            raise ValueError(
                f"env_threads must be a positive integer or None, got {self.env_threads!r}"
            )
        check_info_format(self.info_format)
        if not isinstance(self.autoreset_mode, AutoresetMode):
            object.__setattr__(self, "autoreset_mode", AutoresetMode(self.autoreset_mode))
        object.__setattr__(self, "spare_hosts", tuple(self.spare_hosts))
        for spare in self.spare_hosts:  # refused now, not at the recovery that needs it
            HostSpec.parse(spare)
        if self.envs_per_host is not None:
            object.__setattr__(self, "envs_per_host", tuple(self.envs_per_host))

    def batch_size_for(self, num_envs: int) -> int:
        """How many envs ``recv`` returns (default: all), checked against ``num_envs``."""
        batch_size = num_envs if self.batch_size is None else int(self.batch_size)
        if not 1 <= batch_size <= num_envs:
            raise ValueError(f"batch_size must be between 1 and num_envs={num_envs}")
        return batch_size

    def sub_batch_size_for(self, batch_size: int, num_hosts: int) -> int:
        """How many envs a host steps per first-ready request (default: a host's share)."""
        sub_batch_size = self.sub_batch_size
        if sub_batch_size is None:
            sub_batch_size = max(1, batch_size // num_hosts)
        if sub_batch_size < 1:
            raise ValueError("sub_batch_size must be positive")
        return int(sub_batch_size)

    def connection_settings(
        self, *, allow_pickle: bool, curve: tuple[bytes, bytes, bytes] | None, local: bool
    ) -> ConnectionSettings:
        """How the vector env's connections behave, from these options.

        Args:
            allow_pickle: Whether replies may carry pickled values (see ``EnvRecipe``).
            curve: The CURVE keys, or None.
            local: Whether the hosts are local ones (only they may share memory).
        """
        return ConnectionSettings(
            allow_pickle=allow_pickle,
            host_timeout_s=self.host_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            request_timeout_s=self.request_timeout_s,
            curve=curve,
            shared_memory=self.shared_memory and local,
            recovers=self.on_host_failure != "raise",
        )

    def local_host_count(self, num_envs: int) -> int:
        """How many local hosts to start (when no hosts are given)."""
        if self.envs_per_host is not None:
            return len(self.envs_per_host)
        return self.num_local_hosts or default_host_count(num_envs)


#: Every option at its default: the one source of the defaults that ``RemoteVectorEnv``'s
#: signature and ``envserver rollout``'s flags show.
DEFAULT_OPTIONS = VectorOptions()


class FromOptions:
    """A read-only attribute of the vector env: its option of the same name.

    Options are set when the env is made; assigning one afterwards raises, rather than leaving
    the parts that use it with the old value.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else getattr(instance.options, self.name)

    def __set__(self, instance: Any, value: Any) -> None:
        raise AttributeError(
            f"{self.name} is set when the env is made (RemoteVectorEnv(..., {self.name}=...)) "
            "and cannot change afterwards"
        )


def checked_async_arguments(
    context: Any, worker: Any, max_concurrency: int | None
) -> zmq.Context | None:
    """Checks the arguments only ``AsyncVectorEnv`` has, so a swapped call fails helpfully.

    Returns:
        The ZeroMQ context to use (None: a new one).
    """
    if worker is not None:
        raise TypeError(
            "RemoteVectorEnv has no worker function to replace: each host runs its envs in its "
            "own loop; put custom per-env logic in a gymnasium.Wrapper instead"
        )
    if max_concurrency is not None:
        raise TypeError(
            "RemoteVectorEnv has no max_concurrency: each host steps its envs one after "
            "another, so concurrency is the number of hosts (num_local_hosts, envs_per_host)"
        )
    if isinstance(context, str):
        gym.logger.warn(
            f"RemoteVectorEnv ignores context={context!r} (a multiprocessing start method): its "
            "hosts are processes of their own; `context` takes a zmq.Context"
        )
        return None
    if context is not None and not isinstance(context, zmq.Context):
        raise TypeError(f"context must be a zmq.Context or None, got {type(context).__name__}")
    return context


def per_env(
    env_id: str | Sequence[str] | None, env_kwargs: Mapping[str, Any] | Sequence[Any] | None
) -> tuple[str | tuple[str, ...] | None, dict[str, Any] | tuple[dict[str, Any], ...]]:
    """``env_id`` and ``env_kwargs``, checked: one for every env, or a tuple of one per env.

    Raises:
        TypeError: If an id is not a string or kwargs are not a dict (or a list of them).
        ValueError: If a list of them is empty.
    """
    if env_id is not None and not isinstance(env_id, str):
        if not isinstance(env_id, Sequence) or not all(isinstance(i, str) for i in env_id):
            raise TypeError(f"env_id must be a string or a list of strings, got {env_id!r}")
        if not env_id:
            raise ValueError("env_id is an empty list")
        env_id = tuple(env_id)
    if env_kwargs is None or isinstance(env_kwargs, Mapping):
        return env_id, dict(env_kwargs or {})
    if not isinstance(env_kwargs, Sequence) or not all(isinstance(k, Mapping) for k in env_kwargs):
        raise TypeError(f"env_kwargs must be a dict or a list of dicts, got {env_kwargs!r}")
    if not env_kwargs:
        raise ValueError("env_kwargs is an empty list")
    return env_id, tuple(dict(kwargs) for kwargs in env_kwargs)


def count_envs(
    env_fns: Sequence[Callable[[], gym.Env]] | None,
    env_id: str | tuple[str, ...] | None,
    num_envs: int | None,
    env_kwargs: dict[str, Any] | tuple[dict[str, Any], ...] | None = None,
) -> int:
    """The number of envs asked for, checked.

    Raises:
        ValueError: If not exactly one of ``env_fns`` and ``env_id`` is given, or the count is
            not a positive integer (or disagrees with ``env_fns``, or with a list of ids or
            kwargs, one per env).
    """
    if (env_fns is None) == (env_id is None):
        raise ValueError("give exactly one of env_fns and env_id")
    if env_fns is not None:
        count = len(list(env_fns))
        if num_envs is not None and num_envs != count:
            raise ValueError(f"num_envs={num_envs} but {count} env_fns were given")
        num_envs = count
    elif isinstance(env_id, tuple) or isinstance(env_kwargs, tuple):
        for name, listed in [("env_id", env_id), ("env_kwargs", env_kwargs)]:
            if not isinstance(listed, tuple):
                continue
            if num_envs is not None and num_envs != len(listed):
                raise ValueError(f"num_envs={num_envs} but {name} lists {len(listed)} envs")
            num_envs = len(listed)
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    return num_envs


def split_envs(num_envs: int, num_hosts: int, envs_per_host: Sequence[int] | None) -> list[int]:
    """How many envs each host gets: as even as possible, or as the user said."""
    if envs_per_host is not None:
        counts = [int(c) for c in envs_per_host]
        if len(counts) != num_hosts:
            raise ValueError(f"envs_per_host has {len(counts)} entries for {num_hosts} hosts")
        if any(c < 1 for c in counts) or sum(counts) != num_envs:
            raise ValueError(
                f"envs_per_host must be positive counts summing to num_envs={num_envs}, "
                f"got {counts}"
            )
        return counts
    if num_hosts > num_envs:
        raise ValueError(f"{num_hosts} hosts for {num_envs} envs: each host needs at least one")
    base, extra = divmod(num_envs, num_hosts)
    return [base + (1 if i < extra else 0) for i in range(num_hosts)]


def checked_env_ids(env_ids: Sequence[int], num_envs: int) -> list[int]:
    """Env indices as ints; negative ones count from the end, as in Python indexing.

    Raises:
        ValueError: If one is not an integer in ``-num_envs..num_envs-1``.
    """
    try:
        ids = [operator.index(i) for i in env_ids]
    except TypeError:
        raise ValueError(f"env_ids must be integers, got {env_ids!r}") from None
    if not all(-num_envs <= i < num_envs for i in ids):
        raise ValueError(f"env_ids must be env indices below {num_envs}, got {env_ids!r}")
    return [i % num_envs for i in ids]


def call_rounds(ids: Sequence[int]) -> list[list[int]]:
    """Positions of ``ids`` grouped into rounds in which no env appears twice, in order."""
    rounds: list[list[int]] = []
    for position, env in enumerate(ids):
        for positions in rounds:
            if all(ids[p] != env for p in positions):
                positions.append(position)
                break
        else:
            rounds.append([position])
    return rounds


def values_by_env(values: list[Any] | tuple[Any, ...] | Any, ids: Sequence[int]) -> dict[int, Any]:
    """``set_attr``'s values by env: one per entry of ``ids`` (a list or tuple), or one for all.

    An env named twice gets its last value.

    Raises:
        ValueError: If a list or tuple does not have one value per entry of ``ids``.
    """
    if not isinstance(values, (list, tuple)):
        values = [values for _ in ids]
    if len(values) != len(ids):
        raise ValueError(
            "Values must be a list or tuple with length equal to the number of "
            f"environments. Got `{len(values)}` values for {len(ids)} environments."
        )
    return dict(zip(ids, values))
