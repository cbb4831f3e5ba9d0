"""One host of an agent-loop pool: its session, the calls of one loop turn, and their replies.

A :class:`PooledHost` holds one connection and one session on its host, grown one env at a
time (MAKE with ``"add"``). Calls that coroutines make on its envs within one turn of the event
loop are queued (:meth:`PooledHost.queue`) and leave together once the turn is over, one
message per kind: a STEP over every env stepped, a RESET over every env reset with the same
options, one MAKE and one CLOSE. STEP and RESET ask for ``env_errors``, so that an env that
raises fails its own call only.

Replies are read when the socket says so (``loop.add_reader`` on ZeroMQ's descriptor, which
signals edges: the socket is read until it has nothing, also after each send), each taken into
its request (the connection's :class:`~envserver.client._transport.tracker.RequestTracker`) and
handed to the calls it answers. The host's health is watched as every wait of the client
watches it (``HostConnection.check``: the link's monitor, the request deadline), on its
monitor's descriptor and on a timer while requests are under way; a host found failed fails
every call under way with the loss of its env.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import zmq
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envserver.errors import EnvServerError, HostUnavailableError
from envserver.wire.bodies import Close, Make, RequestBody, Reset, Step
from envserver.wire.messages import Command, Status
from envserver.wire.replies import MakeReply, ResetReply, StepReply

from .._transport.connection import HostConnection
from .._transport.error_replies import exception_from
from .._transport.requests import Pending

if TYPE_CHECKING:
    from ._env import AsyncEnv

__all__ = ["Call", "PooledHost", "batch"]

logger = logging.getLogger(__name__)

#: How often the health of a host with requests under way is looked at, besides its monitor.
WATCH_INTERVAL_S = 0.1

#: What handles a request's reply: called with the request once answered, or with the failure
#: of its host (then the request's reply is None).
OnReply = Callable[[Pending, BaseException | None], None]


@dataclass(eq=False)
class Call:
    """One env's call, waiting for its turn's message and then for its reply.

    Attributes:
        env: The env.
        payload: What the call carries: an action (STEP), ``(seed, options)`` (RESET), the
            env's kwargs (MAKE), nothing (CLOSE).
        future: Where its result goes.
    """

    env: AsyncEnv
    payload: Any
    future: asyncio.Future

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        """Gives the call its result, or its error (nothing if it was abandoned)."""
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class PooledHost:
    """One host's connection and session, shared by the pool's envs on it.

    Args:
        connection: The connection (no session held yet: :meth:`open` opens it).
        loop: The event loop the pool runs on.
        on_failure: Called once with this host and the error when it is found failed.
    """

    def __init__(
        self,
        connection: HostConnection,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[PooledHost, EnvServerError], None],
    ) -> None:
        self.connection = connection
        self.name = connection.block.name
        self._loop = loop
        self._on_failure = on_failure
        #: The envs held there, by their index in the session.
        self.envs: dict[int, AsyncEnv] = {}
        #: Envs asked for and not made yet (they count in :attr:`load`).
        self.making = 0
        #: Why this host is unusable, once it is (None: it is usable).
        self.failure: BaseException | None = None
        self._queued: dict[Command, list[Call]] = {}
        self._flush_due = False
        self._under_way: list[tuple[Pending, OnReply]] = []
        self._watch: asyncio.TimerHandle | None = None
        self._fds: list[int] = []
        self._shut = False
        self._ended = False
        connection.link.on_renew = self._listen  # a new socket: its descriptor read instead
        self._listen()

    @property
    def draining(self) -> bool:
        """Whether the host said it drains: its envs move at their next call, none is added."""
        return self.connection.draining

    @property
    def load(self) -> int:
        """How many of the pool's envs this host holds or is making."""
        return len(self.envs) + self.making

    # ------------------------------------------------------------- calls

    def queue(self, command: Command, call: Call) -> None:
        """Queues ``call``: it leaves with the others of this turn once the turn is over."""
        if self._shut:
            call.settle(error=gym.error.ClosedEnvironmentError("the env pool is closed"))
            return
        if self.failure is not None:
            call.settle(error=call.env.lost_with(self))
            return
        self._queued.setdefault(command, []).append(call)
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def withdraw(self, call: Call) -> bool:
        """Takes back a call not sent yet (its coroutine was cancelled); whether it was one."""
        for calls in self._queued.values():
            if call in calls:
                calls.remove(call)
                return True
        return False

    def request(self, command: Command, body: RequestBody | None, on_reply: OnReply) -> None:
        """Sends one request now; ``on_reply`` gets it once answered (or the host's failure)."""
        if self.failure is not None:
            on_reply(Pending(-1, command, body, []), self.failure)
            return
        try:
            pending = self.connection.requests.send(command, body)
        except HostUnavailableError as exc:  # failed meanwhile
            self._fail(exc)
            on_reply(Pending(-1, command, body, []), self.failure)
            return
        except Exception as exc:  # it cannot be sent (too large, not encodable): its calls fail
            on_reply(Pending(-1, command, body, []), exc)
            return
        self._under_way.append((pending, on_reply))
        if self._watch is None:
            self._watch = self._loop.call_later(WATCH_INTERVAL_S, self._watched)

    async def ask(self, command: Command, body: RequestBody | None) -> Any:
        """Sends one request and returns its OK reply's body.

        Raises:
            The error the reply describes, or the host's failure.
        """
        future = self._loop.create_future()

        def answered(pending: Pending, failure: BaseException | None) -> None:
            if future.done():
                return
            try:
                future.set_result(self._ok(pending, failure))
            except BaseException as exc:  # the caller's to raise
                future.set_exception(exc)

        self.request(command, body, answered)
        self._readable()
        return await future

    def _ok(self, pending: Pending, failure: BaseException | None) -> Any:
        """The body of ``pending``'s OK reply; raises its error, or the host's failure."""
        if failure is not None:
            raise failure
        reply = pending.reply
        if reply.status is not Status.OK:
            error = self.connection.error(reply)
            if self.connection.health.failure is not None:  # the reply says the envs are lost
                self._fail(self.connection.failure_error())
                raise self.failure
            raise error
        return reply.body

    def _flush(self) -> None:
        """Sends what this turn queued: one message per kind of call."""
        self._flush_due = False
        queued, self._queued = self._queued, {}
        for command, calls in queued.items():
            calls = [call for call in calls if not call.future.done()]
            if not calls:
                continue
            if command is Command.RESET:  # one options for a whole RESET: grouped by them
                for group in _by_options(calls):
                    self._send_resets(group)
            elif command is Command.STEP:
                self._send_steps(calls)
            elif command is Command.MAKE:
                self._send_makes(calls)
            else:
                self._send_closes(calls)
        self._readable()  # what came while sending: the descriptor's edge may be past

    # ------------------------------------------------------------- the messages

    def _send_steps(self, calls: list[Call]) -> None:
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
        self.request(Command.STEP, body, lambda p, f: self._stepped(calls, p, f))

    def _stepped(self, calls: list[Call], pending: Pending, failure: BaseException | None) -> None:
        step = self._read(calls, pending, failure, StepReply)
        if step is None:
            return
        observations = _split(calls[0].env.observation_space, step.obs, len(calls))
        infos = dict(step.infos)
        errors = dict(step.env_errors or ())
        for k, call in enumerate(calls):
            index = call.env.index
            if index in errors:
                call.settle(error=exception_from(errors[index], call.env.where))
                continue
            result = (
                observations[k],
                float(step.rewards[k]),
                bool(step.terminations[k]),
                bool(step.truncations[k]),
                infos.get(index, {}),
            )
            call.settle(result)

    def _send_resets(self, calls: list[Call]) -> None:
        seeds = [call.payload[0] for call in calls]
        body = Reset(seeds, calls[0].payload[1], [c.env.index for c in calls], env_errors=True)
        self.request(Command.RESET, body, lambda p, f: self._reset(calls, p, f))

    def _reset(self, calls: list[Call], pending: Pending, failure: BaseException | None) -> None:
        reset = self._read(calls, pending, failure, ResetReply)
        if reset is None:
            return
        observations = _split(calls[0].env.observation_space, reset.obs, len(calls))
        infos = dict(reset.infos)
        errors = dict(reset.env_errors or ())
        for k, call in enumerate(calls):
            index = call.env.index
            if index in errors:
                call.settle(error=exception_from(errors[index], call.env.where))
            else:
                call.settle((observations[k], infos.get(index, {})))

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
        self.request(Command.MAKE, body, lambda p, f: self._made(calls, p, f))

    def _made(self, calls: list[Call], pending: Pending, failure: BaseException | None) -> None:
        """Each env made gets its index and the MAKE reply.

        A MAKE of several envs that the host refused goes again as one MAKE per env, so that
        only the env at fault (or those past a limit) fail.
        """
        refused = failure is None and pending.reply.status is not Status.OK
        if (
            refused
            and len(calls) > 1
            and self.connection.error(pending.reply) is not None
            and self.connection.health.failure is None  # (not a reply that says it lost us)
        ):
            for call in calls:
                self._send_makes([call])
            self._readable()
            return
        made = self._read(calls, pending, failure, MakeReply)
        if made is not None:
            for k, call in enumerate(calls):
                call.settle((made.first_env + k, made))

    def _send_closes(self, calls: list[Call]) -> None:
        body = Close([call.env.index for call in calls])
        self.request(Command.CLOSE, body, lambda p, f: self._closed(calls, p, f))

    def _closed(self, calls: list[Call], pending: Pending, failure: BaseException | None) -> None:
        if self._read(calls, pending, failure) is not None:
            for call in calls:
                call.settle()

    def _read(
        self,
        calls: list[Call],
        pending: Pending,
        failure: BaseException | None,
        reply_type: type | None = None,
    ) -> Any:
        """``pending``'s OK reply, read as ``reply_type`` (None: ``True``, not read).

        Otherwise each call gets the error (the loss of its env, if the host failed), and
        None is returned.
        """
        try:
            body = self._ok(pending, failure)
            return True if reply_type is None else self.connection.read(reply_type, body)
        except BaseException as exc:  # each call raises it
            for call in calls:
                call.settle(error=exc if self.failure is None else call.env.lost_with(self))
            return None

    # ------------------------------------------------------------- replies and health

    def _listen(self) -> None:
        """Reads the socket and its monitor when their descriptors say so."""
        self._unlisten()
        link = self.connection.link
        for socket, callback in ((link.socket, self._readable), (link.monitor, self._look)):
            fd = socket.getsockopt(zmq.FD)
            self._loop.add_reader(fd, callback)
            self._fds.append(fd)

    def _unlisten(self) -> None:
        for fd in self._fds:
            self._loop.remove_reader(fd)
        self._fds.clear()

    def _readable(self) -> None:
        """Takes every reply that came into its request, and hands it on."""
        if self.failure is not None or self._ended:
            return
        try:
            self.connection.requests.receive()
        except EnvServerError as exc:
            self._fail(exc)
            return
        self._hand_on()

    def _hand_on(self) -> None:
        """Calls the handler of each request answered (or failed with the host)."""
        if not any(pending.reply is not None for pending, _ in self._under_way):
            if self.connection.health.failure is not None:
                self._fail(self.connection.failure_error())
            return
        answered = [(p, on_reply) for p, on_reply in self._under_way if p.reply is not None]
        self._under_way = [(p, on_reply) for p, on_reply in self._under_way if p.reply is None]
        for pending, on_reply in answered:
            on_reply(pending, None)
        if self.connection.health.failure is not None:
            self._fail(self.connection.failure_error())

    def _watched(self) -> None:
        """The timer's look at the host's health, again later while requests are under way."""
        self._watch = None
        self._look()
        if self._under_way and self._watch is None and self.failure is None:
            self._watch = self._loop.call_later(WATCH_INTERVAL_S, self._watched)

    def _look(self) -> None:
        """Looks at the host's health (and its replies); fails it if it failed."""
        if self.failure is not None or self._ended:
            return
        try:
            self.connection.requests.read_events()  # what the monitor said (all of it: an edge)
            self.connection.check()  # sends what waits; the link, the process, the deadline
        except EnvServerError as exc:
            self._readable()  # replies that came before the failure are still theirs
            self._fail(exc)
            return
        self._readable()

    def _fail(self, error: EnvServerError) -> None:
        """This host failed: every call under way and queued gets it, and the pool is told."""
        if self.failure is not None:
            return
        self.failure = error
        logger.warning("%s failed: %s", self.name, error)
        self._unlisten()
        under_way, self._under_way = self._under_way, []
        queued, self._queued = self._queued, {}
        for pending, on_reply in under_way:
            on_reply(pending, error)
        for calls in queued.values():
            for call in calls:
                call.settle(error=call.env.lost_with(self))
        self._on_failure(self, error)

    def shut(self) -> None:
        """Takes no new call: the pool closes. Calls queued or under way are refused."""
        self._shut = True
        closed = gym.error.ClosedEnvironmentError("the env pool is closed")
        queued, self._queued = self._queued, {}
        under_way, self._under_way = self._under_way, []
        for calls in queued.values():
            for call in calls:
                call.settle(error=closed)
        for _, on_reply in under_way:
            on_reply(Pending(-1, Command.CLOSE, None, []), closed)

    def close(self) -> None:
        """Stops reading this host and closes its connection (the session is closed first)."""
        self._ended = True
        self._unlisten()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self.connection.close()


def _by_options(calls: list[Call]) -> list[list[Call]]:
    """Resets without options together; each with options alone (one options per RESET)."""
    plain = [call for call in calls if not call.payload[1]]
    groups = [[call] for call in calls if call.payload[1]]
    return [plain, *groups] if plain else groups


def batch(space: gym.Space, values: list[Any]) -> Any:
    """The batch of ``values`` of ``space``, as Gymnasium's vector envs batch actions."""
    return concatenate(space, values, create_empty_array(space, len(values)))


def _split(space: gym.Space, batch: Any, count: int) -> list[Any]:
    """The ``count`` observations of a batch, one per env."""
    if isinstance(space, gym.spaces.Box) and isinstance(batch, np.ndarray):
        return list(batch)
    return list(iterate(batch_space(space, count), batch))
