"""``RemoteVectorEnv``: a Gymnasium vector env whose sub-envs live on env hosts."""

from __future__ import annotations

import contextlib
import copy as copy_module
import enum
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import zmq
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_differing_spaces, batch_space, create_empty_array

from client._connection import HostConnection
from client._local import LocalHosts, default_host_count
from envserver.batching import check_batch, merge_block, slice_block
from envserver.errors import ProtocolError, WaitTimeoutError
from envserver.protocol import Command, Reply, Status
from envserver.spaces import space_from_data

__all__ = ["AsyncState", "RemoteVectorEnv"]

logger = logging.getLogger(__name__)

#: How often a long wait looks at the liveness of the hosts it waits on.
LIVENESS_CHECK_INTERVAL_S = 0.5
#: The bound on the CLOSE round trip when the env is closed.
CLOSE_TIMEOUT_S = 5.0


class AsyncState(enum.Enum):
    """What the vector env is waiting for (the values match Gymnasium's ``AsyncState``)."""

    DEFAULT = "default"
    WAITING_RESET = "reset"
    WAITING_STEP = "step"
    WAITING_CALL = "call"


class RemoteVectorEnv(VectorEnv):
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
        hosts: Endpoints of env hosts (``tcp://sim-a:5555``). None starts local hosts.
        envs_per_host: How many envs each host gets, in host order.
        num_local_hosts: How many local hosts to start when ``hosts`` is None (default: one per
            CPU core, never more than ``num_envs``).
        copy: Whether ``reset`` and ``step`` return copies of the observation batch.
        observation_mode: ``"same"``, ``"different"``, or a ``(batch, single)`` space pair, as
            in Gymnasium.
        autoreset_mode: Gymnasium's autoreset mode, applied on the hosts.
        allow_pickle: Whether hosts may send values that only travel pickled, and this client
            may unpickle them. Default: True for local hosts, False for remote ones.
        connect_timeout_s: How long to wait for hosts to answer while connecting.
        context: A ZeroMQ context to use (a private one by default).
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
        allow_pickle: bool | None = None,
        connect_timeout_s: float = 60.0,
        context: zmq.Context | None = None,
    ) -> None:
        self._connections: list[HostConnection] = []
        self._local: LocalHosts | None = None
        self._state = AsyncState.DEFAULT
        self._context = context or zmq.Context()
        self._own_context = context is None
        try:
            self._setup(
                env_fns,
                env_id,
                env_kwargs,
                num_envs,
                hosts,
                envs_per_host,
                num_local_hosts,
                copy,
                observation_mode,
                autoreset_mode,
                allow_pickle,
                connect_timeout_s,
            )
        except BaseException:
            # Close the sessions already opened, so remote hosts free their envs.
            self.close_extras(terminate=False)
            self.closed = True
            raise

    # ------------------------------------------------------------- set-up

    def _setup(
        self,
        env_fns: Sequence[Callable[[], gym.Env]] | None,
        env_id: str | None,
        env_kwargs: dict[str, Any] | None,
        num_envs: int | None,
        hosts: Sequence[str] | str | None,
        envs_per_host: Sequence[int] | None,
        num_local_hosts: int | None,
        copy: bool,
        observation_mode: str | tuple[gym.Space, gym.Space],
        autoreset_mode: str | AutoresetMode,
        allow_pickle: bool | None,
        connect_timeout_s: float,
    ) -> None:
        if (env_fns is None) == (env_id is None):
            raise ValueError("give exactly one of env_fns and env_id")
        if env_fns is not None:
            env_fns = list(env_fns)
            if num_envs is not None and num_envs != len(env_fns):
                raise ValueError(f"num_envs={num_envs} but {len(env_fns)} env_fns were given")
            num_envs = len(env_fns)
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        self.num_envs = num_envs
        self.copy = copy
        self.observation_mode = observation_mode
        self.autoreset_mode = (
            autoreset_mode
            if isinstance(autoreset_mode, AutoresetMode)
            else AutoresetMode(autoreset_mode)
        )

        if isinstance(hosts, str):
            hosts = [hosts]
        if hosts is None:
            count = num_local_hosts or default_host_count(num_envs)
            if envs_per_host is not None:
                count = len(envs_per_host)
            self._local = LocalHosts(count)
            hosts = self._local.endpoints
            allow_pickle = True if allow_pickle is None else allow_pickle
        hosts = list(hosts)
        if not hosts:
            raise ValueError("hosts must name at least one endpoint")
        counts = _split(num_envs, len(hosts), envs_per_host)
        start = 0
        for index, (endpoint, count) in enumerate(zip(hosts, counts)):
            liveness = None
            if self._local is not None:
                liveness = _bind_liveness(self._local, index)
            self._connections.append(
                HostConnection(
                    self._context,
                    endpoint,
                    start=start,
                    count=count,
                    allow_pickle=bool(allow_pickle),
                    liveness=liveness,
                )
            )
            start += count
        self._poller = zmq.Poller()
        for connection in self._connections:
            self._poller.register(connection.socket, zmq.POLLIN)

        hello = {"client": f"RemoteVectorEnv pid {os.getpid()}", "pickle": bool(allow_pickle)}
        for connection, reply in self._round_trip(
            Command.HELLO, lambda c: hello, connect_timeout_s
        ):
            connection.session = reply["session"]
            connection.info = reply

        def make_body(connection: HostConnection) -> dict[str, Any]:
            body: dict[str, Any] = {"autoreset_mode": self.autoreset_mode.value}
            if env_fns is not None:
                body["factories"] = env_fns[connection.start : connection.stop]
            else:
                body.update(env_id=env_id, kwargs=env_kwargs or {}, num_envs=connection.count)
            return body

        made = self._round_trip(Command.MAKE, make_body, connect_timeout_s)
        self._init_spaces(made)
        self._observations = create_empty_array(
            self.single_observation_space, n=self.num_envs, fn=np.zeros
        )
        self._rewards = np.zeros(self.num_envs, dtype=np.float64)
        self._terminations = np.zeros(self.num_envs, dtype=np.bool_)
        self._truncations = np.zeros(self.num_envs, dtype=np.bool_)
        self._autoreset_envs = np.zeros(self.num_envs, dtype=np.bool_)
        self._pending: dict[HostConnection, int] = {}
        self._call_name = ""

    def _init_spaces(self, made: list[tuple[HostConnection, Any]]) -> None:
        """Reads every env's spaces from the MAKE replies and checks them, as SyncVectorEnv."""
        observation_spaces: list[gym.Space] = []
        action_spaces: list[gym.Space] = []
        where: list[str] = []
        for connection, reply in made:
            observation_spaces += [_space(s) for s in reply["observation_spaces"]]
            action_spaces += [_space(s) for s in reply["action_spaces"]]
            where += [
                f"host {connection.endpoint}, env {i}"
                for i in range(connection.start, connection.stop)
            ]
            if len(observation_spaces) != connection.stop or len(action_spaces) != connection.stop:
                raise ProtocolError(f"host {connection.endpoint} reported spaces for wrong count")
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
            if mode == "same" and observation_space != self.single_observation_space:
                raise RuntimeError(
                    f"{label} has observation space {observation_space}, but "
                    f"observation_mode='same' needs every env to have "
                    f"{self.single_observation_space} (that of host "
                    f"{first_connection.endpoint}, env 0). If this is intentional, use "
                    "observation_mode='different'."
                )
            if mode != "same" and not is_space_dtype_shape_equiv(
                observation_space, self.single_observation_space
            ):
                raise RuntimeError(
                    f"{label} has observation space {observation_space}, which does not share "
                    f"shape and dtype with {self.single_observation_space}"
                )
            if action_space != self.single_action_space:
                raise RuntimeError(
                    f"{label} has action space {action_space}, but every env must have "
                    f"{self.single_action_space} (that of host {first_connection.endpoint}, "
                    "env 0) to batch actions"
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
        views = command in (Command.STEP, Command.RESET)  # their arrays are copied on merge
        self._pending = {}
        for connection in connections if connections is not None else self._connections:
            self._pending[connection] = connection.send(command, body(connection), views=views)

    def _wait(self, timeout_s: float | None, what: str) -> list[tuple[HostConnection, Any]]:
        """Waits for the reply of every pending request, in host order.

        Raises:
            WaitTimeoutError: If not every reply came within ``timeout_s``.
            HostUnavailableError: If a host that owes a reply is known to be dead.
            Exception: The first error a host reported (by env index), rebuilt.
        """
        pending, self._pending = self._pending, {}
        replies: dict[HostConnection, Reply] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        waiting = [c for c in pending if c.pending is not None]
        while waiting:
            wait_s = LIVENESS_CHECK_INTERVAL_S
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeoutError(
                        f"The call to `{what}_wait` has timed out after {timeout_s} second(s)."
                    )
                wait_s = min(wait_s, remaining)
            ready = dict(self._poller.poll(wait_s * 1000))
            for connection in waiting:
                if connection.socket in ready:
                    reply = connection.receive()
                    if reply is not None:
                        replies[connection] = reply
                elif connection.liveness is not None:
                    connection.liveness()
            waiting = [c for c in waiting if c not in replies]
        results = []
        for connection in pending:
            reply = replies[connection]
            if reply.status == Status.ERROR:
                raise connection.error(reply)
            results.append((connection, reply.body))
        return results

    # ------------------------------------------------------- state machine

    def _assert_is_running(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`."
            )

    def _assert_idle(self, method: str, dot: str = ".") -> None:
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
        """
        self._assert_is_running()
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = [None if s is None else int(s) for s in seed]
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

        def body(connection: HostConnection) -> dict[str, Any]:
            block = slice(connection.start, connection.stop)
            return {
                "seeds": seeds[block],
                "options": options,
                "mask": None if mask is None else mask[block].tolist(),
            }

        targets = [c for c in self._connections if mask is None or mask[c.start : c.stop].any()]
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
        results = self._finish(timeout, "reset")
        infos: dict[str, Any] = {}
        for connection, body in results:
            self._merge_observations(connection, body["obs"])
            infos = self._merge_infos(infos, connection, body["infos"])
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
        if self.autoreset_mode == AutoresetMode.DISABLED and self._autoreset_envs.any():
            finished = np.flatnonzero(self._autoreset_envs).tolist()
            raise AssertionError(
                f"envs {finished} ended their episodes and autoreset_mode is DISABLED: reset "
                "them (options={'reset_mask': mask}) before stepping them again"
            )
        space = self.single_action_space
        self._send(
            Command.STEP,
            lambda c: {"actions": slice_block(space, actions, c.start, c.stop)},
        )
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
        results = self._finish(timeout, "step")
        infos: dict[str, Any] = {}
        for connection, body in results:
            block = slice(connection.start, connection.stop)
            try:
                self._rewards[block] = body["rewards"]
                self._terminations[block] = body["terminations"]
                self._truncations[block] = body["truncations"]
            except (KeyError, TypeError, ValueError) as exc:
                raise ProtocolError(
                    f"host {connection.endpoint} sent a malformed step reply: {exc!r}"
                ) from exc
            self._merge_observations(connection, body["obs"])
            infos = self._merge_infos(infos, connection, body["infos"])
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (
            self._observation_batch(),
            np.copy(self._rewards),
            np.copy(self._terminations),
            np.copy(self._truncations),
            infos,
        )

    def _merge_observations(self, connection: HostConnection, block: Any) -> None:
        try:
            self._observations = merge_block(
                self.single_observation_space,
                self._observations,
                block,
                connection.start,
                connection.stop,
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise ProtocolError(f"host {connection.endpoint}: {exc}") from exc

    def _merge_infos(
        self, infos: dict[str, Any], connection: HostConnection, entries: Any
    ) -> dict[str, Any]:
        """Adds a host's per-env infos in env order, exactly as SyncVectorEnv's ``_add_info``."""
        for index, info in entries:
            if not isinstance(index, int) or not 0 <= index < connection.count:
                raise ProtocolError(f"host {connection.endpoint} sent info for env {index!r}")
            infos = self._add_info(infos, _writable(info), connection.start + index)
        return infos

    def _observation_batch(self) -> Any:
        return copy_module.deepcopy(self._observations) if self.copy else self._observations

    # ------------------------------------------------------- call, attributes, render

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
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
        return tuple(_concat(self._finish(timeout, "call")))

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

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Sets attribute ``name`` on every sub-env.

        Args:
            name: The attribute.
            values: One value per sub-env (a list or tuple), or one value for all.

        Raises:
            ValueError: If a list or tuple of values does not have one value per sub-env.
        """
        self._assert_is_running()
        if not isinstance(values, (list, tuple)):
            values = [values for _ in range(self.num_envs)]
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of "
                f"environments. Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._assert_idle("set_attr")
        values = list(values)
        self._round_trip(
            Command.SET_ATTR,
            lambda c: {"name": name, "values": values[c.start : c.stop]},
            None,
        )

    def render(self) -> tuple[Any, ...]:
        """Returns the rendered frames of the sub-envs."""
        self._assert_is_running()
        self._assert_idle("render")
        return tuple(_concat(self._round_trip(Command.RENDER, lambda c: {}, None)))

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
        return tuple(c.endpoint for c in self._connections)

    @property
    def envs_per_host(self) -> tuple[int, ...]:
        """How many envs each host holds, in host order."""
        return tuple(c.count for c in self._connections)

    # ------------------------------------------------------- close

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Closes the sessions on the hosts, the sockets, and any local hosts.

        Args:
            timeout: Seconds to wait for a pending call to finish first (None: the default
                close bound).
            terminate: Skip waiting for pending calls and closing sessions politely.
        """
        connections = getattr(self, "_connections", [])
        if not terminate and connections and getattr(self, "_state", None) is not None:
            if self._state != AsyncState.DEFAULT:
                logger.warning(
                    "Calling `close` while waiting for a pending call to `%s` to complete.",
                    self._state.value,
                )
                try:
                    self._finish(CLOSE_TIMEOUT_S if timeout is None else timeout, "close")
                except Exception as exc:
                    logger.warning("pending call ended with %r while closing", exc)
            live = [c for c in connections if c.session is not None]
            try:
                self._round_trip(Command.CLOSE, lambda c: None, CLOSE_TIMEOUT_S, live)
            except Exception as exc:
                logger.warning("closing the sessions ended with %r", exc)
        for connection in connections:
            connection.close()
        self._connections = []
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


def _writable(value: Any) -> Any:
    """Copies the read-only (zero-copy) arrays in an info, so users get ordinary arrays."""
    if isinstance(value, np.ndarray):
        return value if value.flags.writeable else value.copy()
    if isinstance(value, dict):
        return {key: _writable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_writable(item) for item in value)
    return value


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


def _bind_liveness(local: LocalHosts, index: int) -> Callable[[], None]:
    return lambda: local.liveness(index)


def _space(value: Any) -> gym.Space:
    return value if isinstance(value, gym.Space) else space_from_data(value)


def _concat(results: list[tuple[HostConnection, Any]]) -> Iterator[Any]:
    for connection, values in results:
        if not isinstance(values, list) or len(values) != connection.count:
            raise ProtocolError(f"host {connection.endpoint} sent a wrong number of results")
        yield from values
