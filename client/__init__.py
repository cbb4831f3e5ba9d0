"""The trainer side of envserver: a Gymnasium vector env whose envs run on env hosts.

Swap ``gymnasium.vector.AsyncVectorEnv`` for :class:`RemoteVectorEnv`, or
``gymnasium.make_vec`` for :func:`make_vec`, and point them at hosts started with
``envserver serve`` (or at none: local hosts are started and cleaned up for you).

The package lives in the repository's ``client/`` folder and installs as ``envserver.client``.
It imports the wire, CURVE and launch layers of :mod:`envserver`, never the host: it reaches
hosts over the wire, and starts local ones as processes (:mod:`envserver.launch`). It imports
the command line only in :mod:`envserver.client.commands`, its entry-point plugin.

Inside, two parts (tests/system/test_layers.py pins the seam):

- ``_transport``: what speaks ZeroMQ (connections and their requests in flight, the pool and
  its waits, the lean step's receive, leases, discovery, local hosts, what envs said). It
  never imports Gymnasium nor the modules beside it.
- the modules beside it: Gymnasium's semantics (the vector env, lockstep and first-ready
  calls, recovery, results and infos, replay, spaces), built on the transport.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, VectorizeMode
from gymnasium.vector.async_vector_env import AsyncState

import envserver
from envserver.errors import (
    BatchTypeError,
    EnvLostError,
    EnvNotAllowedError,
    EnvServerError,
    HostUnavailableError,
    LimitError,
    MessageTooLargeError,
    PickleNotAllowedError,
    ProtocolError,
    ProtocolVersionError,
    RemoteEnvError,
    RequestTimeoutError,
    StateMismatchError,
    UnknownSessionError,
    UnsupportedSpaceError,
    UnsupportedStateError,
    WaitTimeoutError,
)

from ._flat import FlatAgentsVectorEnv
from ._multiagent import MultiAgentVectorEnv
from ._recovery.history import derived_seed
from ._vector import RemoteVectorEnv

__all__ = [
    "AsyncState",
    "BatchTypeError",
    "EnvLostError",
    "EnvNotAllowedError",
    "EnvServerError",
    "FlatAgentsVectorEnv",
    "HostUnavailableError",
    "LimitError",
    "MessageTooLargeError",
    "MultiAgentVectorEnv",
    "PickleNotAllowedError",
    "ProtocolError",
    "ProtocolVersionError",
    "RemoteEnvError",
    "RemoteVectorEnv",
    "RequestTimeoutError",
    "StateMismatchError",
    "UnknownSessionError",
    "UnsupportedSpaceError",
    "UnsupportedStateError",
    "WaitTimeoutError",
    "derived_seed",
    "make_vec",
]


def _check_one_tree() -> None:
    """Refuses to run with an ``envserver`` from another source tree than this client's.

    Installed, this package is ``envserver/client/``; in a source tree it is ``client/`` beside
    ``envserver/``. Another checkout's ``envserver`` on ``PYTHONPATH`` beside this checkout's
    editable install would otherwise run one tree's client with the other's wire and host code.
    """
    package = Path(envserver.__file__).resolve().parent
    here = Path(__file__).resolve().parent
    if package not in (here.parent, here.parent / "envserver"):
        raise ImportError(
            f"envserver.client from {here} does not belong to envserver from {package}: they come "
            f"from two source trees. To run a checkout from PYTHONPATH, link its client into its "
            f"envserver first: ln -s ../client {package}/client"
        )


_check_one_tree()


def _check_vectorization_mode(mode: VectorizeMode | str | None) -> None:
    value = mode.value if isinstance(mode, VectorizeMode) else mode
    if value in VECTORIZATION_MODES:
        return
    if value == VectorizeMode.VECTOR_ENTRY_POINT.value:
        raise ValueError(
            "vectorization_mode='vector_entry_point' is not supported: envserver runs each env "
            "on a host; use gymnasium.make_vec for an env's own vector entry point"
        )
    raise ValueError(
        f"vectorization_mode must be one of {list(VECTORIZATION_MODES)} (or a VectorizeMode "
        f"of them; the envs run on hosts either way), got {mode!r}"
    )


def _make_wrapped(
    env_id: str, kwargs: dict[str, Any], wrappers: Sequence[Callable[[gym.Env], gym.Env]]
) -> gym.Env:
    env = gym.make(env_id, **kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env


#: ``RemoteVectorEnv``'s keywords that are not ``make_vec``'s own (every option): vector_kwargs.
VECTOR_KEYWORDS = frozenset(inspect.signature(RemoteVectorEnv).parameters).difference(
    ("env_fns", "env_id", "env_kwargs", "num_envs", "hosts")
)


def _check_env_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuses options of the vector env given among the env's keyword arguments."""
    misplaced = {name: kwargs[name] for name in kwargs if name in VECTOR_KEYWORDS}
    if misplaced:
        names = " and ".join(misplaced)
        are = "is an option" if len(misplaced) == 1 else "are options"
        raise TypeError(
            f"make_vec got {names} among the env's keyword arguments, but {names} {are} of "
            f"the vector env: pass vector_kwargs={misplaced!r}"
        )


