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
from gymnasium.utils.env_checker import data_equivalence

from envserver.errors import EnvLostError, RequestTimeoutError
from envserver.wire.bodies import Call as CallBody
from envserver.wire.bodies import Close, EnvIds, Reset, SetState, Step
from envserver.wire.messages import Command
from envserver.wire.replies import ResetReply, StepReply

from .._recovery.history import BlockHistory
from ._host import PooledHost
from ._turn import Call, batch, split

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
        self._in_episode = False
        self._started = False  # reset at least once since it was made: it has a state
        self._movable = True  # its state can be taken (a drain moves it)
        self._given: Any = None  # the observation its coroutine was given last (restore mode)
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
        obs, info = await self._call(Command.RESET, (seed, options))
        self._in_episode = self._started = True
        return obs, info

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Steps the env, as ``gymnasium.Env.step``.

        Raises:
            ValueError: If ``action`` does not fit the action space's shape.
            EnvLostError: If the env was lost with its host (once).
        """
        obs, reward, terminated, truncated, info = await self._call(Command.STEP, action)
        self._in_episode = not (terminated or truncated)
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
        if not self._started:
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
                    g[0]._asked(g[0]._host, Command.SET_STATE, _set_state(state, g), g)
                    for g in hosts.values()
                )
            )
        except BaseException:
            await asyncio.gather(*(c.close() for c in children), return_exceptions=True)
            raise
        for group, replies in zip(hosts.values(), moments):
            for child, (obs, _, ended) in zip(group, replies):
                child._in_episode, child._started, child._given = not ended, True, obs
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
        self._in_episode = self._started = False  # a new env (a restore or move: its state)

    def lost_with(self, host: PooledHost) -> EnvLostError:
        """The loss of this env with its failed ``host``, for the call that reports it.

        The env leaves the host: its next call makes it anew on another.
        """
        episode = self._in_episode
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
            await self._remember(command, payload, result)
            return result
        raise AssertionError("unreachable")  # (the loop returns or raises)

    async def _once(self, command: Command, payload: Any) -> Any:
        """Runs one call on its host, in the turn's message of its kind.

        CALL and GET_STATE go in a message of their own.
        """
        await self._ready()
        host = self._host
        if command is Command.STEP and self._started and not self._in_episode:
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
        self._in_episode = command is Command.RESET or not (result[2] or result[3])
        self._started = self._started or command is Command.RESET
        if self.pool.history is not None:
            self._noted(command, payload, result)

    async def _ready(self) -> None:
        """Before a call: the env open, no other call under way, a loss reported, a host."""
        if self.closed:
            raise gym.error.ClosedEnvironmentError(f"{self.name} is closed")
        await self._settled()
        if self._loss is not None:
            loss, self._loss = self._loss, None
            raise loss
        if self._host is None:
            if self.gid is not None and self.pool.history is not None:
                await self._restore()
            else:
                await self.pool.place(self)
        elif self._host.draining and self._movable:
            await self._move()

    async def _move(self) -> None:
        """Moves the env off its draining host, in its state: its coroutine does not notice.

        Its snapshot is taken there, restored into a new env on another host, and the old env
        closed. An env whose state cannot be taken stays (it is lost if the drain ends first).
        """
        old, index = self._host, self.index
        if not self._started:  # no state to carry: made anew elsewhere
            self._leave()
            try:
                await self.pool.place(self)
            except BaseException:
                self._host, self.index = old, index  # where it still is
                old.envs[index] = self
                raise
            self.pool.counts.moved += 1
            await self.pool.let_go(old, index)
            return
        try:
            (state,) = await self._asked(old, Command.GET_STATE, EnvIds([index]))
        except EnvLostError:
            raise
        except Exception as exc:
            self._movable = False
            logger.warning(
                "%s stays on draining %s: its state cannot be taken (%s)", self.name, old.name, exc
            )
            return
        episode = self._in_episode
        self._leave()
        try:
            await self.pool.place(self)
            await self._asked(self._host, Command.SET_STATE, _set_state(state, [self]))
        except BaseException as exc:
            if self._host is not None:  # made there, not restored: closed again
                self._close_on(self._host)
            self._host, self.index = old, index  # where it still is, unchanged
            old.envs[index] = self
            self._in_episode, self._started = episode, True
            if not isinstance(exc, Exception):
                raise
            logger.warning(  # no room, or the new host failed: it stays, to move at its next call
                "%s stays on draining %s for now: it could not move (%s)", self.name, old.name, exc
            )
            return
        self._in_episode, self._started = episode, True
        self.pool.counts.moved += 1
        logger.info("%s moved from draining %s to %s", self.name, old.name, self._host.name)
        await self.pool.let_go(old, index)

    async def _remember(self, command: Command, payload: Any, result: Any) -> None:
        """Keeps what a call did, for a restore: the step or reset, what it gave, snapshots.

        A snapshot follows every reset (a reset without a seed cannot be sent again) and
        every call of the env's methods (they may change it), and every ``snapshot_every``
        steps otherwise.
        """
        if not self._noted(command, payload, result) or not self._started:
            return  # (never reset: no state to keep yet)
        history, gid = self.pool.history, self.gid
        try:
            (state,) = await self._asked(self._host, Command.GET_STATE, EnvIds([self.index]))
        except EnvLostError:
            return  # its next call restores it from what was kept before
        history.snapshots_taken([gid], [bytes(state)])

    def _noted(self, command: Command, payload: Any, result: Any) -> bool:
        """Keeps a step or reset in the history, and what it gave; whether a snapshot is due.

        The observation kept is what a restore must give again (one its coroutine was given,
        or that of a call it abandoned and the host took).
        """
        history, gid = self.pool.history, self.gid
        if command is Command.STEP:
            self._given = result[0]
            history.sent([gid], Step(batch(self.action_space, [payload]), None))
            return history.due(gid)
        if command is Command.RESET:
            self._given = result[0]
            history.sent([gid], Reset([payload[0]], payload[1], None))
            return True
        return command is Command.CALL

    async def _restore(self) -> None:
        """Brings the env back on another host, as it was: its snapshot, then the calls since.

        A restore cut short (cancelled, or its new host failed too) leaves the env with no
        host again, so that its next call restores it whole; never half restored.

        Raises:
            EnvLostError: If its new host failed meanwhile (its next call tries again), or if
                the host refused the restore: it is made anew there, to reset.
            RequestTimeoutError: If a request of the restore passed the pool's
                ``request_timeout_s`` (its next call tries again).
        """
        history = self.pool.history
        plan = history.of_block(self.gid, self.gid + 1, ())
        episode = self._in_episode
        self._leave()
        await self.pool.place(self)
        if plan is None:  # never reset nor forked: nothing to bring back, a new env will do
            return
        host = self._host
        try:
            got = await self._replay(host, plan)
        except BaseException as exc:
            interrupted = not isinstance(exc, Exception) or isinstance(exc, RequestTimeoutError)
            cut = interrupted or host.failure is not None
            if cut:  # no host: its next call restores it again
                self._close_on(host)
                self._in_episode, self._started, self._loss = episode, True, None
            else:  # refused: it stays there as a new env, and nothing kept restores it
                history.remade(self.gid, self.gid + 1)
            if interrupted:
                raise
            raise EnvLostError(
                f"{self.name} could not be restored on {host.name}: {exc}"
                + ("" if cut else ": reset it to go on"),
                env=self.name,
                host=host.name,
                episode_lost=episode,
            ) from exc
        if self._given is not None and not data_equivalence(got, self._given, exact=True):
            history.remade(self.gid, self.gid + 1)  # (first: nothing kept restores it now)
            self._close_on(host)  # not the env its coroutine knows: a new one, to reset
            await self.pool.place(self)
            raise EnvLostError(
                f"{self.name} was restored on {host.name}, but the steps sent again did not give "
                "the observation it was given (its env does not repeat itself): it is made "
                "anew: reset it to go on",
                env=self.name,
                host=host.name,
                episode_lost=episode,
            )
        self._in_episode, self._started = episode, True
        self.pool.counts.restored += 1
        logger.info("%s restored on %s", self.name, host.name)

    async def _replay(self, host: PooledHost, plan: BlockHistory) -> Any:
        """Sends the env on ``host`` its snapshot and what it was sent since: its observation."""
        got = None
        if plan.states[0] is not None:
            answers = await self._asked(host, Command.SET_STATE, _set_state(plan.states[0], [self]))
            got = answers[0][0]
        for request in plan.again:
            if isinstance(request, Step):
                body = await self._asked(host, Command.STEP, Step(request.actions, [self.index]))
                obs = host.connection.read(StepReply, body).obs
            else:
                again = Reset(request.seeds, request.options, [self.index])
                obs = host.connection.read(
                    ResetReply, await self._asked(host, Command.RESET, again)
                ).obs
            got = split(self.observation_space, obs, 1)[0]
        return got

    def _close_on(self, host: PooledHost) -> None:
        """Leaves ``host``, where it was made for a restore or a move not done: closed again.

        Closed once the request abandoned there is answered (a host closes no env it is busy
        with).
        """
        index = self.index
        if self._host is not host:
            return
        self._leave()

        def close(_: object = None) -> None:
            host.request(Command.CLOSE, Close([index]), lambda pending, failure: None)

        under_way = self._under_way
        if under_way is None or under_way.done():
            close()
        else:
            under_way.add_done_callback(close)

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

    async def _settled(self) -> None:
        """Waits for the reply of a request abandoned after it left (a call cut short)."""
        under_way = self._under_way
        if under_way is not None and not under_way.done():
            await asyncio.wait([under_way])


def _set_state(state: bytes, envs: list[AsyncEnv]) -> SetState:
    """SET_STATE of one snapshot into each env of ``envs`` (all on one host)."""
    return SetState([state] * len(envs), [env.index for env in envs])


async def _awaited(
    future: asyncio.Future, envs: list[AsyncEnv], withdraw: Callable[[], bool] | None = None
) -> Any:
    """The result of ``future``, the call under way of each of ``envs`` until it is done.

    Cancelled, the call is taken back if it never left (``withdraw`` says whether it did
    that); else it is abandoned: its result is dropped when it comes, and each env's next call
    waits for it first (:meth:`AsyncEnv._settled`). Past the pool's ``request_timeout_s`` it
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
