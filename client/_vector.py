"""``RemoteVectorEnv``: a Gymnasium vector env whose sub-envs live on env hosts."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import zmq
from gymnasium.vector.async_vector_env import AsyncState

from envserver.curve.keys import load_curve_keys
from envserver.launch.environment import HostChoice
from envserver.wire.bodies import GYM, KINDS

from ._env_calls import EnvCalls
from ._env_results import EnvResults
from ._first_ready import FirstReady
from ._hosts import CLOSE_TIMEOUT_S, Hosts
from ._lockstep import Lockstep
from ._options import (
    FromPart,
    VectorOptions,
    check_option_names,
    checked_async_arguments,
    count_envs,
    per_env,
    takes_options,
)
from ._parts import VectorParts
from ._recipe import EnvRecipe
from ._recovery import Recovery
from ._results import check_options, reset_mask, seeds_for
from ._spaces import VectorSpaces
from ._transport.discovery import Resolver
from ._transport.lease import close_at_exit

__all__ = ["RemoteVectorEnv"]

logger = logging.getLogger(__name__)


@takes_options
class RemoteVectorEnv(EnvCalls):
    """A vector env whose sub-envs run on env hosts, local or remote, over ZeroMQ.

    It behaves as ``gymnasium.vector.AsyncVectorEnv`` does (same results as ``SyncVectorEnv``
    for the same seeds and actions, same async state machine and error types); the sub-envs live
    in env-host processes (``envserver serve``) on any machines the trainer can reach.

    Envs are spread over the hosts in contiguous blocks: host 0 holds envs ``0..k0-1``, host 1 the
    next ``k1``, and so on. By default the counts are as even as possible, earlier hosts taking
    one more where the division is not exact (16 envs on 3 hosts: 6, 5, 5); ``envs_per_host``
    sets them explicitly.

    Each option (the arguments from ``envs_per_host`` on) reads back as an attribute of the same
    name, set once (``copy`` may change, as in ``AsyncVectorEnv``), as the env uses it: the sizes
    left to their defaults (``envs_per_host``, ``batch_size``, ``sub_batch_size``) as they came
    out. ``envs.options`` holds all.

    Examples:
        >>> envs = RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * 4)  # local hosts
        >>> obs, infos = envs.reset(seed=42)
        >>> envs.close()

    Args:
        env_fns: One factory per env, shipped with cloudpickle (hosts must allow pickle; the
            embedded local hosts do), with the specs this process registered (a factory's
            ``gymnasium.make`` finds them). Leave out when ``env_id`` is given.
        env_id: A registered env id (``module:EnvId`` included), made on the hosts with
            ``gymnasium.make(env_id, **env_kwargs)``: the pickle-free path. Or a list of ids,
            one per env (multi-task); with spaces that differ, ``observation_mode="different"``.
            Specs this process registered travel to local hosts (they allow pickle).
        env_kwargs: Keyword arguments for ``gymnasium.make``, or a list of them, one per env
            (domain randomization).
        num_envs: The number of envs (with ``env_id``; a list of ids or kwargs counts them).
        env_kind: What the hosts make: ``"gym"`` envs, or ``"parallel"``: PettingZoo
            Parallel envs (``env_id`` a ``package.module[:callable]``), each one env of this
            vector env whose observation holds every agent's values, laid out as
            :mod:`envserver.wire.agents` says. :class:`MultiAgentVectorEnv` reads that layout
            for you.
        hosts: Env hosts: endpoints (``tcp://sim-a:5555``), ``dns://NAME:PORT`` specs that
            stand for every address of NAME (Compose or Kubernetes replicas behind one name),
            and ``slurm://NODES:PORT`` specs for every node of a Slurm job (``NODES``: ``job``,
            ``het-group-N`` or a node list); only hosts of a spec that answer are used, and
            ``PORT`` may be a range ``PORT-LAST`` (``serve --processes``). Or ``ray://``
            alone: hosts started as actors on a Ray cluster (see :mod:`envserver.launch.ray`).
            A list, or one string of them separated by commas, as ``$ENVSERVER_HOSTS``. None:
            ``$ENVSERVER_HOSTS``, else local hosts; ``"local"`` starts local hosts whatever the
            environment says.
        resolver: Resolves a ``dns://`` name and port to IP addresses (default: the system's
            resolver, A and AAAA records); a hook for other service discovery.
        curve_server_key: The hosts' CURVE public key file, for hosts started with
            ``--curve-secret-key``; traffic is then encrypted and authenticated. Default:
            ``$ENVSERVER_CURVE_SERVER_KEY`` (for hosts that are not local).
        curve_client_key: This client's CURVE secret key file; its public key must be in the
            hosts' ``--authorized-keys`` directory. Default: ``$ENVSERVER_CURVE_CLIENT_KEY``.
        context: A ZeroMQ context to use (a private one by default). A string (an
            ``AsyncVectorEnv`` start method) is ignored with a warning.
        daemon: ``AsyncVectorEnv``'s; without effect: local hosts stop when the trainer dies
            (as daemonic workers do) and may start processes of their own (as others may).
        worker: ``AsyncVectorEnv``'s; refused (``TypeError``): hosts have no worker to replace.
        max_concurrency: ``AsyncVectorEnv``'s; refused (``TypeError``): concurrency is the
            number of hosts.
        **options: The options, an entry each: made from the fields of ``VectorOptions``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]] | None = None,
        *,
        env_id: str | Sequence[str] | None = None,
        env_kwargs: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
        num_envs: int | None = None,
        env_kind: str = GYM,
        hosts: Sequence[str] | str | None = None,
        resolver: Resolver | None = None,
        curve_server_key: str | os.PathLike | None = None,
        curve_client_key: str | os.PathLike | None = None,
        context: zmq.Context | None = None,
        daemon: bool = True,
        worker: Callable[..., None] | None = None,
        max_concurrency: int | None = None,
        **options: Any,
    ) -> None:
        context = checked_async_arguments(context, worker, max_concurrency)
        check_option_names(options, RemoteVectorEnv)
        choice = HostChoice.of(hosts, options.get("min_hosts"), curve_server_key, curve_client_key)
        if env_fns is not None:
            env_fns = list(env_fns)  # a generator is read once
        env_id, env_kwargs = per_env(env_id, env_kwargs)
        #: The env factories (None when the envs are made from ``env_id``).
        self.env_fns = env_fns
        self._env_id = env_id  # for repr: the spec is None for an id only the hosts know
        #: The options, checked (the keyword arguments of the same names).
        self.options = options = VectorOptions(**{**options, "min_hosts": choice.min_hosts})
        # The parts: the hosts and their connections; then, made by _setup, the envs' last
        # results, the recovery of failed hosts, lockstep calls and first-ready batches.
        self._hosts = Hosts(options, context)
        self._results: EnvResults | None = None
        self._recovery: Recovery | None = None
        self._lockstep: Lockstep | None = None
        self._first_ready: FirstReady | None = None
        try:
            logger.info("%s", choice.describe())
            curve = load_curve_keys(choice.curve_server_key, choice.curve_client_key)
            if env_kind not in KINDS:
                raise ValueError(f"env_kind must be one of {list(KINDS)}, got {env_kind!r}")
            recipe = EnvRecipe.of(
                env_fns, env_id, env_kwargs, options, local=choice.local, kind=env_kind
            )
            num_envs = count_envs(env_fns, env_id, num_envs, env_kwargs)
            self._setup(recipe, num_envs, choice.hosts, resolver, curve)
        except BaseException:
            # Close the sessions already opened, so remote hosts free their envs.
            self.close_extras(terminate=False)
            self.closed = True
            raise
        close_at_exit(self)  # a script that ends without close() still frees the hosts' envs

    # ------------------------------------------------------------- set-up

    def _setup(
        self,
        recipe: EnvRecipe,
        num_envs: int,
        hosts: Sequence[str] | str | None,
        resolver: Resolver | None,
        curve: tuple[bytes, bytes, bytes] | None,
    ) -> None:
        """Finds or starts the hosts, connects to them, makes the envs, and composes the parts.

        Then the options hold the sizes in use, and the env has the spaces Gymnasium's have.
        """
        options = self.options
        self.num_envs = num_envs
        endpoints = self._hosts.find(
            hosts, num_envs, curve, resolver, allow_pickle=recipe.allow_pickle
        )
        batch_size = options.batch_size_for(num_envs)
        pool = self._hosts.connect(
            endpoints, num_envs, allow_pickle=recipe.allow_pickle, curve=curve
        )
        counts = tuple(c.block.count for c in pool.connections)
        self.options = options = dataclasses.replace(  # the sizes as they came out
            options,
            envs_per_host=counts,
            batch_size=batch_size,
            sub_batch_size=options.sub_batch_size_for(batch_size, len(counts)),
        )
        recipe = dataclasses.replace(recipe, sub_batch_size=options.sub_batch_size)
        made = self._hosts.make_envs(recipe)
        spaces = VectorSpaces.of(made, options.observation_mode)
        self._hosts.pool.use_layout(made, spaces.step_layout)
        # The spaces, metadata and render mode Gymnasium's vector envs have.
        self.metadata = {**spaces.metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = spaces.render_mode
        self.single_action_space = spaces.single_action_space
        self.action_space = spaces.action_space
        self.single_observation_space = spaces.single_observation_space
        self.observation_space = spaces.observation_space
        parts = VectorParts.compose(self._hosts, recipe, spaces, options, batch_size)
        self._results, self._recovery = parts.results, parts.recovery
        self._lockstep, self._first_ready = parts.lockstep, parts.first_ready
        self._pool = pool

    # ------------------------------------------------------- reset

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Resets the sub-envs and returns the batched observations and infos.

        Args:
            seed: None (random seeds), an int (env ``i`` gets ``seed + i``) or one per env.
            options: Passed to every env's reset; ``options["reset_mask"]`` (a bool array with
                one entry per env) resets only the envs it marks.

        Returns:
            The batched observations and infos.
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """Sends the reset to the hosts; collect the result with :meth:`reset_wait`.

        Raises:
            ClosedEnvironmentError: If the env was closed.
            AlreadyPendingCallError: If another call is pending.
            TypeError: If ``options`` is not a dict (it travels as a map).
        """
        self._assert_is_running()
        check_options(options)
        seeds = seeds_for(seed, range(self.num_envs))
        if len(seeds) != self.num_envs:
            raise ValueError(
                "If seeds are passed as a list the length must match "
                f"num_envs={self.num_envs} but got length={len(seeds)}."
            )
        self._assert_idle("reset_async", dot="")
        options, mask = reset_mask(options, self.num_envs)
        self._lockstep.send_reset(seeds, options, mask)

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Waits for the reset started by :meth:`reset_async`.

        Args:
            timeout: Seconds to wait; None waits as long as the hosts are alive.

        Returns:
            The batched observations and infos.

        Raises:
            NoAsyncCallError: If no reset is pending.
            WaitTimeoutError: If the hosts did not answer in time (also a
                ``multiprocessing.TimeoutError`` and a ``TimeoutError``).
        """
        self._assert_is_running()
        self._lockstep.check_waiting(AsyncState.WAITING_RESET)
        return self._lockstep.reset_result(timeout, "reset_wait")

    # ------------------------------------------------------- step

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every sub-env with its action.

        Args:
            actions: A batch of actions from :attr:`action_space`.

        Returns:
            Batched observations, rewards, terminations, truncations and infos.
        """
        lockstep = self._lockstep  # step_async then step_wait, in one call (the hot path)
        if self.closed or lockstep.state is not AsyncState.DEFAULT or self._first_ready.busy:
            self._assert_is_running()
            self._assert_idle("step_async")  # (the name AsyncVectorEnv.step gives)
        lockstep.send_step(actions)
        return lockstep.step_result(None, "step")

    def step_async(self, actions: Any) -> None:
        """Sends the actions to the hosts; collect the result with :meth:`step_wait`.

        Raises:
            ValueError: If the number or shape of the actions is wrong.
            ClosedEnvironmentError: If the env was closed.
            AlreadyPendingCallError: If another call is pending.
        """
        if self.closed or self._lockstep.state is not AsyncState.DEFAULT or self._first_ready.busy:
            self._assert_is_running()
            self._assert_idle("step_async")
        self._lockstep.send_step(actions)

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Waits for the step started by :meth:`step_async`.

        Args:
            timeout: Seconds to wait; None waits as long as the hosts are alive.

        Returns:
            Batched observations, rewards, terminations, truncations and infos.

        Raises:
            NoAsyncCallError: If no step is pending.
            WaitTimeoutError: If the hosts did not answer in time.
        """
        lockstep = self._lockstep
        if self.closed or lockstep.state is not AsyncState.WAITING_STEP:
            self._assert_is_running()
            lockstep.check_waiting(AsyncState.WAITING_STEP)
        return lockstep.step_result(timeout, "step_wait")

    # ------------------------------------------------------- first-ready batches

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Sends actions to some envs without waiting (EnvPool's interface).

        Each host steps its envs in sub-batches of ``sub_batch_size`` and answers each as soon as
        it is done; :meth:`recv` returns the first ``batch_size`` envs to finish. Autoreset per
        env is exactly that of the chosen mode. While envs are in flight, the lockstep methods
        (``step``, ``reset``, ``call``, ...) refuse to run.

        Args:
            actions: A batch of actions, one per env in ``env_ids``, in that order.
            env_ids: The envs to step (default: all); none of them may be in flight.

        Raises:
            ValueError: If ``env_ids`` or the actions are wrong.
            AlreadyPendingCallError: If a lockstep call is pending.
        """
        self._assert_is_running()
        self._lockstep.check_no_pending("send")
        self._first_ready.send(actions, env_ids)

    def async_reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
        env_ids: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """Resets envs without waiting; :meth:`recv` returns their first observations.

        Args:
            seed: None, an int (env ``i`` gets ``seed + i``) or one per env in ``env_ids``.
            options: Passed to every env's reset.
            env_ids: The envs to reset (default: all); none of them may be in flight.
        """
        check_options(options)
        self._assert_is_running()
        self._lockstep.check_no_pending("async_reset")
        self._first_ready.reset(seed, options, env_ids)

    def recv(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Returns the first ``batch_size`` envs to finish after :meth:`send`/:meth:`async_reset`.

        Within a batch, envs are ordered by env id; with the default ``batch_size`` (all envs)
        a ``send`` and ``recv`` pair returns exactly what ``step`` would.

        Args:
            timeout: Seconds to wait; None waits as long as the hosts are alive. Envs still
                in flight after a timeout stay in flight for a later ``recv``.

        Returns:
            Observations, rewards, terminations, truncations and infos of ``batch_size`` envs;
            ``infos["env_id"]`` holds their ids. Reset results have reward 0 and no flags set.

        Raises:
            RuntimeError: If fewer than ``batch_size`` envs are in flight or waiting.
            WaitTimeoutError: If not enough envs finished in time.
        """
        self._assert_is_running()
        return self._first_ready.recv(timeout)

    # ------------------------------------------------------- calls (the others are EnvCalls')

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env.

        Returns:
            One result per sub-env.
        """
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Reads attribute ``name`` of every sub-env (calling it if callable, as Gymnasium does)."""
        return self.call(name)

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The seeds of the sub-envs' random generators."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of the sub-envs' random generators, rebuilt from their states."""
        return self.get_attr("np_random")

    # ------------------------------------------------------- results and hosts

    observations: Any = FromPart("_results")
    """The batch of observations last returned (the buffer ``copy=False`` hands out)."""

    copy: bool = FromPart("_results", settable=True)  # it may change, as AsyncVectorEnv's
    """Whether ``reset``, ``step`` and ``recv`` return copies of the observations."""

    host_restarts: int = FromPart("_recovery", settable=True)  # a trainer may count per epoch
    """How many times a failed host's envs were re-made (``on_host_failure="restart"``)."""

    envs_moved: int = FromPart("_recovery")
    """How many envs moved, with their state, off hosts that drained (``--drain-grace``)."""

    @property
    def hosts(self) -> tuple[str, ...]:
        """The endpoints of the hosts, in env order."""
        return tuple(c.block.endpoint for c in self._hosts.pool.connections)

    # ------------------------------------------------------- close

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Closes the sessions on the hosts, the sockets, and any local hosts.

        Args:
            timeout: Seconds to wait for a pending call to finish first (None: the default
                close bound).
            terminate: Skip waiting for pending calls and closing sessions politely.
        """
        if self._recovery is not None:
            self._recovery.stop()  # no recovery while closing
        if self._first_ready is not None:
            self._first_ready.drop()  # first-ready batches under way
        polite = not terminate
        if self._lockstep is not None and self._state != AsyncState.DEFAULT:
            gym.logger.warn(  # a UserWarning, as Gymnasium's AsyncVectorEnv gives
                f"Calling `close` while waiting for a pending call to `{self._state.value}` "
                "to complete."
            )
            if polite:
                try:
                    self._lockstep.settle(CLOSE_TIMEOUT_S if timeout is None else timeout)
                except Exception as exc:  # a call still under way: no more waiting
                    logger.warning("pending call ended with %r while closing", exc)
                    polite = False
        self._hosts.close(polite)

    def __del__(self) -> None:
        """Closes the env if it was not closed (local hosts are stopped)."""
        if not getattr(self, "closed", True):
            with contextlib.suppress(Exception):
                self.close(terminate=True)

    def __repr__(self) -> str:
        """Names the class, the spec (if any), the env count and the hosts."""
        env_id = self.spec.id if self.spec is not None else self._env_id
        if isinstance(env_id, tuple):  # one per env
            env_id = "|".join(dict.fromkeys(env_id))
        named = f"{env_id}, " if env_id is not None else ""
        return f"RemoteVectorEnv({named}num_envs={self.num_envs}, hosts={len(self.hosts)})"
