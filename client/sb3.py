"""A Stable-Baselines3 ``VecEnv`` whose envs run on env hosts: a drop-in for ``SubprocVecEnv``.

Swap ``SubprocVecEnv`` (or ``DummyVecEnv``) for :class:`RemoteVecEnv`::

    from stable_baselines3.common.env_util import make_vec_env
    from envserver.client.sb3 import RemoteVecEnv

    env = make_vec_env("CartPole-v1", n_envs=8, vec_env_cls=RemoteVecEnv)  # local hosts

or point it at hosts, by env id (no pickle involved)::

    env = VecMonitor(RemoteVecEnv(env_id="CartPole-v1", num_envs=8, hosts=["dns://envhost:5555"]))

It is a thin layer over :class:`envserver.client.RemoteVectorEnv` (in SAME_STEP autoreset mode, with
per-env infos), so every option of that class applies. Results are those of ``DummyVecEnv`` for
the same seeds and actions: observations, float32 rewards, dones, infos with
``terminal_observation`` and ``TimeLimit.truncated``, and ``reset_infos``.

This module needs ``stable-baselines3`` (``pip install 'envserver[sb3]'``);
``import envserver.client`` does not import it.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array

from ._vector import RemoteVectorEnv

try:
    from stable_baselines3.common.vec_env import VecEnv
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnvIndices,
        VecEnvObs,
        VecEnvStepReturn,
    )
except ImportError as exc:  # the sb3 extra installs it
    raise ImportError(
        "envserver.client.sb3 needs Stable-Baselines3: pip install 'envserver[sb3]'"
    ) from exc

__all__ = ["RemoteVecEnv"]

#: Options this adapter sets itself: SB3's API fixes them.
_FIXED_OPTIONS = frozenset(
    {"autoreset_mode", "info_format", "batch_size", "sub_batch_size", "copy"}
)
#: Whether this process was warned that torch's threads and the local hosts outnumber the cores.
_threads_warned = False


class RemoteVecEnv(VecEnv):
    """An SB3 ``VecEnv`` over env hosts, with the semantics of ``SubprocVecEnv``.

    With local hosts, give torch fewer threads: by default it starts one per core, and those
    threads fight the hosts for the cores whenever the machine is busy (training can be several
    times slower). Call ``torch.set_num_threads(1)``, or the cores less the hosts, before
    making the env; this class warns once when torch has more threads than that.

    Args:
        env_fns: One factory per env, as for ``SubprocVecEnv`` (shipped with cloudpickle; the
            embedded local hosts accept it, remote hosts need ``--allow-pickle``). Leave out
            when ``env_id`` is given.
        start_method: Accepted for ``SubprocVecEnv`` compatibility, and ignored (hosts are
            separate processes started by the client, or already running).
        env_id: A registered env id, made on the hosts with ``gymnasium.make(env_id,
            **env_kwargs)``: no pickle involved. Episode statistics then come from wrapping
            this env in ``VecMonitor``.
        num_envs: The number of envs (with ``env_id``).
        env_kwargs: Keyword arguments for ``gymnasium.make``.
        hosts: Env hosts (endpoints, ``dns://`` or ``slurm://`` specs, or ``ray://``); None:
            ``$ENVSERVER_HOSTS``, else local hosts (see :class:`envserver.client.RemoteVectorEnv`).
        **options: Any other :class:`envserver.client.RemoteVectorEnv` option (``curve_server_key``,
            ``on_host_failure``, ``min_hosts``, ``envs_per_host``, ...).

    Attributes:
        remote: The :class:`envserver.client.RemoteVectorEnv` underneath.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]] | None = None,
        start_method: str | None = None,
        *,
        env_id: str | None = None,
        num_envs: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        hosts: Sequence[str] | str | None = None,
        **options: Any,
    ) -> None:
        fixed = sorted(_FIXED_OPTIONS.intersection(options))
        if fixed:
            raise TypeError(f"RemoteVecEnv sets {', '.join(fixed)} itself (SB3's API fixes them)")
        self.remote = RemoteVectorEnv(
            env_fns,
            env_id=env_id,
            env_kwargs=env_kwargs,
            num_envs=num_envs,
            hosts=hosts,
            autoreset_mode=AutoresetMode.SAME_STEP,
            info_format="list",
            **options,
        )
        try:
            super().__init__(
                self.remote.num_envs,
                self.remote.single_observation_space,
                self.remote.single_action_space,
            )
        except BaseException:
            self.remote.close()
            raise
        _warn_of_torch_threads(self.remote)
        # The envs' metadata, as DummyVecEnv gives it (VecVideoRecorder reads its render_fps).
        self.metadata = {k: v for k, v in self.remote.metadata.items() if k != "autoreset_mode"}

    # ------------------------------------------------------------- reset and step

    def reset(self) -> VecEnvObs:
        """Resets every env with the seeds of :meth:`seed` and options of :meth:`set_options`.

        Both are used once, as in SB3; ``reset_infos`` holds each env's reset info.
        """
        seeds = list(self._seeds)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        obs: Any = None
        for options, mask in _option_groups(self._options):
            if mask.all():
                obs, got = self.remote.reset(seed=seeds, options=options or None)
            else:  # an env without options gets {} here where DummyVecEnv passes None
                obs, got = self.remote.reset(seed=seeds, options={**options, "reset_mask": mask})
            for i in np.flatnonzero(mask):
                infos[i] = got[i]
        self.reset_infos = infos
        self._reset_seeds()
        self._reset_options()
        return self._sb3_obs(obs)

    def step_async(self, actions: np.ndarray) -> None:
        """Sends the actions: a batch, or for Tuple and Dict action spaces a list per env."""
        self.remote.step_async(self._batched(actions))

    def step_wait(self) -> VecEnvStepReturn:
        """Waits for the step: observations, float32 rewards, dones and one info per env."""
        obs, rewards, terminations, truncations, entries = self.remote.step_wait()
        dones = np.logical_or(terminations, truncations)
        infos = []
        for i, info in enumerate(entries):
            if dones[i]:
                final_obs = info.pop("final_obs")
                step_info = info.pop("final_info")
                if info.pop("host_failure", False):
                    step_info["host_failure"] = True
                self.reset_infos[i] = info
                info = step_info
            info["TimeLimit.truncated"] = bool(truncations[i] and not terminations[i])
            if dones[i]:
                info["terminal_observation"] = final_obs
            infos.append(info)
        return self._sb3_obs(obs), rewards.astype(np.float32), dones, infos

    # ------------------------------------------------------------- envs' attributes

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Reads ``attr_name`` of the envs at ``indices`` (all by default)."""
        return list(self.remote.call_envs(self._ids(indices), attr_name))

    def has_attr(self, attr_name: str) -> bool:
        """Whether the first env (or one of its wrappers) has ``attr_name``."""
        return bool(self.remote.call_envs([0], "has_wrapper_attr", attr_name)[0])

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Sets ``attr_name`` to ``value`` on the outermost wrapper of the envs at ``indices``."""
        ids = self._ids(indices)
        self.remote.set_attr(attr_name, [value] * len(ids), env_ids=ids, outermost=True)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Calls ``method_name`` on the envs at ``indices`` (all by default)."""
        ids = self._ids(indices)
        return list(self.remote.call_envs(ids, method_name, *method_args, **method_kwargs))

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Whether each env at ``indices`` is wrapped with ``wrapper_class`` (or a subclass).

        The hosts list each wrapper's MRO by name; the class's module-qualified name is looked
        up in them here: no class crosses the wire.
        """
        name = f"{wrapper_class.__module__}.{wrapper_class.__qualname__}"
        chains = self.remote.wrappers(self._ids(indices))
        return [any(name in wrapper for wrapper in chain) for chain in chains]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` (envs made with ``render_mode="rgb_array"``)."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is "
                "`rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return list(self.remote.render())

    def close(self) -> None:
        """Closes the envs, their sessions, and the local hosts if any."""
        self.remote.close()

    # ------------------------------------------------------------- conversions

    def _ids(self, indices: VecEnvIndices) -> list[int]:
        """SB3's ``indices`` (None, an int, or an iterable of ints) as a list."""
        return list(self._get_indices(indices))

    def _sb3_obs(self, obs: Any) -> VecEnvObs:
        """SB3's form of a batch: an ``OrderedDict`` for Dict spaces, else Gymnasium's."""
        if isinstance(self.observation_space, spaces.Dict):
            return OrderedDict(obs)
        return obs

    def _batched(self, actions: Any) -> Any:
        """Gymnasium's batch of actions from SB3's.

        For Tuple and Dict action spaces, SB3 (``DummyVecEnv``) takes a list of per-env actions.
        """
        space = self.action_space
        if isinstance(space, (spaces.Tuple, spaces.Dict)) and isinstance(actions, list):
            out = create_empty_array(space, n=self.num_envs, fn=np.zeros)
            return concatenate(space, actions, out)
        return actions


