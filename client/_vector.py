"""``RemoteVectorEnv``: a Gymnasium vector env whose sub-envs live on env hosts."""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import zmq
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import batch_differing_spaces, batch_space

from client._batches import FirstReadyMixin
from client._connection import HostConnection
from client._discovery import Discovery, Prober, Resolver
from client._lease import Heartbeat, close_at_exit
from client._local import LocalHosts, default_host_count
from client._options import VectorOptions
from client._pool import HostPool
from client._recovery import RecoveryMixin
from client._replay import EnvMemory
from client._results import (
    Flight,
    InfoBatch,
    Ready,
    Request,
    check_options,
    copied,
    merged,
    seeds_for,
    space_of,
    writable,
)
from envserver.batching import Index, check_batch, empty_batch, select
from envserver.errors import (
    ProtocolError,
)
from envserver.protocol import Command, Reply, Status
from envserver.security import load_curve_keys

__all__ = ["RemoteVectorEnv"]

logger = logging.getLogger(__name__)

#: The bound on the CLOSE round trip when the env is closed.
CLOSE_TIMEOUT_S = 5.0


class RemoteVectorEnv(FirstReadyMixin, RecoveryMixin, VectorEnv):
    """A vector env whose sub-envs run on env hosts, local or remote, over ZeroMQ.

    It behaves as ``gymnasium.vector.AsyncVectorEnv`` does (same results as ``SyncVectorEnv``
    for the same seeds and actions, same async state machine and error types); the sub-envs live
    in env-host processes (``envserver serve``) on any machines the trainer can reach.

    Envs are spread over the hosts in contiguous blocks: host 0 holds envs ``0..k0-1``, host 1 the
    next ``k1``, and so on. By default the counts are as even as possible, earlier hosts taking
    one more where the division is not exact (16 envs on 3 hosts: 6, 5, 5); ``envs_per_host``
    sets them explicitly.

    Example:
        >>> envs = RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * 4)  # local hosts
        >>> obs, infos = envs.reset(seed=42)
        >>> envs.close()

    Args:
        env_fns: One factory per env, shipped with cloudpickle (hosts must allow pickle; the
            embedded local hosts do). Leave out when ``env_id`` is given.
        env_id: A registered env id (``module:EnvId`` included), made on the hosts with
            ``gymnasium.make(env_id, **env_kwargs)``: the pickle-free path.
        env_kwargs: Keyword arguments for ``gymnasium.make``.
        num_envs: The number of envs (with ``env_id``).
        hosts: Env hosts: endpoints (``tcp://sim-a:5555``), and ``dns://NAME:PORT`` specs that
            stand for every address of NAME (Compose or Kubernetes replicas behind one name;
            only addresses that answer are used). None starts local hosts.
        envs_per_host: How many envs each host gets, in host order.
        num_local_hosts: How many local hosts to start when ``hosts`` is None (default: one per
            CPU core, never more than ``num_envs``).
        copy: Whether ``reset`` and ``step`` return copies of the observation batch.
        observation_mode: ``"same"``, ``"different"``, or a ``(batch, single)`` space pair, as
            in Gymnasium.
        autoreset_mode: Gymnasium's autoreset mode, applied on the hosts.
        info_format: ``"dict"``: infos batched as Gymnasium does (a dict of arrays with
            ``_key`` masks); ``"list"``: one dict per env, holding what the env returned (its
            step's and, when autoreset in SAME_STEP mode, its reset's infos, merged).
        batch_size: How many envs :meth:`recv` returns: the first to finish (default: all).
        sub_batch_size: How many envs a host steps per request in :meth:`send`, so that it can
            answer part of its envs early (default: ``batch_size`` divided by the host count).
        env_threads: For envs that wait (I/O, sleep, C code that releases the GIL): each host
            steps up to this many of its envs at once, on threads (capped by the host's
            ``--max-env-threads``). Default 1: one after another, best for envs that compute
            in Python (CartPole). ``env_threads=num_envs`` steps every env at once.
        allow_pickle: Whether hosts may send values that only travel pickled, and this client
            may unpickle them. Default: True for local hosts, False for remote ones.
        min_hosts: Wait (within ``connect_timeout_s``) until this many distinct hosts answer,
            counting every address of the ``dns://`` specs; default: one per ``dns://`` spec.
        resolver: Resolves a ``dns://`` name and port to IP addresses (default: the system's
            resolver, A and AAAA records); a hook for other service discovery.
        connect_timeout_s: How long a host may take to accept the first connection.
        host_timeout_s: How long a connected host may go without answering heartbeats (dead,
            frozen or unreachable) before waits on it fail with ``HostUnavailableError``; the
            bound holds even for ``*_wait(timeout=None)``.
        request_timeout_s: How long a live host may take to answer one request (a hung env
            step); None for no bound. Exceeding it raises ``RequestTimeoutError``.
        curve_server_key: The hosts' CURVE public key file, for hosts started with
            ``--curve-secret-key``; traffic is then encrypted and authenticated.
        curve_client_key: This client's CURVE secret key file; its public key must be in the
            hosts' ``--authorized-keys`` directory.
        on_host_failure: ``"raise"`` (``HostUnavailableError``) or ``"restart"``: reconnect
            (resuming the session if the host still has it), else re-make the lost envs on the
            same endpoint (a respawned process for local hosts) or a spare, and go on. The
            interrupted step reports those envs as truncated, with ``infos["host_failure"]``.
        spare_hosts: Endpoints to re-make lost envs on when their own host does not come back
            (remote hosts only: a local host is respawned in place). A host found through a
            ``dns://`` spec is replaced by resolving the name again first.
        restart_timeout_s: How long recovering one failed host may take before giving up.
        context: A ZeroMQ context to use (a private one by default). A string (an
            ``AsyncVectorEnv`` start method) is ignored with a warning.
        shared_memory: ``AsyncVectorEnv``'s; ignored with a warning (there is no shared memory).
        daemon: ``AsyncVectorEnv``'s; without effect: local hosts stop when the trainer dies
            (as daemonic workers do) and may start processes of their own (as others may).
        worker: ``AsyncVectorEnv``'s; refused (``TypeError``): hosts have no worker to replace.
        max_concurrency: ``AsyncVectorEnv``'s; refused (``TypeError``): concurrency is the
            number of hosts.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]] | None = None,
        *,
        env_id: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        num_envs: int | None = None,
        hosts: Sequence[str] | str | None = None,
        envs_per_host: Sequence[int] | None = None,
        num_local_hosts: int | None = None,
        copy: bool = True,
        observation_mode: str | tuple[gym.Space, gym.Space] = "same",
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        info_format: str = "dict",
        batch_size: int | None = None,
        sub_batch_size: int | None = None,
        env_threads: int = 1,
        allow_pickle: bool | None = None,
        min_hosts: int | None = None,
        resolver: Resolver | None = None,
        connect_timeout_s: float = 60.0,
        host_timeout_s: float = 5.0,
        request_timeout_s: float | None = None,
        curve_server_key: str | os.PathLike | None = None,
        curve_client_key: str | os.PathLike | None = None,
        on_host_failure: str = "raise",
        spare_hosts: Sequence[str] = (),
        restart_timeout_s: float = 60.0,
        context: zmq.Context | None = None,
        shared_memory: bool | None = None,
        daemon: bool = True,
        worker: Callable[..., None] | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        context = _checked_async_arguments(context, shared_memory, worker, max_concurrency)
        if env_fns is not None:
            env_fns = list(env_fns)  # a generator is read once
        #: The env factories (None when the envs are made from ``env_id``).
        self.env_fns = env_fns
        self._pool: HostPool | None = None
        self._local: LocalHosts | None = None
        self._state = AsyncState.DEFAULT
        self._in_flight = np.zeros(0, dtype=np.bool_)
        self._ready: deque[Ready] = deque()
        self._flights: dict[tuple[HostConnection, int], Flight] = {}
        #: The options, checked (the keyword arguments of the same names).
        self.options = options = VectorOptions(
            copy=copy,
            observation_mode=observation_mode,
            autoreset_mode=autoreset_mode,
            info_format=info_format,
            batch_size=batch_size,
            sub_batch_size=sub_batch_size,
            env_threads=env_threads,
            envs_per_host=envs_per_host,
            num_local_hosts=num_local_hosts,
            allow_pickle=allow_pickle,
            min_hosts=min_hosts,
            connect_timeout_s=connect_timeout_s,
            host_timeout_s=host_timeout_s,
            request_timeout_s=request_timeout_s,
            on_host_failure=on_host_failure,
            spare_hosts=spare_hosts,
            restart_timeout_s=restart_timeout_s,
        )
        self.copy, self.observation_mode = options.copy, options.observation_mode
        self.autoreset_mode, self.info_format = options.autoreset_mode, options.info_format
        self.on_host_failure, self.env_threads = options.on_host_failure, options.env_threads
        self.spare_hosts, self.restart_timeout_s = options.spare_hosts, options.restart_timeout_s
        #: How many times a failed host's envs were re-made (with ``on_host_failure="restart"``).
        self.host_restarts = 0
        self._remade = False  # whether a host was ever re-made (so envs may be lost)
        self._ids = itertools.count(1)
        self._closing = False
        self._context = context or zmq.Context()
        self._own_context = context is None
        self._heartbeat = Heartbeat()  # renews the hosts' session leases
        self._discovery: Discovery | None = None
        try:
            curve = load_curve_keys(curve_server_key, curve_client_key)
            num_envs = _count_envs(env_fns, env_id, num_envs)
            if hosts is not None:
                hosts = self._discover(hosts, resolver, curve, num_envs)
            elif min_hosts is not None:
                raise ValueError("min_hosts needs hosts (local hosts are started as asked)")
            self._setup(env_fns, env_id, env_kwargs, num_envs, hosts, curve)
        except BaseException:
            # Close the sessions already opened, so remote hosts free their envs.
            self.close_extras(terminate=False)
            self.closed = True
            raise
        close_at_exit(self)  # a script that ends without close() still frees the hosts' envs

    # ------------------------------------------------------------- set-up

    def _discover(
        self,
        hosts: Sequence[str] | str,
        resolver: Resolver | None,
        curve: tuple[bytes, bytes, bytes] | None,
        num_envs: int,
    ) -> list[str]:
        """Resolves the ``dns://`` specs of ``hosts`` and waits for ``min_hosts`` to answer."""
        self._discovery = Discovery([hosts] if isinstance(hosts, str) else list(hosts), resolver)
        if self._discovery.dynamic and self.options.envs_per_host is not None:
            raise ValueError(
                "envs_per_host needs a host list without dns:// specs (their host count is "
                "only known once they are resolved)"
            )
        return self._discovery.endpoints(
            min_hosts=self.options.min_hosts,
            max_hosts=num_envs,
            timeout_s=self.options.connect_timeout_s,
            probe=lambda: Prober(self._context, curve),
        )

    def _setup(
        self,
        env_fns: list[Callable[[], gym.Env]] | None,
        env_id: str | None,
        env_kwargs: dict[str, Any] | None,
        num_envs: int,
        hosts: Sequence[str] | str | None,
        curve: tuple[bytes, bytes, bytes] | None,
    ) -> None:
        options = self.options
        self.num_envs = num_envs
        self.batch_size = num_envs if options.batch_size is None else int(options.batch_size)
        if not 1 <= self.batch_size <= num_envs:
            raise ValueError(f"batch_size must be between 1 and num_envs={num_envs}")

        allow_pickle = options.allow_pickle
        if isinstance(hosts, str):
            hosts = [hosts]
        if hosts is None:
            count = options.num_local_hosts or default_host_count(num_envs)
            if options.envs_per_host is not None:
                count = len(options.envs_per_host)
            self._local = LocalHosts(count)
            hosts = self._local.endpoints
            allow_pickle = True if allow_pickle is None else allow_pickle
        hosts = list(hosts)
        if not hosts:
            raise ValueError("hosts must name at least one endpoint")
        counts = _split(num_envs, len(hosts), options.envs_per_host)
        self._connection_options = {
            "allow_pickle": bool(allow_pickle),
            "host_timeout_s": options.host_timeout_s,
            "connect_timeout_s": options.connect_timeout_s,
            "request_timeout_s": options.request_timeout_s,
            "curve": curve,
            "ids": self._ids,
            "heartbeat": self._heartbeat,
        }
        local = self._local
        self._pool = HostPool(
            self._context,
            self._connection_options,
            lambda index: None if local is None else _bind_liveness(local, index),
        )
        start = 0
        for index, (endpoint, count) in enumerate(zip(hosts, counts)):
            self._pool.connect(index, endpoint, start, count)
            start += count
        sub_batch_size = options.sub_batch_size
        if sub_batch_size is None:
            sub_batch_size = max(1, self.batch_size // len(self._pool.connections))
        if sub_batch_size < 1:
            raise ValueError("sub_batch_size must be positive")
        self.sub_batch_size = int(sub_batch_size)

        self._hello = {"client": f"RemoteVectorEnv pid {os.getpid()}", "pickle": bool(allow_pickle)}
        self._env_id, self._env_kwargs = env_id, env_kwargs or {}
        # No overall timeout: each connection bounds its own wait (connect_timeout_s for a host
        # never reached, host_timeout_s once connected, request_timeout_s if set).
        for connection, reply in self._round_trip(Command.HELLO, lambda c: self._hello, None):
            connection.session = reply["session"]
            connection.info = reply
        made = self._round_trip(Command.MAKE, self._make_body, None)
        self._init_spaces(made)
        self._observations = empty_batch(self.single_observation_space, self.num_envs)
        self._rewards = np.zeros(self.num_envs, dtype=np.float64)
        self._terminations = np.zeros(self.num_envs, dtype=np.bool_)
        self._truncations = np.zeros(self.num_envs, dtype=np.bool_)
        self._autoreset_envs = np.zeros(self.num_envs, dtype=np.bool_)
        self._pending: dict[HostConnection, Request] = {}
        self._reset_ids: dict[int, list[int] | None] = {}  # by the host's first env index
        self._step_ids: dict[int, list[int]] = {}  # hosts stepping part of their block
        # First-ready batches: envs sent and not yet received, requests under way, results
        # received from hosts and not yet handed out by recv().
        self._in_flight = np.zeros(self.num_envs, dtype=np.bool_)
        # Envs whose host was re-made after a failure: each reports the loss once, at its next
        # step (truncated) or reset; in SAME_STEP mode with the fresh (obs, info) kept here.
        self._lost = np.zeros(self.num_envs, dtype=np.bool_)
        self._fresh: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._memory = EnvMemory(self.num_envs)  # replayed on envs re-made after a failure
        self._infos = InfoBatch(self.num_envs, self.info_format)
        self._batch = InfoBatch(self.batch_size, self.info_format)
        self._batch_observations = empty_batch(self.single_observation_space, self.batch_size)

    def _init_spaces(self, made: list[tuple[HostConnection, Any]]) -> None:
        """Reads every env's spaces from the MAKE replies and checks them, as SyncVectorEnv."""
        observation_spaces: list[gym.Space] = []
        action_spaces: list[gym.Space] = []
        where: list[str] = []
        for connection, reply in made:
            observation_spaces += [space_of(s) for s in reply["observation_spaces"]]
            action_spaces += [space_of(s) for s in reply["action_spaces"]]
            where += [
                f"host {connection.endpoint}, env {i}"
                for i in range(connection.start, connection.stop)
            ]
            if len(observation_spaces) != connection.stop or len(action_spaces) != connection.stop:
                raise ProtocolError(f"host {connection.endpoint} reported spaces for wrong count")
        self._env_spaces = list(zip(observation_spaces, action_spaces))
        first_connection, first = made[0]
        self.metadata = dict(first["metadata"])
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = first["render_mode"]
        self.single_action_space = action_spaces[0]
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        mode = self.observation_mode
        if isinstance(mode, tuple) and len(mode) == 2:
            if not all(isinstance(s, gym.Space) for s in mode):
                raise TypeError(
                    f"Expected both elements of observation_mode to be Spaces, got "
                    f"{type(mode[0])} and {type(mode[1])}"
                )
            self.observation_space, self.single_observation_space = mode
        elif mode == "same":
            self.single_observation_space = observation_spaces[0]
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        elif mode == "different":
            self.single_observation_space = observation_spaces[0]
            self.observation_space = batch_differing_spaces(observation_spaces)
        else:
            raise ValueError(
                "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single "
                f"and batch observation space, actual got {mode}"
            )
        for label, observation_space, action_space in zip(where, observation_spaces, action_spaces):
            # Gymnasium's wording (users search for it), then which env differs from which.
            if mode == "same" and observation_space != self.single_observation_space:
                raise RuntimeError(
                    "RemoteVectorEnv(..., observation_mode='same') however some of the "
                    "sub-environments observation spaces are not equivalent. "
                    f"single_observation_space={self.single_observation_space} (host "
                    f"{first_connection.endpoint}, env 0), sub-environment observation_space="
                    f"{observation_space} ({label}). If this is intentional, use "
                    "`observation_mode='different'` instead."
                )
            if mode != "same" and not is_space_dtype_shape_equiv(
                observation_space, self.single_observation_space
            ):
                raise RuntimeError(
                    "RemoteVectorEnv(..., observation_mode='different' or custom space) however "
                    "the sub-environment's observation spaces do not share a common shape and "
                    f"dtype. {label} has {observation_space}, host {first_connection.endpoint} "
                    f"env 0 has {self.single_observation_space}."
                )
            if action_space != self.single_action_space:
                raise RuntimeError(
                    "Some environments have an action space different from "
                    f"`{self.single_action_space}`. In order to batch actions, the action spaces "
                    f"from all environments must be equal. {label} has {action_space} (host "
                    f"{first_connection.endpoint}, env 0 has {self.single_action_space})."
                )

    # ------------------------------------------------------- requests

    def _round_trip(
        self,
        command: Command,
        body: Callable[[HostConnection], Any],
        timeout_s: float | None,
        connections: Sequence[HostConnection] | None = None,
    ) -> list[tuple[HostConnection, Any]]:
        """Sends one request to each host, waits for all replies, raises the first error."""
        self._send(command, body, connections)
        return self._wait(timeout_s, command.name.lower())

    def _send(
        self,
        command: Command,
        body: Callable[[HostConnection], Any],
        connections: Sequence[HostConnection] | None = None,
    ) -> None:
        """Sends one request to each host (all, or ``connections``), as the pending call."""
        self._pending = {}
        self._pending = self._pool.send(command, body, connections)

    def _wait(self, timeout_s: float | None, what: str) -> list[tuple[HostConnection, Any]]:
        """Waits for the reply of every pending request, in host order.

        A wait that fails abandons the requests: their replies are dropped if they come. With
        ``on_host_failure="restart"``, a host that fails during a step or a reset is recovered
        and the request answered by the recovered host.

        Raises:
            WaitTimeoutError: If not every reply came within ``timeout_s``.
            HostUnavailableError: If a host that owes a reply failed (and was not recovered).
            Exception: The first error a host reported (in host order), rebuilt.
        """
        pending, self._pending = self._pending, {}
        replies: dict[HostConnection, Reply] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def recover(connection: HostConnection) -> None:
            nonlocal pending
            new, replies[new] = self._recover(connection, pending[connection])
            pending = {(new if c is connection else c): r for c, r in pending.items()}

        try:
            while len(replies) < len(pending):
                # All of them, answered or not: one set of sockets for the whole wait.
                polled, failure = self._pool.poll(pending, deadline, what, timeout_s)
                for connection, reply in polled:
                    if reply.request_id != pending[connection].request_id:
                        continue
                    lost = connection.lost(reply)
                    if lost is not None and self._recoverable(pending[connection].command):
                        connection.failed = lost
                        recover(connection)
                    else:
                        replies[connection] = reply
                if failure is not None:
                    failed = [c for c in pending if c.failed is not None and c not in replies]
                    if not failed or not self._recoverable(pending[failed[0]].command):
                        raise failure
                    for connection in failed:
                        recover(connection)
        finally:
            for connection in pending:
                connection.abandon()
        results = []
        for connection in pending:
            reply = replies[connection]
            if reply.status == Status.ERROR:
                raise connection.error(reply)
            results.append((connection, reply.body))
        return results

    # ------------------------------------------------------- connections and recovery

    def _make_body(self, connection: HostConnection) -> dict[str, Any]:
        body: dict[str, Any] = {"autoreset_mode": self.autoreset_mode.value}
        if self.env_threads > 1:
            body["env_threads"] = self.env_threads
        if self.env_fns is not None:
            body["factories"] = self.env_fns[connection.start : connection.stop]
        else:
            body.update(env_id=self._env_id, kwargs=self._env_kwargs, num_envs=connection.count)
        return body

    # ------------------------------------------------------- state machine

    def _assert_is_running(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`."
            )

    def _assert_idle(self, method: str, dot: str = ".") -> None:
        if self._in_flight.any() or self._ready:
            raise AlreadyPendingCallError(
                f"Calling `{method}` while envs sent with `send` have not all been received; "
                "call `recv` until none is left first",
                "send",
            )
        self._assert_no_pending_call(method, dot)

    def _assert_no_pending_call(self, method: str, dot: str = ".") -> None:
        if self._state != AsyncState.DEFAULT:
            raise AlreadyPendingCallError(
                f"Calling `{method}` while waiting for a pending call to "
                f"`{self._state.value}` to complete{dot}",
                str(self._state.value),
            )

    def _assert_waiting(self, state: AsyncState) -> None:
        if self._state != state:
            raise NoAsyncCallError(
                f"Calling `{state.value}_wait` without any prior call to `{state.value}_async`.",
                state.value,
            )

    def _finish(self, timeout: float | None, what: str) -> list[tuple[HostConnection, Any]]:
        """Waits for the pending call, whatever happens returning to the idle state."""
        try:
            return self._wait(timeout, what)
        finally:
            self._state = AsyncState.DEFAULT

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

        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray):
                raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
            if mask.shape != (self.num_envs,):
                raise ValueError(
                    f"`options['reset_mask']` must have shape `({self.num_envs},)`, "
                    f"got {mask.shape}"
                )
            if mask.dtype != np.bool_:
                raise TypeError(
                    f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}"
                )
            if not np.any(mask):
                raise ValueError(
                    "`options['reset_mask']` must contain a boolean array with at least one "
                    f"True value, got reset_mask={mask}"
                )

        self._recover_failed()
        # Each host resets its whole block, or (with a mask) the envs the mask marks.
        self._reset_ids = {
            c.start: None if mask is None else np.flatnonzero(mask[c.start : c.stop]).tolist()
            for c in self._pool.connections
            if mask is None or mask[c.start : c.stop].any()
        }

        def body(connection: HostConnection) -> dict[str, Any]:
            env_ids = self._reset_ids[connection.start]
            if env_ids is None:
                return {"seeds": seeds[connection.start : connection.stop], "options": options}
            return {
                "seeds": [seeds[connection.start + i] for i in env_ids],
                "options": options,
                "env_ids": env_ids,
            }

        targets = [c for c in self._pool.connections if c.start in self._reset_ids]
        reset = range(self.num_envs) if mask is None else np.flatnonzero(mask).tolist()
        self._memory.reset(reset, [seeds[i] for i in reset], options)
        self._send(Command.RESET, body, targets)
        if mask is None:
            self._autoreset_envs[:] = False
        else:
            self._autoreset_envs[mask] = False
        self._state = AsyncState.WAITING_RESET

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
        self._assert_waiting(AsyncState.WAITING_RESET)
        results = self._finish(timeout, "reset_wait")
        infos = self._infos.start()
        for connection, body in results:
            env_ids = self._reset_ids[connection.start]
            index: Index = (
                slice(connection.start, connection.stop)
                if env_ids is None
                else [connection.start + i for i in env_ids]
            )
            self._found(connection, env_ids or range(connection.count), body)
            if env_ids is None:  # also the envs a mask left out, if the host was re-made
                self._autoreset_envs[connection.start : connection.stop] = False
            reset = Ready.of(connection, np.arange(connection.count), body)
            self._merge_observations(connection, reset.obs, index)
            infos = self._merge_infos(infos, connection, reset.entries)
        return self._observation_batch(), infos

    # ------------------------------------------------------- step

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every sub-env with its action.

        Args:
            actions: A batch of actions from :attr:`action_space`.

        Returns:
            Batched observations, rewards, terminations, truncations and infos.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Sends the actions to the hosts; collect the result with :meth:`step_wait`.

        Raises:
            ValueError: If the number or shape of the actions is wrong.
            ClosedEnvironmentError: If the env was closed.
            AlreadyPendingCallError: If another call is pending.
        """
        self._assert_is_running()
        self._assert_idle("step_async")
        check_batch(self.single_action_space, actions, self.num_envs)
        self._refuse_finished(np.arange(self.num_envs), "options={'reset_mask': mask}")
        actions = copied(actions)  # the caller may reuse its arrays at once
        space = self.single_action_space
        self._recover_failed()
        # Envs lost with a re-made host are not stepped: their step reports the loss.
        self._step_ids = (
            {
                c.start: np.flatnonzero(~self._lost[c.start : c.stop]).tolist()
                for c in self._pool.connections
                if self._lost[c.start : c.stop].any()
            }
            if self._remade and self._lost.any()  # envs are lost only by a re-make
            else {}
        )

        def body(connection: HostConnection) -> dict[str, Any]:
            env_ids = self._step_ids.get(connection.start)
            if env_ids is None:
                return {"actions": select(space, actions, slice(connection.start, connection.stop))}
            positions = [connection.start + i for i in env_ids]
            return {"actions": select(space, actions, positions), "env_ids": env_ids}

        targets = [c for c in self._pool.connections if self._step_ids.get(c.start, True)]
        self._send(Command.STEP, body, targets)
        self._state = AsyncState.WAITING_STEP

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
        self._assert_is_running()
        self._assert_waiting(AsyncState.WAITING_STEP)
        results = self._finish(timeout, "step_wait")
        infos = self._infos.start()
        for connection, body in results:
            if body is not None:  # None: the host was re-made, its envs are reported below
                env_ids = self._step_ids.get(connection.start)
                infos = self._merge_step(infos, connection, env_ids, body)
        for connection in self._pool.connections if self._remade and self._lost.any() else ():
            gone = np.flatnonzero(self._lost[connection.start : connection.stop]).tolist()
            if gone:  # envs lost earlier report it now
                infos = self._merge_step(infos, connection, gone, self._lost_step(connection, gone))
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (
            self._observation_batch(),
            np.copy(self._rewards),
            np.copy(self._terminations),
            np.copy(self._truncations),
            infos,
        )

    def _merge_step(
        self,
        infos: dict[str, Any],
        connection: HostConnection,
        env_ids: list[int] | None,
        body: Any,
    ) -> dict[str, Any]:
        """Writes one host's step results (for ``env_ids`` of its block, or all) into the batch."""
        index: Index = (
            slice(connection.start, connection.stop)
            if env_ids is None
            else [connection.start + i for i in env_ids]
        )
        count = connection.count if env_ids is None else len(env_ids)
        step = Ready.of(connection, np.arange(count), body)
        self._rewards[index] = step.rewards
        self._terminations[index] = step.terminations
        self._truncations[index] = step.truncations
        self._merge_observations(connection, step.obs, index)
        return self._merge_infos(infos, connection, step.entries)

    def _merge_observations(self, connection: HostConnection, block: Any, index: Index) -> None:
        self._observations = merged(
            connection, self.single_observation_space, self._observations, block, index
        )

    def _merge_infos(
        self,
        infos: Any,
        connection: HostConnection,
        entries: Any,
        positions: Callable[[int], int] | None = None,
        batch: InfoBatch | None = None,
    ) -> Any:
        """Adds a host's per-env infos in order, exactly as SyncVectorEnv's ``_add_info``.

        Args:
            infos: The infos built so far.
            connection: The host.
            entries: ``[[env index in the host's block, info], ...]``.
            positions: Maps an env index to its position in the batch (default: its global
                env index).
            batch: The batch the infos are built for (default: all ``num_envs`` envs).
        """
        batch = batch or self._infos
        for index, info in entries:
            if type(index) is not int or not 0 <= index < connection.count:
                raise ProtocolError(f"host {connection.endpoint} sent info for env {index!r}")
            position = connection.start + index if positions is None else positions(index)
            infos = batch.add(infos, writable(info), position)
        return infos

    def _observation_batch(self) -> Any:
        return copied(self._observations) if self.copy else self._observations

    def _refuse_finished(self, ids: np.ndarray, how: str) -> None:
        """In DISABLED mode, refuses to step envs whose episodes ended, as SyncVectorEnv does."""
        if self.autoreset_mode == AutoresetMode.DISABLED and self._autoreset_envs[ids].any():
            finished = ids[self._autoreset_envs[ids]].tolist()
            raise AssertionError(
                f"envs {finished} ended their episodes and autoreset_mode is DISABLED: reset "
                f"them ({how}) before stepping them again"
            )

    # ------------------------------------------------------- call, attributes, render

    def call_async(self, name: str, /, *args: Any, **kwargs: Any) -> None:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env, asynchronously.

        Raises:
            ClosedEnvironmentError: If the env was closed.
            AlreadyPendingCallError: If another call is pending.
        """
        self._assert_is_running()
        self._assert_idle("call_async")
        body = {"name": name, "args": list(args), "kwargs": kwargs}
        self._send(Command.CALL, lambda c: body)
        self._state = AsyncState.WAITING_CALL

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Waits for the call started by :meth:`call_async`.

        Returns:
            One result per sub-env.

        Raises:
            NoAsyncCallError: If no call is pending.
            WaitTimeoutError: If the hosts did not answer in time.
        """
        self._assert_is_running()
        self._assert_waiting(AsyncState.WAITING_CALL)
        return tuple(_concat(self._finish(timeout, "call_wait")))

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

    def call_envs(
        self, env_ids: Sequence[int], name: str, *args: Any, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on the sub-envs ``env_ids`` only.

        An env named twice is called twice (in a second round of requests).

        Returns:
            One result per entry of ``env_ids``, in that order.
        """
        body = {"name": name, "args": list(args), "kwargs": kwargs}
        ids = self._checked_ids(env_ids)
        results: list[Any] = [None] * len(ids)
        for positions in _rounds(ids):
            answers = self._on_envs(
                Command.CALL, lambda c, local: body, [ids[p] for p in positions]
            )
            for position, answer in zip(positions, answers):
                results[position] = answer
        return tuple(results)

    def wrappers(self, env_ids: Sequence[int] | None = None) -> tuple[list[list[str]], ...]:
        """The wrapper chain of each sub-env (all, or ``env_ids``), outermost first.

        Each wrapper is the list of ``module.qualname`` names of its class's MRO, so that
        ``isinstance`` can be told without the class crossing the wire.
        """
        ids = range(self.num_envs) if env_ids is None else self._checked_ids(env_ids)
        return self._on_envs(Command.WRAPPERS, lambda c, local: {}, list(dict.fromkeys(ids)))

    def set_attr(
        self,
        name: str,
        values: list[Any] | tuple[Any, ...] | Any,
        *,
        env_ids: Sequence[int] | None = None,
        outermost: bool = False,
    ) -> None:
        """Sets attribute ``name`` on every sub-env, or on ``env_ids`` only.

        Args:
            name: The attribute.
            values: One value per sub-env (a list or tuple), or one value for all.
            env_ids: The sub-envs to set it on (default: all); ``values`` then has one value
                per entry.
            outermost: Set it on each env's outermost wrapper, as SB3 does, instead of where
                Gymnasium's ``set_wrapper_attr`` puts it (the wrapper or env that has it).

        Raises:
            ValueError: If a list or tuple of values does not have one value per sub-env.
        """
        self._assert_is_running()
        ids = range(self.num_envs) if env_ids is None else self._checked_ids(env_ids)
        if not isinstance(values, (list, tuple)):
            values = [values for _ in ids]
        if len(values) != len(ids):
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of "
                f"environments. Got `{len(values)}` values for {len(ids)} environments."
            )
        by_env = dict(zip(ids, values))  # an env named twice gets its last value
        self._on_envs(
            Command.SET_ATTR,
            lambda c, local: {
                "name": name,
                "values": [by_env[c.start + i] for i in local],
                **({"outermost": True} if outermost else {}),
            },
            list(by_env),
        )
        self._memory.set_attr(name, by_env, outermost)

    def _checked_ids(self, env_ids: Sequence[int]) -> list[int]:
        """Env indices as ints; negative ones count from the end, as in Python indexing.

        Raises:
            ValueError: If one is not an integer in ``-num_envs..num_envs-1``.
        """
        try:
            ids = [operator.index(i) for i in env_ids]
        except TypeError:
            raise ValueError(f"env_ids must be integers, got {env_ids!r}") from None
        if not all(-self.num_envs <= i < self.num_envs for i in ids):
            raise ValueError(f"env_ids must be env indices below {self.num_envs}, got {env_ids!r}")
        return [i % self.num_envs for i in ids]

    def _on_envs(
        self,
        command: Command,
        body: Callable[[HostConnection, list[int]], dict[str, Any]],
        env_ids: Sequence[int],
    ) -> tuple[Any, ...]:
        """Runs a per-env command on the hosts holding ``env_ids`` (distinct), each for its own.

        Returns:
            One result per entry of ``env_ids``, in that order.

        Raises:
            ProtocolError: If a host answers for other envs than it was asked about.
        """
        self._assert_is_running()
        self._assert_idle(command.name.lower())
        if not env_ids:
            return ()
        local = {
            c: sorted(i - c.start for i in env_ids if c.start <= i < c.stop)
            for c in self._pool.connections
        }
        targets = [c for c in self._pool.connections if local[c]]
        results = self._round_trip(
            command, lambda c: {**body(c, local[c]), "env_ids": local[c]}, None, targets
        )
        found: dict[int, Any] = {}
        for connection, values in results:
            values = [None] * len(local[connection]) if values is None else values
            if not isinstance(values, list) or len(values) != len(local[connection]):
                raise connection.invalid(f"{command.name} results for other envs than asked")
            found.update(zip((connection.start + i for i in local[connection]), values))
        return tuple(found[i] for i in env_ids)

    def render(self) -> tuple[Any, ...]:
        """Returns the rendered frames of the sub-envs."""
        self._assert_is_running()
        self._assert_idle("call_async")  # Gymnasium's render is a call
        return tuple(_concat(self._round_trip(Command.RENDER, lambda c: {}, None)))

    @property
    def observations(self) -> Any:
        """The batch of observations last returned (the buffer ``copy=False`` hands out)."""
        return self._observations

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The seeds of the sub-envs' random generators."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of the sub-envs' random generators, rebuilt from their states."""
        return self.get_attr("np_random")

    @property
    def hosts(self) -> tuple[str, ...]:
        """The endpoints of the hosts, in env order."""
        return tuple(c.endpoint for c in self._pool.connections)

    @property
    def envs_per_host(self) -> tuple[int, ...]:
        """How many envs each host holds, in host order."""
        return tuple(c.count for c in self._pool.connections)

    # ------------------------------------------------------- close

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Closes the sessions on the hosts, the sockets, and any local hosts.

        Args:
            timeout: Seconds to wait for a pending call to finish first (None: the default
                close bound).
            terminate: Skip waiting for pending calls and closing sessions politely.
        """
        self._closing = True  # no recovery while closing
        connections = [] if self._pool is None else self._pool.connections
        if self._in_flight.any():  # first-ready batches under way: drop them
            for connection in connections:
                connection.abandon()
            self._flights.clear()
            self._ready.clear()
            self._in_flight[:] = False
        polite = not terminate
        if connections and self._state != AsyncState.DEFAULT:
            gym.logger.warn(  # a UserWarning, as Gymnasium's AsyncVectorEnv gives
                f"Calling `close` while waiting for a pending call to `{self._state.value}` "
                "to complete."
            )
            if polite:
                try:
                    self._finish(CLOSE_TIMEOUT_S if timeout is None else timeout, "close")
                except Exception as exc:  # a call still under way: no more waiting
                    logger.warning("pending call ended with %r while closing", exc)
                    polite = False
        live = [c for c in connections if c.session is not None and c.failed is None]
        if polite and live:
            try:
                self._round_trip(Command.CLOSE, lambda c: None, CLOSE_TIMEOUT_S, live)
            except Exception as exc:
                logger.warning("closing the sessions ended with %r", exc)
        elif live:  # without waiting: the hosts close the sessions once they read this
            for connection in live:
                self._pool.close_session_quietly(connection)
        self._heartbeat.close()
        if self._pool is not None:
            self._pool.close()
        if self._local is not None:
            self._local.close()
            self._local = None
        if self._own_context:
            self._context.term()
            self._own_context = False

    def __del__(self) -> None:
        """Closes the env if it was not closed (local hosts are stopped)."""
        if not getattr(self, "closed", True):
            with contextlib.suppress(Exception):
                self.close(terminate=True)

    def __repr__(self) -> str:
        """Names the class, the spec (if any), the env count and the hosts."""
        spec = f"{self.spec.id}, " if self.spec is not None else ""
        return f"RemoteVectorEnv({spec}num_envs={self.num_envs}, hosts={len(self.hosts)})"


def _checked_async_arguments(
    context: Any, shared_memory: bool | None, worker: Any, max_concurrency: int | None
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
    if shared_memory is not None:
        gym.logger.warn(
            "RemoteVectorEnv ignores shared_memory: observations travel over ZeroMQ (as raw "
            "buffers, without pickling), to local hosts and remote ones alike"
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


def _rounds(ids: Sequence[int]) -> list[list[int]]:
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


def _count_envs(
    env_fns: Sequence[Callable[[], gym.Env]] | None, env_id: str | None, num_envs: int | None
) -> int:
    """The number of envs asked for, checked.

    Raises:
        ValueError: If not exactly one of ``env_fns`` and ``env_id`` is given, or the count is
            not a positive integer (or disagrees with ``env_fns``).
    """
    if (env_fns is None) == (env_id is None):
        raise ValueError("give exactly one of env_fns and env_id")
    if env_fns is not None:
        count = len(list(env_fns))
        if num_envs is not None and num_envs != count:
            raise ValueError(f"num_envs={num_envs} but {count} env_fns were given")
        num_envs = count
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    return num_envs


def _split(num_envs: int, num_hosts: int, envs_per_host: Sequence[int] | None) -> list[int]:
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


def _bind_liveness(local: LocalHosts, index: int) -> Callable[[float], None]:
    return lambda grace_s: local.liveness(index, grace_s)


def _concat(results: list[tuple[HostConnection, Any]]) -> Iterator[Any]:
    for connection, values in results:
        if not isinstance(values, list) or len(values) != connection.count:
            raise ProtocolError(f"host {connection.endpoint} sent a wrong number of results")
        yield from values
