"""One env of an agent-loop pool, as its coroutine sees it: Gymnasium's ``Env``, awaited.

An :class:`AsyncEnv` follows ``gymnasium.Env``'s semantics (no autoreset: a step after the end
of an episode is refused until a reset) with ``await`` in front of ``reset``, ``step``,
``call`` and ``close``. It has at most one call under way: its coroutine's. A call cancelled
(``asyncio.timeout``, ``wait_for``, a task cancelled) is abandoned: taken back if it has not
left yet, else its reply is dropped when it comes, and the env's next call waits for that
reply first, so the env stays usable (a step abandoned after it left may have been taken).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from envserver.errors import EnvLostError, RequestTimeoutError
from envserver.wire.bodies import Call as CallBody
from envserver.wire.bodies import EnvIds
from envserver.wire.messages import Command

from ._host import PooledHost
from ._keeper import EnvKeeper, set_state
from ._turn import Call

if TYPE_CHECKING:
    from ._pool import EnvPool

__all__ = ["AsyncEnv"]

logger = logging.getLogger(__name__)


class AsyncEnv:
    """One env of an :class:`~envserver.client.aio.EnvPool`, on one of its hosts.

    Made by ``await pool.make(...)``, not directly.

    Attributes:
        observation_space: The env's observation space.
        action_space: The env's action space.
        metadata: The env's metadata (the entries that travel without pickle).
        render_mode: The env's render mode.
        number: Its number in the pool (counting the pool's envs from 0).
        name: How messages name it (``env N``, N its number).
    """

    def __init__(self, pool: EnvPool, kwargs: dict[str, Any], number: int) -> None:
        self.pool = pool
        self.kwargs = kwargs
        self.number = number
        self.name = f"env {number}"
        self.observation_space: gym.Space | None = None
        self.action_space: gym.Space | None = None
        self.metadata: dict[str, Any] = {}
        self.render_mode: str | None = None
        #: Its index in its host's session (None while it has no host).
        self.index: int | None = None
        #: Its index in the pool's history (restore mode), once made.
        self.gid: int | None = None
        self._host: PooledHost | None = None
        self._under_way: asyncio.Future | None = None
        self._abandoned = False
        self._calling: asyncio.Future | None = None  # done once the call under way is over
        self._caller: asyncio.Task | None = None  # the task of that call
        self._loss: EnvLostError | None = None  # lost between calls: raised by the next one
        self._keeper = EnvKeeper(self)  # its episode, and what carries it to another host
        self.closed = False

    @property
    def host(self) -> str | None:
        """How messages name the host it is on (None: it has none now)."""
        return None if self._host is None else self._host.name

    @property
    def where(self) -> str:
        """How error messages name it: its host, then itself."""
        return f"{self.host}, {self.name}"

    # ------------------------------------------------------------- Gymnasium's Env

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets the env, as ``gymnasium.Env.reset``: its first observation and info."""
        obs, info = result = await self._call(Command.RESET, (seed, options))
        self._keeper.took(Command.RESET, result)
        return obs, info

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Steps the env, as ``gymnasium.Env.step``.

        Raises:
            ValueError: If ``action`` does not fit the action space's shape.
            EnvLostError: If the env was lost with its host (once).
        """
        obs, reward, terminated, truncated, info = result = await self._call(Command.STEP, action)
        self._keeper.took(Command.STEP, result)
        return obs, reward, terminated, truncated, info

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Calls the env's method ``name`` (or reads its attribute ``name``) on its host."""
        return await self._call(Command.CALL, (name, args, kwargs))

    async def fork(self, n: int) -> list[AsyncEnv]:
        """``n`` new envs in exactly this env's state, on the hosts with room.

        The env's state is taken once (GET_STATE: by its simulator's adapter, its hooks, or a
        replay of its episode, as the env state guide says) and restored into each new env.
        Given the same actions, each goes on exactly as this one would; this one goes on
        unchanged.

        Raises:
            ResetNeeded: If the env was never reset (it has no state yet).
            UnsupportedStateError: If no mechanism covers a layer of the env's stack.
            LimitError: If the hosts have no room for them (none is made then).
        """
        if type(n) is not int or n < 1:
            raise ValueError(f"fork needs a positive number of new envs, got {n!r}")
        if not self._keeper.started:
            raise gym.error.ResetNeeded(f"{self.name} has no state to fork: reset it first")
        state = await self._call(Command.GET_STATE, None)
        history = self.pool.history
        if history is not None:  # the state of now: the original's snapshot, for free
            history.snapshots_taken([self.gid], [bytes(state)])
        children = [self.pool.new_env(self.kwargs) for _ in range(n)]
        try:
            placed = await asyncio.gather(
                *(self.pool.place(child) for child in children), return_exceptions=True
            )
            failed = next((p for p in placed if isinstance(p, BaseException)), None)
            if failed is not None:
                raise failed
            hosts: dict[int, list[AsyncEnv]] = {}
            for child in children:
                hosts.setdefault(id(child._host), []).append(child)
            moments = await asyncio.gather(
                *(
                    g[0]._asked(g[0]._host, Command.SET_STATE, set_state(state, g), g)
                    for g in hosts.values()
                )
            )
        except BaseException:
            await asyncio.gather(*(c.close() for c in children), return_exceptions=True)
            raise
        for group, replies in zip(hosts.values(), moments):
            for child, (obs, _, ended) in zip(group, replies):
                kept = child._keeper
                kept.in_episode, kept.started, kept.given = not ended, True, obs
        if history is not None:  # their first snapshot: a restore brings them back in it
            history.snapshots_taken([child.gid for child in children], [bytes(state)] * n)
        self.pool.counts.forks += n
        return children

    async def close(self) -> None:
        """Closes the env on its host; its other calls then raise. Closing twice does nothing.

        A call under way (another coroutine's) is waited for first.
        """
        if self.closed:
            return
        if self._calling is not None and not self._calling.done():
            await asyncio.wait([self._calling])
        try:
            if self._host is not None and self._host.failure is None:
                await self._call(Command.CLOSE, None)
        except EnvLostError:
            pass  # gone with its host: nothing left to close
        finally:
            self.closed = True
            self._leave()

    async def __aenter__(self) -> AsyncEnv:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------- the pool's side

    def placed(self, host: PooledHost, index: int, made: Any) -> None:
        """It is held by ``host`` at ``index``, with the spaces of its MAKE reply ``made``."""
        self._host, self.index = host, index
        host.envs[index] = self
        if self.observation_space is None:
            spaces = self.pool.spaces(made)
            self.observation_space, self.action_space = spaces
            self.metadata, self.render_mode = dict(made.metadata), made.render_mode
        if self.gid is None and self.pool.history is not None:
            self.gid = self.pool.history.grow()[0]
        self._keeper.in_episode = self._keeper.started = False  # new (a restore, a move: its state)

    def lost_with(self, host: PooledHost) -> EnvLostError:
        """The loss of this env with its failed ``host``, for the call that reports it.

        The env leaves the host: its next call makes it anew on another.
        """
        episode = self._keeper.in_episode
        if self._host is host:  # (not an env being made there: that is a refusal)
            self.pool.counts.lost += 1
        self._leave()
        return EnvLostError(
            f"{self.name} lost with its host: {host.failure}; "
            + ("its episode is cut" if episode else "no episode was under way")
            + ": reset it to go on (on another host)",
            env=self.name,
            host=host.name,
            episode_lost=episode,
        )

    def host_failed(self, host: PooledHost) -> None:
        """Its host failed while it had no call under way: its next call raises the loss."""
        if self._host is host:
            self._loss = self.lost_with(host)

    def _leave(self) -> None:
        host, self._host = self._host, None
        if host is not None and host.envs.get(self.index) is self:
            del host.envs[self.index]

    async def _call(self, command: Command, payload: Any) -> Any:
        """Runs one call, the env's only one: another coroutine's meanwhile is refused.

        With ``on_host_failure="restore"``, through the losses of hosts: a loss leaves the env
        with no host, the call is tried again, and its next try restores the env on another
        host first (its last snapshot, then the calls since); what the call did is then kept
        for the next restore.

        Raises:
            RuntimeError: If another coroutine's call is under way (one whose task is being
                cancelled, ``task.cancel()`` not reached it yet, is waited for).
        """
        calling, caller = self._calling, self._caller
        if calling is not None and not calling.done():
            if not (caller.done() or _cancelling(caller)):
                raise RuntimeError(
                    f"{self.name} already has a call under way: one coroutine at a time per env"
                )
            await asyncio.wait([calling])
        self._calling = mine = asyncio.get_running_loop().create_future()
        self._caller = asyncio.current_task()
        try:
            return await self._run(command, payload)
        finally:
            mine.set_result(None)

    async def _run(self, command: Command, payload: Any) -> Any:
        """The body of :meth:`_call`."""
        if self.pool.history is None:
            return await self._once(command, payload)
        for attempt in range(len(self.pool.hosts) + 1):  # each failed host once, at most
            try:
                result = await self._once(command, payload)
            except EnvLostError:
                if attempt == len(self.pool.hosts) or self._host is not None:
                    raise  # every host failed, or it could not be restored (it is new there)
                continue
            await self._keeper.remember(command, payload, result)
            return result
        raise AssertionError("unreachable")  # (the loop returns or raises)

    async def _once(self, command: Command, payload: Any) -> Any:
        """Runs one call on its host, in the turn's message of its kind.

        CALL and GET_STATE go in a message of their own.
        """
        await self._ready()
        host = self._host
        if command is Command.STEP and self._keeper.started and not self._keeper.in_episode:
            raise gym.error.ResetNeeded(
                f"{self.name}: its episode ended (terminated or truncated): reset it to step again"
            )
        if command is Command.CALL:
            name, args, kwargs = payload
            body = CallBody(name, list(args), kwargs, [self.index])
            return (await self._asked(host, command, body))[0]
        if command is Command.GET_STATE:
            return (await self._asked(host, command, EnvIds([self.index])))[0]
        call = Call(self, payload, asyncio.get_running_loop().create_future())
        host.queue(command, call)
        try:
            return await _awaited(call.future, [self], lambda: host.withdraw(call))
        except (asyncio.CancelledError, RequestTimeoutError):
            if self._abandoned:  # it left: the host may take it
                call.future.add_done_callback(lambda done: self._taken(command, payload, done))
            raise

    def _taken(self, command: Command, payload: Any, done: asyncio.Future) -> None:
        """Notes an abandoned step or reset the host took: its episode, and for a restore.

        One that failed with the env's loss leaves that loss to the env's next call.
        """
        if done.cancelled() or command is Command.CLOSE:
            return
        error = done.exception()
        if isinstance(error, EnvLostError) and self._host is None and self._loss is None:
            self._loss = error
        if error is not None:
            return
        result = done.result()
        self._keeper.took(command, result)
        if self.pool.history is not None:
            self._keeper.noted(command, payload, result)

    async def _ready(self) -> None:
        """Before a call: the env open, no other call under way, a loss reported, a host."""
        if self.closed:
            raise gym.error.ClosedEnvironmentError(f"{self.name} is closed")
        under_way = self._under_way  # a request abandoned after it left: its reply first
        if under_way is not None and not under_way.done():
            await asyncio.wait([under_way])
        if self._loss is not None:
            loss, self._loss = self._loss, None
            raise loss
        if self._host is None:
            if self.gid is not None and self.pool.history is not None:
                await self._keeper.restore()
            else:
                await self.pool.place(self)
        elif self._host.draining and self._keeper.movable:
            await self._keeper.move()

    async def _asked(
        self,
        host: PooledHost,
        command: Command,
        body: Any,
        envs: list[AsyncEnv] | None = None,
    ) -> Any:
        """The results of a request of its own for this env (and ``envs``, all on ``host``).

        Not in a turn's message: CALL, GET_STATE, SET_STATE, and what a restore sends again.
        Until it is answered it is the call under way of each env it is for (see
        :func:`_awaited`).

        Raises:
            EnvLostError: If the host this env is on failed.
        """
        future = asyncio.ensure_future(host.ask(command, body))
        try:
            return await _awaited(future, envs or [self])
        except Exception:
            if host.failure is None:
                raise
            if self._host is host:
                raise self.lost_with(host) from None
            if self._loss is not None:  # (the pool's report of that failure came first)
                loss, self._loss = self._loss, None
                raise loss from None
            raise


async def _awaited(
    future: asyncio.Future, envs: list[AsyncEnv], withdraw: Callable[[], bool] | None = None
) -> Any:
    """The result of ``future``, the call under way of each of ``envs`` until it is done.

    Cancelled, the call is taken back if it never left (``withdraw`` says whether it did
    that); else it is abandoned: its result is dropped when it comes, and each env's next call
    waits for it first (:meth:`AsyncEnv._ready`). Past the pool's ``request_timeout_s`` it
    is abandoned too, and raises ``RequestTimeoutError``: the host and its other envs go on.

    Raises:
        RequestTimeoutError: If it was not answered within the pool's ``request_timeout_s``.
    """
    env = envs[0]
    bound = env.pool.request_timeout_s
    for each in envs:
        each._under_way, each._abandoned = future, False
    try:
        if bound is None:
            return await asyncio.shield(future)
        return await asyncio.wait_for(asyncio.shield(future), bound)
    except asyncio.CancelledError:
        _abandon(future, envs, withdraw)
        raise
    except asyncio.TimeoutError:
        if future.done():  # (what the call raised)
            raise
        left = not _abandon(future, envs, withdraw)
        raise RequestTimeoutError(
            f"{env.where}: no answer within request_timeout_s={bound:g} s (its env may hang "
            "in its step or reset): "
            + (
                "the call is abandoned, and the env's next call waits for its answer"
                if left
                else "the call was taken back before it left"
            )
        ) from None


def _abandon(
    future: asyncio.Future, envs: list[AsyncEnv], withdraw: Callable[[], bool] | None
) -> bool:
    """Takes back a call that never left, else drops its result when it comes.

    Returns:
        Whether it was taken back.
    """
    if withdraw is not None and withdraw():
        future.cancel()  # never left: nothing to wait for
        return True
    for env in envs:
        env._abandoned = True
    future.add_done_callback(_retrieved)
    return False


def _cancelling(task: asyncio.Task) -> bool:
    """Whether ``task`` was asked to cancel (Python 3.11 and later can tell)."""
    cancelling = getattr(task, "cancelling", None)
    return cancelling is not None and cancelling() > 0


def _retrieved(future: asyncio.Future) -> None:
    """Takes an abandoned call's error, so that asyncio does not report it as never seen."""
    if not future.cancelled():
        future.exception()
