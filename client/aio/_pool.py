"""The agent-loop pool: hosts, one growing session on each, and envs placed by load.

:class:`EnvPool` connects to its hosts (or starts local ones), opens one session on each, and
makes each env asked for on the host with the fewest of its envs that has room: a host over
its limits refuses (``LimitError``) and the next is tried. A host found failed loses its envs
(each reports it once: :class:`~envserver.errors.EnvLostError`); the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import zmq

from envserver.curve.keys import load_curve_keys
from envserver.errors import EnvLostError, EnvServerError, HostUnavailableError, LimitError
from envserver.launch.environment import FORWARD_ENV_OUTPUT_VARIABLE, switch
from envserver.wire.bodies import Close, Hello
from envserver.wire.messages import Command
from envserver.wire.replies import HelloReply, MakeReply
from envserver.wire.spaces import space_from_data

from .._recipe import trainer_specs
from .._recovery.history import EnvHistory
from .._transport.hearing import Hearing
from .._transport.lease import Heartbeat
from .._transport.local import LocalHosts, usable_cores
from .._transport.pool import HostPool
from .._transport.session import HostSession
from .._transport.settings import ConnectionSettings
from ._env import AsyncEnv
from ._host import PooledHost
from ._turn import Call

__all__ = ["EnvPool"]

logger = logging.getLogger(__name__)

#: How many of a session's latest replies a host keeps for retries: a pool may have a message
#: of each kind under way per turn, several turns over.
RETRY_WINDOW = 64
#: What becomes of an env lost with its host (see :class:`EnvPool`).
ON_HOST_FAILURE = ("remake", "restore")
#: How long closing waits for the hosts to confirm the sessions are closed.
CLOSE_TIMEOUT_S = 5.0


@dataclasses.dataclass
class PoolStats:
    """What a pool holds and has done, counted since it opened (:meth:`EnvPool.stats`).

    Attributes:
        hosts: The hosts it places envs on now (not failed, not draining).
        envs: The envs it holds on them now.
        made: Envs made (by ``make``, forks, and anew after a loss, a restore or a move).
        forks: Envs made by ``fork``, in their original's state.
        refusals: MAKEs a host refused (full, or it could not make the env), each tried on
            the next host.
        skipped_full: Hosts passed over without asking, full by the limits they said.
        unplaced: Envs no host took: the ``LimitError`` (or, with no host usable,
            ``HostUnavailableError``) their callers got.
        lost: Envs lost with their host (with ``"remake"``, each raised once as
            ``EnvLostError``).
        restored: Of those, the envs brought back in their state (``"restore"``).
        moved: Envs moved in their state off a draining host.
    """

    hosts: int = 0
    envs: int = 0
    made: int = 0
    forks: int = 0
    refusals: int = 0
    skipped_full: int = 0
    unplaced: int = 0
    lost: int = 0
    restored: int = 0
    moved: int = 0


class EnvPool:
    """Envs for agent loops: each coroutine makes its own env, on hosts shared by all.

    ``async with EnvPool("MyEnv-v0", hosts=[...]) as pool: env = await pool.make()``, then
    ``await env.reset(seed=...)``, ``await env.step(action)``, ``await env.close()``. Calls that
    many coroutines make on one host within one turn of the event loop leave as one message.

    Args:
        env_id: The registered env id every env is made from (``gymnasium.make``).
        hosts: The hosts' endpoints (``tcp://...``, ``ipc://...``); None starts local hosts.
        num_local_hosts: How many local hosts to start (default: one per usable core).
        allow_pickle: Whether replies may carry pickled values (default: on local hosts only).
        curve_server_key: The hosts' public CURVE key file (``NAME.key`` from ``envserver
            keygen``), with ``curve_client_key``: this trainer's secret key file
            (``NAME.key_secret``). Neither: no CURVE.
        curve_client_key: See ``curve_server_key``.
        connect_timeout_s: How long a host may take to accept the first connection.
        host_timeout_s: How long a connected host may stay silent before it counts as failed.
        request_timeout_s: How long a call may wait for its answer (None: no bound; an env
            that waits minutes is fine). Past it, the call raises ``RequestTimeoutError`` and
            is abandoned (the env's next call waits for its answer); its host and the host's
            other envs go on.
        on_host_failure: ``"remake"``: an env lost with its host raises ``EnvLostError`` once,
            then is made anew on another host. ``"restore"``: it comes back on another host in
            its state (its last snapshot, then what it was sent since), and its coroutine
            never notices; its snapshots are taken after each reset and call, and every
            ``snapshot_every`` steps.
        snapshot_every: With ``"restore"``: the most steps between two snapshots of an env.
        forward_env_output: Whether the envs' warnings and output reach this process, as
            the vector env's do (warnings raised again here, output on stderr, each naming
            its env and host). Default: ``$ENVSERVER_FORWARD_ENV_OUTPUT`` (``0`` turns it
            off), else on.
    """

    def __init__(
        self,
        env_id: str,
        hosts: Sequence[str] | None = None,
        *,
        num_local_hosts: int | None = None,
        allow_pickle: bool | None = None,
        curve_server_key: str | os.PathLike | None = None,
        curve_client_key: str | os.PathLike | None = None,
        connect_timeout_s: float = 60.0,
        host_timeout_s: float = 5.0,
        request_timeout_s: float | None = None,
        on_host_failure: str = "remake",
        snapshot_every: int = 64,
        forward_env_output: bool | None = None,
    ) -> None:
        if hosts is not None and (isinstance(hosts, str) or not hosts):
            raise ValueError(f"hosts must be a non-empty list of endpoints, got {hosts!r}")
        if num_local_hosts is not None and (hosts is not None or num_local_hosts < 1):
            raise ValueError("num_local_hosts is a positive count of local hosts (no hosts)")
        if on_host_failure not in ON_HOST_FAILURE:
            raise ValueError(
                f"on_host_failure must be one of {ON_HOST_FAILURE}, got {on_host_failure!r}"
            )
        if type(snapshot_every) is not int or snapshot_every < 1:
            raise ValueError(f"snapshot_every must be a positive integer, got {snapshot_every!r}")
        self.env_id = env_id
        self._restore_every = snapshot_every if on_host_failure == "restore" else None
        #: How long a call may wait for its answer (None: no bound).
        self.request_timeout_s = request_timeout_s
        #: Each env's history, with ``"restore"`` (made with the first env); else None.
        self.history: EnvHistory | None = None
        #: The pool's counts (:meth:`stats` adds what it holds now).
        self.counts = PoolStats()
        self._endpoints = None if hosts is None else list(hosts)
        self._num_local = num_local_hosts
        local = hosts is None
        self._allow_pickle = local if allow_pickle is None else bool(allow_pickle)
        #: The specs this process registered, travelling to local hosts (which allow pickle).
        self.specs = trainer_specs([env_id]) if local and self._allow_pickle else ()
        self.retry_window = RETRY_WINDOW
        #: Tells this process what the envs said (None: the hosts do not send it).
        self.hearing = (
            PoolHearing(self)
            if switch(forward_env_output, FORWARD_ENV_OUTPUT_VARIABLE, default=True)
            else None
        )
        self._settings = ConnectionSettings(
            allow_pickle=self._allow_pickle,
            host_timeout_s=host_timeout_s,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=None,  # per call, not per host: see request_timeout_s
            curve=load_curve_keys(curve_server_key, curve_client_key),
            shared_memory=False,
            recovers=True,  # a lost env is made anew on another host at its next call
        )
        #: The pool's hosts, in order (a failed one stays, unused).
        self.hosts: list[PooledHost] = []
        self._spaces: tuple[gym.Space, gym.Space] | None = None
        self._names = itertools.count()
        self._context: zmq.Context | None = None
        self._pool: HostPool | None = None
        self._local: LocalHosts | None = None
        self._opened = False  # (for the error of a make on a pool not open, or closed)

    # ------------------------------------------------------------- opening and closing

    async def __aenter__(self) -> EnvPool:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Connects to the hosts (starting local ones) and opens a session on each.

        Raises:
            HostUnavailableError: If no host answered.
        """
        loop = asyncio.get_running_loop()
        self._opened = True
        endpoints = self._endpoints
        if endpoints is None:
            count = self._num_local or usable_cores()
            self._local = await asyncio.to_thread(LocalHosts, count)
            endpoints = self._local.endpoints
        self._context = zmq.Context()
        local = self._local
        self._pool = HostPool(
            self._context,
            self._settings,
            heartbeat=Heartbeat(),
            hearing=self.hearing,
            process=(lambda i: lambda grace_s: local.liveness(i, grace_s)) if local else None,
            name=(lambda i, e: f"local host {i}") if local else (lambda i, e: f"host {e}"),
        ) if local else HostPool(
            self._context, self._settings, heartbeat=Heartbeat(), hearing=self.hearing
        )  # fmt: skip
        try:
            for index, endpoint in enumerate(endpoints):
                connection = self._pool.connect(index, endpoint, 0, 0)
                self.hosts.append(PooledHost(connection, loop, self._host_failed, self.hearing))
            hello = Hello(
                f"EnvPool pid {os.getpid()}", self._allow_pickle, self.hearing is not None
            )
            answers = await asyncio.gather(
                *(host.ask(Command.HELLO, hello) for host in self.hosts), return_exceptions=True
            )
        except BaseException:
            await self.close()
            raise
        for host, answer in zip(self.hosts, answers):
            if isinstance(answer, BaseException):
                logger.warning("%s: no session (%s)", host.name, answer)
                continue
            reply = host.connection.read(HelloReply, answer)
            host.connection.hold(HostSession(reply.session, reply.info))
        if not self._usable():
            first = next(a for a in answers if isinstance(a, BaseException))
            await self.close()
            raise HostUnavailableError(f"no host of the pool answered: {first}") from first

    async def close(self) -> None:
        """Closes the sessions (their envs with them), the connections and the local hosts."""
        live = [h for h in self.hosts if h.failure is None and h.connection.requests.session]
        for host in self.hosts:
            host.shut()  # no new call: those queued or under way are refused
        if live:
            closing = asyncio.gather(
                *(h.ask(Command.CLOSE, None) for h in live), return_exceptions=True
            )
            with contextlib.suppress(Exception):  # (asyncio.timeout is Python 3.11's)
                await asyncio.wait_for(closing, CLOSE_TIMEOUT_S)
        for host in self.hosts:
            host.close()
        self.hosts.clear()
        if self._pool is not None:
            self._pool.heartbeat.close()
            self._pool = None
        if self._local is not None:
            await asyncio.to_thread(self._local.close)
            self._local = None
        if self._context is not None:
            self._context.term()
            self._context = None

    # ------------------------------------------------------------- envs

    async def make(self, **kwargs: Any) -> AsyncEnv:
        """A new env: ``gymnasium.make(env_id, **kwargs)`` on the least loaded host with room.

        The least loaded: the one holding the fewest envs of this pool.

        Raises:
            LimitError: If every host is full (or failed).
            Exception: What making the env raised on its host.
        """
        env = self.new_env(kwargs)
        await self.place(env)
        return env

    def new_env(self, kwargs: dict[str, Any]) -> AsyncEnv:
        """A new env of this pool, named, not made yet (see :meth:`place`)."""
        return AsyncEnv(self, kwargs, next(self._names))

    async def place(self, env: AsyncEnv) -> None:
        """Makes ``env`` on the least loaded host that takes it (see :meth:`make`).

        Hosts full by the limits they said are passed over without asking; a host that
        refuses (full by now, or it could not make the env) is passed over for the next.

        Raises:
            LimitError: If every usable host is full, or refused it.
            HostUnavailableError: If no host is usable (every one failed, or drains).
            ClosedEnvironmentError: If the pool is not open.
        """
        if self._pool is None or not self.hosts:
            raise gym.error.ClosedEnvironmentError(
                f"the env pool is {'closed' if self._opened else 'not open'}: make envs within "
                "`async with EnvPool(...) as pool:` (or after `await pool.open()`)"
            )
        refused: list[str] = []
        tried: set[int] = set()
        while True:
            usable = [h for h in self._usable() if id(h) not in tried]
            candidates = [h for h in usable if not h.full]
            self.counts.skipped_full += len(usable) - len(candidates)
            tried.update(id(h) for h in usable if h.full)
            if not candidates:
                break
            host = min(candidates, key=lambda h: h.load)
            tried.add(id(host))
            host.making += 1
            call = Call(env, env.kwargs, asyncio.get_running_loop().create_future())
            try:
                host.queue(Command.MAKE, call)
                index, made = await asyncio.shield(call.future)
            except (LimitError, EnvLostError, HostUnavailableError) as exc:
                refused.append(str(exc))  # it names the host
                self.counts.refusals += 1
                continue
            except asyncio.CancelledError:
                if not host.withdraw(call):  # it left: the env made there is closed again
                    call.future.add_done_callback(functools.partial(_close_made, host))
                raise
            finally:
                host.making -= 1
            env.placed(host, index, made)
            self.counts.made += 1
            return
        self.counts.unplaced += 1
        if not self._usable():
            failed = [h for h in self.hosts if h.failure is not None]
            why = f"; {failed[-1].failure}" if failed else ""
            raise HostUnavailableError(
                f"no host of the pool can take {env.name}: {len(failed)} of {len(self.hosts)} "
                f"failed, {sum(h.draining for h in self.hosts if h.failure is None)} drain{why}"
            )
        full = sum(h.full for h in self._usable())
        raise LimitError(
            f"no host took {env.name} ({len(self.hosts)} hosts: {full} full by their limits, "
            f"{len(refused)} refused"
            + (f"; {refused[-1]}" if refused else "" if full else "; every one failed")
            + ")"
        )

    def spaces(self, made: MakeReply) -> tuple[gym.Space, gym.Space]:
        """The envs' spaces: the first MAKE reply's (every env of a session has its spaces)."""
        if self._spaces is None:
            self._spaces = (
                space_from_data(made.observation_spaces[0]),
                space_from_data(made.action_spaces[0]),
            )
            if self._restore_every is not None:
                self.history = EnvHistory(self._pool, self._spaces[1], self._restore_every)
        return self._spaces

    @property
    def num_envs(self) -> int:
        """How many envs the pool holds on its hosts now."""
        return sum(len(host.envs) for host in self.hosts)

    def stats(self) -> PoolStats:
        """What the pool holds now and has done since it opened (a copy: it does not change)."""
        return dataclasses.replace(self.counts, hosts=len(self._usable()), envs=self.num_envs)

    def _usable(self) -> list[PooledHost]:
        """The hosts that hold a session and take envs (failed and draining ones do not)."""
        return [
            h
            for h in self.hosts
            if h.failure is None and h.connection.requests.session is not None and not h.draining
        ]

    async def let_go(self, host: PooledHost, index: int) -> None:
        """Closes env ``index`` of a draining host, moved off it; the last one, the session."""
        closing = Close([index]) if host.envs else None  # (None: the session, so it may stop)
        with contextlib.suppress(Exception):  # the host stops anyway
            await host.ask(Command.CLOSE, closing)
        if closing is None:  # done with that host: it stops, and is no failure
            host.shut()
            host.close()

    def _host_failed(self, host: PooledHost, error: EnvServerError) -> None:
        """Each env the failed ``host`` held raises its loss at its next call."""
        for env in list(host.envs.values()):
            env.host_failed(host)
        if self._pool is not None:
            host.connection.let_go()  # its lease is no longer renewed


class PoolHearing(Hearing):
    """What the envs of a pool said, told with the pool's names for them (``env N``).

    A host's reply names its envs by their index in its session; each is told as the pool
    names it (one said while it was being made: by its host only).
    """

    def __init__(self, pool: EnvPool) -> None:
        super().__init__()
        self._pool = pool

    def heard(self, host: str, start: int, said: dict[str, Any]) -> None:
        """Takes what ``host``'s reply said, its envs renamed as the pool names them."""
        held = next((h.envs for h in self._pool.hosts if h.name == host), {})

        def renamed(entry: dict[str, Any]) -> dict[str, Any]:
            envs = [held[i].number for i in entry["envs"] if i in held]
            return {**entry, "envs": envs}

        said = {
            **said,
            "warnings": [renamed(entry) for entry in said["warnings"]],
            "output": [renamed(entry) for entry in said["output"]],
        }
        super().heard(host, 0, said)


def _close_made(host: PooledHost, made: asyncio.Future) -> None:
    """Closes an env made for a ``make`` cancelled while its MAKE was under way."""
    if made.cancelled() or made.exception() is not None:
        return
    index, _ = made.result()
    host.request(Command.CLOSE, Close([index]), lambda pending, failure: None)