def _warn_of_torch_threads(remote: RemoteVectorEnv) -> None:
    """Warns once per process when torch's threads and the local hosts outnumber the cores.

    One thread is never warned of (it is the least torch takes). Only a trainer that imported
    torch is asked (this module never imports it); hosts on other machines take no core here.
    """
    global _threads_warned
    torch = sys.modules.get("torch")
    if _threads_warned or torch is None or remote._hosts.local is None:
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    threads, hosts = torch.get_num_threads(), len(remote.hosts)
    enough = max(1, cores - hosts)  # one thread is the least, however many hosts
    if threads <= enough:
        return
    _threads_warned = True
    warnings.warn(
        f"torch runs {threads} threads beside {hosts} local env hosts on {cores} cores: they "
        "fight for the cores, and on a busy machine training can be several times slower; "
        f"call torch.set_num_threads({enough}) before making the env",
        stacklevel=3,
    )


def _option_groups(options: list[dict[str, Any]]) -> list[tuple[dict[str, Any], np.ndarray]]:
    """Groups envs by identical reset options: ``(options, mask of the envs that have them)``."""
    groups: list[tuple[dict[str, Any], np.ndarray]] = []
    for i, option in enumerate(options):
        for known, mask in groups:
            if _identical(known, option):
                mask[i] = True
                break
        else:
            mask = np.zeros(len(options), dtype=np.bool_)
            mask[i] = True
            groups.append((option, mask))
    return groups


def _identical(a: Any, b: Any) -> bool:
    """Equal values of the same types (1, 1.0 and True differ), arrays by dtype and content."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # values that do not compare: never grouped
        return a is b
