"""What keeps one env of an agent-loop pool whole across hosts: its episode, restores, moves.

An :class:`EnvKeeper` knows what a restore must bring back (whether the env was reset and is in
an episode, the observation its coroutine was given last), keeps each step and reset in the
pool's one history (``on_host_failure="restore"``), and carries the env to another host in its
state: :meth:`EnvKeeper.restore` when its host was lost (its snapshot, then the steps since,
sent again and checked), :meth:`EnvKeeper.move` when its host drains (GET_STATE there,
SET_STATE into a new env elsewhere). Either, cut short, leaves the env whole where it was or
with no host, never half carried.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gymnasium.utils.env_checker import data_equivalence

from envserver.errors import EnvLostError, RequestTimeoutError
from envserver.wire.bodies import Close, EnvIds, Reset, SetState, Step
from envserver.wire.messages import Command
from envserver.wire.replies import ResetReply, StepReply

from .._recovery.history import BlockHistory
from ._host import PooledHost
from ._turn import batch, split

if TYPE_CHECKING:
    from ._env import AsyncEnv

__all__ = ["EnvKeeper", "set_state"]

logger = logging.getLogger(__name__)


class EnvKeeper:
    """What keeps ``env`` whole across hosts (see the module docstring).

    Args:
        env: The env it keeps.
    """

    def __init__(self, env: AsyncEnv) -> None:
        self.env = env
        #: In an episode: reset, and no step since ended it.
        self.in_episode = False
        #: Reset at least once since it was made: it has a state.
        self.started = False
        #: Its state can be taken (a drain moves it).
        self.movable = True
        #: The observation its coroutine was given last (restore mode).
        self.given: Any = None

    def took(self, command: Command, result: Any) -> None:
        """Notes a step or reset the env took (``result``: what it returned): its episode."""
        if command is Command.RESET:
            self.in_episode = self.started = True
        else:
            self.in_episode = not (result[2] or result[3])

    async def move(self) -> None:
        """Moves the env off its draining host, in its state: its coroutine does not notice.

        Its snapshot is taken there, restored into a new env on another host, and the old env
        closed. An env whose state cannot be taken stays (it is lost if the drain ends first).
        """
        env = self.env
        old, index = env._host, env.index
        if not self.started:  # no state to carry: made anew elsewhere
            env._leave()
            try:
                await env.pool.place(env)
            except BaseException:
                env._host, env.index = old, index  # where it still is
                old.envs[index] = env
                raise
            env.pool.counts.moved += 1
            await env.pool.let_go(old, index)
            return
        try:
            (state,) = await env._asked(old, Command.GET_STATE, EnvIds([index]))
        except EnvLostError:
            raise
        except Exception as exc:
            self.movable = False
            logger.warning(
                "%s stays on draining %s: its state cannot be taken (%s)", env.name, old.name, exc
            )
            return
        episode = self.in_episode
        env._leave()
        try:
            await env.pool.place(env)
            await env._asked(env._host, Command.SET_STATE, set_state(state, [env]))
        except BaseException as exc:
            if env._host is not None:  # made there, not restored: closed again
                self.close_on(env._host)
            env._host, env.index = old, index  # where it still is, unchanged
            old.envs[index] = env
            self.in_episode, self.started = episode, True
            if not isinstance(exc, Exception):
                raise
            logger.warning(  # no room, or the new host failed: it stays, to move at its next call
                "%s stays on draining %s for now: it could not move (%s)", env.name, old.name, exc
            )
            return
        self.in_episode, self.started = episode, True
        env.pool.counts.moved += 1
        logger.info("%s moved from draining %s to %s", env.name, old.name, env._host.name)
        await env.pool.let_go(old, index)

    async def remember(self, command: Command, payload: Any, result: Any) -> None:
        """Keeps what a call did, for a restore: the step or reset, what it gave, snapshots.

        A snapshot follows every reset (a reset without a seed cannot be sent again) and
        every call of the env's methods (they may change it), and every ``snapshot_every``
        steps otherwise.
        """
        env = self.env
        if not self.noted(command, payload, result) or not self.started:
            return  # (never reset: no state to keep yet)
        history, gid = env.pool.history, env.gid
        try:
            (state,) = await env._asked(env._host, Command.GET_STATE, EnvIds([env.index]))
        except EnvLostError:
            return  # its next call restores it from what was kept before
        history.snapshots_taken([gid], [bytes(state)])

    def noted(self, command: Command, payload: Any, result: Any) -> bool:
        """Keeps a step or reset in the history, and what it gave; whether a snapshot is due.

        The observation kept is what a restore must give again (one its coroutine was given,
        or that of a call it abandoned and the host took).
        """
        env = self.env
        history, gid = env.pool.history, env.gid
        if command is Command.STEP:
            self.given = result[0]
            history.sent([gid], Step(batch(env.action_space, [payload]), None))
            return history.due(gid)
        if command is Command.RESET:
            self.given = result[0]
            history.sent([gid], Reset([payload[0]], payload[1], None))
            return True
        return command is Command.CALL

    async def restore(self) -> None:
        """Brings the env back on another host, as it was: its snapshot, then the calls since.

        A restore cut short (cancelled, or its new host failed too) leaves the env with no
        host again, so that its next call restores it whole; never half restored.

        Raises:
            EnvLostError: If its new host failed meanwhile (its next call tries again), or if
                the host refused the restore: it is made anew there, to reset.
            RequestTimeoutError: If a request of the restore passed the pool's
                ``request_timeout_s`` (its next call tries again).
        """
        env = self.env
        history = env.pool.history
        plan = history.of_block(env.gid, env.gid + 1, ())
        episode = self.in_episode
        env._leave()
        await env.pool.place(env)
        if plan is None:  # never reset nor forked: nothing to bring back, a new env will do
            return
        host = env._host
        try:
            got = await self.replay(host, plan)
        except BaseException as exc:
            interrupted = not isinstance(exc, Exception) or isinstance(exc, RequestTimeoutError)
            cut = interrupted or host.failure is not None
            if cut:  # no host: its next call restores it again
                self.close_on(host)
                self.in_episode, self.started, env._loss = episode, True, None
            else:  # refused: it stays there as a new env, and nothing kept restores it
                history.remade(env.gid, env.gid + 1)
            if interrupted:
                raise
            raise EnvLostError(
                f"{env.name} could not be restored on {host.name}: {exc}"
                + ("" if cut else ": reset it to go on"),
                env=env.name,
                host=host.name,
                episode_lost=episode,
            ) from exc
        if self.given is not None and not data_equivalence(got, self.given, exact=True):
            history.remade(env.gid, env.gid + 1)  # (first: nothing kept restores it now)
            self.close_on(host)  # not the env its coroutine knows: a new one, to reset
            await env.pool.place(env)
            raise EnvLostError(
                f"{env.name} was restored on {host.name}, but the steps sent again did not give "
                "the observation it was given (its env does not repeat itself): it is made "
                "anew: reset it to go on",
                env=env.name,
                host=host.name,
                episode_lost=episode,
            )
        self.in_episode, self.started = episode, True
        env.pool.counts.restored += 1
        logger.info("%s restored on %s", env.name, host.name)

    async def replay(self, host: PooledHost, plan: BlockHistory) -> Any:
        """Sends the env on ``host`` its snapshot and what it was sent since: its observation."""
        env = self.env
        got = None
        if plan.states[0] is not None:
            answers = await env._asked(host, Command.SET_STATE, set_state(plan.states[0], [env]))
            got = answers[0][0]
        for request in plan.again:
            if isinstance(request, Step):
                body = await env._asked(host, Command.STEP, Step(request.actions, [env.index]))
                obs = host.connection.read(StepReply, body).obs
            else:
                again = Reset(request.seeds, request.options, [env.index])
                obs = host.connection.read(
                    ResetReply, await env._asked(host, Command.RESET, again)
                ).obs
            got = split(env.observation_space, obs, 1)[0]
        return got

    def close_on(self, host: PooledHost) -> None:
        """Leaves ``host``, where it was made for a restore or a move not done: closed again.

        Closed once the request abandoned there is answered (a host closes no env it is busy
        with).
        """
        env = self.env
        index = env.index
        if env._host is not host:
            return
        env._leave()

        def close(_: object = None) -> None:
            host.request(Command.CLOSE, Close([index]), lambda pending, failure: None)

        under_way = env._under_way
        if under_way is None or under_way.done():
            close()
        else:
            under_way.add_done_callback(close)


def set_state(state: bytes, envs: list[AsyncEnv]) -> SetState:
    """SET_STATE of one snapshot into each env of ``envs`` (all on one host)."""
    return SetState([state] * len(envs), [env.index for env in envs])
