"""The options of a :class:`client.RemoteVectorEnv`, in one frozen dataclass, checked once."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from client._results import check_info_format

__all__ = ["VectorOptions"]


@dataclasses.dataclass(frozen=True)
class VectorOptions:
    """How a vector env lays out, batches, waits for and recovers its envs.

    The fields are :class:`client.RemoteVectorEnv`'s keyword arguments of the same names (see
    there); construction checks them and normalizes ``autoreset_mode`` and ``spare_hosts``.

    Raises:
        ValueError: For an invalid value.
    """

    copy: bool = True
    observation_mode: str | tuple[gym.Space, gym.Space] = "same"
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP
    info_format: str = "dict"
    batch_size: int | None = None
    sub_batch_size: int | None = None
    env_threads: int = 1
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

    def __post_init__(self) -> None:
        if self.on_host_failure not in ("raise", "restart"):
            raise ValueError(
                f"on_host_failure must be 'raise' or 'restart', got {self.on_host_failure!r}"
            )
        if type(self.env_threads) is not int or self.env_threads < 1:
            raise ValueError(f"env_threads must be a positive integer, got {self.env_threads!r}")
        check_info_format(self.info_format)
        if not isinstance(self.autoreset_mode, AutoresetMode):
            object.__setattr__(self, "autoreset_mode", AutoresetMode(self.autoreset_mode))
        object.__setattr__(self, "spare_hosts", tuple(self.spare_hosts))
        if self.envs_per_host is not None:
            object.__setattr__(self, "envs_per_host", tuple(self.envs_per_host))