#: The vectorization modes ``make_vec`` accepts: Gymnasium's own ones whose envs can run on
#: hosts (the envs run on hosts whichever is given).
VECTORIZATION_MODES = (None, "sync", "async")


def make_vec(
    id: str | EnvSpec,
    num_envs: int = 1,
    vectorization_mode: VectorizeMode | str | None = None,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] | None = None,
    *,
    hosts: Sequence[str] | str | None = None,
    **kwargs: Any,
) -> RemoteVectorEnv:
    """Makes a :class:`RemoteVectorEnv` of a registered env, as ``gymnasium.make_vec`` does.

    It takes ``gymnasium.make_vec``'s arguments, in the same order, so that a call to it runs
    its envs on hosts by changing the module only. Without ``wrappers`` the envs are made on the
    hosts from the id and kwargs alone (no pickle involved, but for local hosts, which get the
    specs of ids this process registered); with ``wrappers`` each env is shipped as a
    cloudpickled factory, which the hosts must allow (local hosts do).

    Args:
        id: The registered env id (``module:EnvId`` included), or its ``EnvSpec`` (whose
            ``kwargs`` come first, then ``kwargs``).
        num_envs: The number of envs.
        vectorization_mode: ``"sync"``, ``"async"`` (or the ``VectorizeMode``) or None:
            accepted, as from a call written for ``gymnasium.make_vec``; the envs run on hosts
            either way.
        vector_kwargs: Keyword arguments for :class:`RemoteVectorEnv` (``autoreset_mode``,
            ``copy``, ``observation_mode``, ``envs_per_host``, ``hosts`` too, ...).
        wrappers: Wrappers applied to each env on its host, in order.
        hosts: Host endpoints, ``dns://`` and ``slurm://`` specs, or ``ray://`` (a list, or one
            string separated by commas); None: ``$ENVSERVER_HOSTS``, else local hosts;
            ``"local"``: local hosts whatever the environment says.
        **kwargs: Keyword arguments for ``gymnasium.make``. An option of
            :class:`RemoteVectorEnv` here (``connect_timeout_s=3``) is refused: it belongs in
            ``vector_kwargs`` (an env whose own keyword shares its name gets it through
            ``RemoteVectorEnv(env_id=..., env_kwargs=...)``).

    Returns:
        The vector env.

    Raises:
        ValueError: For a vectorization mode whose envs cannot run on hosts
            (``"vector_entry_point"``: the env's own vector env) or an unknown one.
        TypeError: For an option of :class:`RemoteVectorEnv` among ``kwargs``.
    """
    _check_env_kwargs(kwargs)
    if isinstance(id, EnvSpec):  # as gymnasium.make_vec: a spec that make_vec recorded
        spec_kwargs = dict(id.kwargs)
        num_envs = spec_kwargs.pop("num_envs", num_envs)
        vectorization_mode = spec_kwargs.pop("vectorization_mode", vectorization_mode)
        vector_kwargs = spec_kwargs.pop("vector_kwargs", vector_kwargs)
        wrappers = spec_kwargs.pop("wrappers", wrappers)
        kwargs = {**spec_kwargs, **kwargs}
        id = id.id
    _check_vectorization_mode(vectorization_mode)
    vector_kwargs = dict(vector_kwargs or {})
    if "hosts" in vector_kwargs:  # RemoteVectorEnv's keyword, given where its others go
        if hosts is not None:
            raise TypeError("make_vec got hosts twice: as hosts= and in vector_kwargs")
        hosts = vector_kwargs.pop("hosts")
    wrappers = list(wrappers or [])
    if wrappers:
        factory = functools.partial(_make_wrapped, id, kwargs, tuple(wrappers))
        envs = RemoteVectorEnv([factory] * num_envs, hosts=hosts, **vector_kwargs)
    else:
        envs = RemoteVectorEnv(
            env_id=id, env_kwargs=kwargs, num_envs=num_envs, hosts=hosts, **vector_kwargs
        )
    envs.spec = _recorded_spec(id, kwargs, num_envs, vectorization_mode, vector_kwargs, wrappers)
    return envs


def _recorded_spec(
    env_id: str,
    kwargs: dict[str, Any],
    num_envs: int,
    mode: VectorizeMode | str | None,
    vector_kwargs: dict[str, Any],
    wrappers: list[Callable[[gym.Env], gym.Env]],
) -> EnvSpec | None:
    """The env's spec with the call's arguments, as ``gymnasium.make_vec`` records them.

    ``module:EnvId`` imports ``module`` here too, as Gymnasium does; None when the env is
    registered only where the hosts run.
    """
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        spec = copy.deepcopy(gym.spec(name))
    except (ImportError, gym.error.Error):
        return None
    spec.kwargs = {**spec.kwargs, **kwargs}
    if num_envs != 1:
        spec.kwargs["num_envs"] = num_envs
    spec.kwargs["vectorization_mode"] = mode.value if isinstance(mode, VectorizeMode) else mode
    if vector_kwargs:
        spec.kwargs["vector_kwargs"] = vector_kwargs
    if wrappers:
        spec.kwargs["wrappers"] = wrappers
    return spec
