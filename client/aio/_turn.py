"""The calls of one turn of the event loop on one host, sent as one message per kind.

Calls that coroutines make on one host's envs within one turn of the event loop are queued
(:meth:`Turn.queue`) and leave together once the turn is over: a STEP over every env stepped, a
RESET over every env reset with the same options, one MAKE and one CLOSE. STEP and RESET ask for
``env_errors``, so that an env that raises fails its own call only; each reply is handed to the
calls it answers, each its own part.

Envs that wait (a tool call, a sleep) are the exception: a message's reply leaves when its
slowest env is done, and the envs of one message, started together, end together and then take
the host's GIL one after another. Once a host's STEP replies take :data:`WAITING_PER_ENV_S` or
more per env (and :data:`OVER_THE_TURN` times the turn of the event loop that sent them: a reply
waits for the loop too, and a busy loop makes every reply slow), its steps leave in messages of
at most :data:`PIECE` envs, each answered as soon as its own envs are done. Measured, 256
rollouts of a 50 ms env on 4 hosts: 0.82 of the ideal in one message per turn, 0.92 in pieces
of 8, 0.82 in one message per env. Envs that compute take microseconds per env and stay in one
message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envserver.errors import EnvServerError
from envserver.wire.bodies import Close, Make, Reset, Step
from envserver.wire.messages import Command, Status
from envserver.wire.replies import MakeReply, ResetReply, StepReply

from .._results import Ready
from .._transport.error_replies import exception_from
from .._transport.requests import Pending

if TYPE_CHECKING:
    from ._env import AsyncEnv
    from ._host import PooledHost

__all__ = ["Call", "Turn", "batch", "split"]

#: A host whose STEP replies take this long or more per env stepped (wall time, from the send
#: to the reply) steps envs that wait: its steps leave in pieces ...
WAITING_PER_ENV_S = 200e-6
#: ... of at most this many envs ...
PIECE = 8
#: ... unless the reply took less than this many times the turn of the event loop that sent
#: it (then the loop, not the host, made it slow).
OVER_THE_TURN = 5


class Call:
    """One env's call, waiting for its turn's message and then for its reply.

    Args:
        env: The env.
        payload: What the call carries: an action (STEP), ``(seed, options)`` (RESET), the
            env's kwargs (MAKE), nothing (CLOSE).
        future: Where its result goes.
    """

    __slots__ = ("env", "future", "payload")

    def __init__(self, env: AsyncEnv, payload: Any, future: asyncio.Future) -> None:
        self.env = env
        self.payload = payload
        self.future = future

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        """Gives the call its result, or its error (nothing if it was abandoned)."""
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class Turn:
    """The calls queued on one host in this turn of the event loop.

    Args:
        host: The host they go to.
        loop: The event loop.
    """

    def __init__(self, host: PooledHost, loop: asyncio.AbstractEventLoop) -> None:
        self._host = host
        self._loop = loop
        self._queued: dict[Command, list[Call]] = {}
        self._flush_due = False
        self._queued_at = 0.0  # when this turn's first call was queued
        #: Whether the host's envs wait: its steps then leave in pieces of :data:`PIECE`.
        self.in_pieces = False

    def queue(self, command: Command, call: Call) -> None:
        """Queues ``call``: it leaves with the others of this turn once the turn is over."""
        self._queued.setdefault(command, []).append(call)
        if not self._flush_due:
            self._flush_due = True
            self._queued_at = time.perf_counter()
            self._loop.call_soon(self._flush)

    def withdraw(self, call: Call) -> bool:
        """Takes back a call not sent yet (its coroutine was cancelled); whether it was one."""
        for calls in self._queued.values():
            if call in calls:
                calls.remove(call)
                return True
        return False

    def drop(self, error: Callable[[Call], BaseException]) -> None:
        """Gives every call queued its ``error(call)``: none of them will leave."""
        queued, self._queued = self._queued, {}
        for calls in queued.values():
            for call in calls:
                call.settle(error=error(call))

    def _flush(self) -> None:
        """Sends what this turn queued: one message per kind of call."""
        self._flush_due = False
        queued, self._queued = self._queued, {}
        turn = time.perf_counter() - self._queued_at
        for command, calls in queued.items():
            calls = [call for call in calls if not call.future.done()]
            if not calls:
                continue
            if command is Command.RESET:  # one options for a whole RESET: grouped by them
                for group in _by_options(calls):
                    self._send_resets(group)
            elif command is Command.STEP:
                size = PIECE if self.in_pieces else len(calls)
                for start in range(0, len(calls), size):
                    self._send_steps(calls[start : start + size], turn)
            elif command is Command.MAKE:
                self._send_makes(calls)
            else:
                self._send_closes(calls)
        self._host.readable()  # what came while sending: the descriptor's edge may be past

    # ------------------------------------------------------------- the messages

    def _send_steps(self, calls: list[Call], turn: float) -> None:
        space = calls[0].env.action_space
        try:
            actions = batch(space, [call.payload for call in calls])
        except Exception:  # some action does not fit the space: it fails its own call only
            fitting = []
            for call in calls:
                try:
                    batch(space, [call.payload])
                except Exception as exc:
                    call.settle(error=ValueError(f"{call.env.name}: an action of {space}: {exc}"))
                else:
                    fitting.append(call)
            if not fitting:
                return
            calls = fitting
            actions = batch(space, [call.payload for call in calls])
        body = Step(actions, [call.env.index for call in calls], env_errors=True)
        slow = time.perf_counter() + max(WAITING_PER_ENV_S * len(calls), OVER_THE_TURN * turn)
        self._host.request(Command.STEP, body, lambda p, f: self._stepped(calls, slow, p, f))

    def _stepped(
        self, calls: list[Call], slow: float, pending: Pending, failure: BaseException | None
    ) -> None:
        self.in_pieces = time.perf_counter() >= slow
        step = self._host.read(calls, pending, failure, StepReply)
        if step is not None:
            _settle_each(self._host, calls, step)

    def _send_resets(self, calls: list[Call]) -> None:
        seeds = [call.payload[0] for call in calls]
        body = Reset(seeds, calls[0].payload[1], [c.env.index for c in calls], env_errors=True)
        self._host.request(Command.RESET, body, lambda p, f: self._reset(calls, p, f))

    def _reset(self, calls: list[Call], pending: Pending, failure: BaseException | None) -> None:
        reset = self._host.read(calls, pending, failure, ResetReply)
        if reset is not None:
            _settle_each(self._host, calls, reset)

    def _send_makes(self, calls: list[Call]) -> None:
        pool = calls[0].env.pool
        body = Make(
            gym.vector.AutoresetMode.DISABLED,
            len(calls),
            envs=tuple((pool.env_id, call.payload) for call in calls),
            retry_window=pool.retry_window,
            specs=pool.specs,
            add=True,
            overlap=True,  # (for the session's first envs: it then steps them overlapping)
        )
        self._host.request(Command.MAKE, body, lambda p, f: self._made(calls, p, f))

    def _made(self, calls: list[Call], pending: Pending, failure: BaseException | None) -> None:
        """Each env made gets its index and the MAKE reply.

        A MAKE of several envs that the host refused goes again as one MAKE per env, so that
        only the env at fault (or those past a limit) fail.
        """
        refused = failure is None and pending.reply.status is not Status.OK
        if (
            refused
            and len(calls) > 1
            and self._host.connection.error(pending.reply) is not None
            and self._host.connection.health.failure is None  # (not a reply that says it lost us)
        ):
            for call in calls:
                self._send_makes([call])
            self._host.readable()
            return
        made = self._host.read(calls, pending, failure, MakeReply)
        if made is not None:
            for k, call in enumerate(calls):
                call.settle((made.first_env + k, made))

    def _send_closes(self, calls: list[Call]) -> None:
        body = Close([call.env.index for call in calls])
        self._host.request(Command.CLOSE, body, lambda p, f: self._closed(calls, p, f))

    def _closed(self, calls: list[Call], pending: Pending, failure: BaseException | None) -> None:
        if self._host.read(calls, pending, failure) is not None:
            for call in calls:
                call.settle()


def _settle_each(host: PooledHost, calls: list[Call], reply: StepReply | ResetReply) -> None:
    """Each call's part of a STEP or RESET reply, or its env's error (``env_errors``).

    The columns are read as the vector env reads them (``Ready.of``: exact dtypes and counts);
    a reply that does not hold one value per call fails the host, and each call gets that.
    """
    count = len(calls)
    try:
        ready = Ready.of(host.connection, np.arange(count), reply)
        try:
            observations = split(calls[0].env.observation_space, reply.obs, count)
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise host.connection.invalid(f"a malformed reply: {exc!r}") from exc
    except EnvServerError as exc:
        for call in calls:
            call.settle(error=exc)
        host.readable()  # (its failure is found there)
        return
    infos = dict(reply.infos)
    errors = dict(reply.env_errors or ())
    stepped = isinstance(reply, StepReply)
    for k, call in enumerate(calls):
        index = call.env.index
        if index in errors:
            call.settle(error=exception_from(errors[index], call.env.where))
        elif stepped:
            call.settle((
                observations[k],
                float(ready.rewards[k]),
                bool(ready.terminations[k]),
                bool(ready.truncations[k]),
                infos.get(index, {}),
            ))  # fmt: skip
        else:
            call.settle((observations[k], infos.get(index, {})))


def _by_options(calls: list[Call]) -> list[list[Call]]:
    """Resets without options together; each with options alone (one options per RESET)."""
    plain = [call for call in calls if not call.payload[1]]
    groups = [[call] for call in calls if call.payload[1]]
    return [plain, *groups] if plain else groups


def batch(space: gym.Space, values: list[Any]) -> Any:
    """The batch of ``values`` of ``space``, as Gymnasium's vector envs batch actions."""
    return concatenate(space, values, create_empty_array(space, len(values)))


def split(space: gym.Space, batch: Any, count: int) -> list[Any]:
    """The ``count`` observations of a batch, one per env."""
    if isinstance(space, gym.spaces.Box) and isinstance(batch, np.ndarray):
        return list(batch)
    return list(iterate(batch_space(space, count), batch))
