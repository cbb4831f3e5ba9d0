"""One host of an agent-loop pool: its connection and session, its replies and its health.

A :class:`PooledHost` holds one connection and one session on its host, grown one env at a
time (MAKE with ``"add"``); the calls of each turn of the event loop go out together
(:class:`~._turn.Turn`). Replies are read when the socket says so (``loop.add_reader`` on
ZeroMQ's descriptor, which signals edges: the socket is read until it has nothing, also after
each send), each taken into its request (the connection's
:class:`~envserver.client._transport.tracker.RequestTracker`) and handed to the calls it
answers. The host's health is judged as every wait of the client judges it (the link's monitor,
the process, the request deadline: ``HostConnection.check``), when its monitor says something
and on a timer while requests are under way; a host found failed fails every call under way
with the loss of its env.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import zmq

from envserver.errors import EnvServerError, HostUnavailableError
from envserver.wire.bodies import RequestBody
from envserver.wire.messages import Command, Status

from .._transport.connection import HostConnection
from .._transport.hearing import Hearing
from .._transport.requests import Pending
from ._turn import Call, Turn

if TYPE_CHECKING:
    from ._env import AsyncEnv

__all__ = ["PooledHost"]

logger = logging.getLogger(__name__)

#: How often the health of a host with requests under way is looked at, besides its monitor.
WATCH_INTERVAL_S = 0.1

#: What handles a request's reply: called with the request once answered, or with the failure
#: of its host (then the request's reply is None).
OnReply = Callable[[Pending, BaseException | None], None]


class PooledHost:
    """One host's connection and session, shared by the pool's envs on it.

    Args:
        connection: The connection (no session held yet: :meth:`open` opens it).
        loop: The event loop the pool runs on.
        on_failure: Called once with this host and the error when it is found failed.
        hearing: Tells this process what the envs said in the replies (None: not told).
    """

    def __init__(
        self,
        connection: HostConnection,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[PooledHost, EnvServerError], None],
        hearing: Hearing | None = None,
    ) -> None:
        self.connection = connection
        self._hearing = hearing
        self.name = connection.block.name
        self._loop = loop
        self._on_failure = on_failure
        #: The envs held there, by their index in the session.
        self.envs: dict[int, AsyncEnv] = {}
        #: Envs asked for and not made yet (they count in :attr:`load`).
        self.making = 0
        #: Why this host is unusable, once it is (None: it is usable).
        self.failure: BaseException | None = None
        #: The calls of this turn of the event loop, not sent yet.
        self.turn = Turn(self, loop)
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

    @property
    def full(self) -> bool:
        """Whether the host has no room for another of the pool's envs.

        By the most envs per session it said at HELLO; its limit in all, shared with other
        sessions, it applies itself (a MAKE past it is refused).
        """
        session = self.connection.requests.session
        if session is None:
            return True
        most = session.info.max_envs_per_session
        return bool(most) and self.load >= most

    # ------------------------------------------------------------- calls

    def queue(self, command: Command, call: Call) -> None:
        """Queues ``call`` for this turn's message of its kind (see :class:`~._turn.Turn`)."""
        if self._shut:
            call.settle(error=gym.error.ClosedEnvironmentError("the env pool is closed"))
        elif self.failure is not None:
            call.settle(error=call.env.lost_with(self))
        else:
            self.turn.queue(command, call)

    def withdraw(self, call: Call) -> bool:
        """Takes back a call not sent yet (its coroutine was cancelled); whether it was one."""
        return self.turn.withdraw(call)

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
        self.readable()
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

    def read(
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
        for socket, callback in ((link.socket, self.readable), (link.monitor, self._look)):
            fd = socket.getsockopt(zmq.FD)
            self._loop.add_reader(fd, callback)
            self._fds.append(fd)

    def _unlisten(self) -> None:
        for fd in self._fds:
            self._loop.remove_reader(fd)
        self._fds.clear()

    def readable(self) -> None:
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
        if self._hearing is not None:  # what the envs said, before what they gave
            self._hearing.tell()
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
            self.readable()  # replies that came before the failure are still theirs
            self._fail(exc)
            return
        self.readable()

    def _fail(self, error: EnvServerError) -> None:
        """This host failed: every call under way and queued gets it, and the pool is told."""
        if self.failure is not None:
            return
        self.failure = error
        logger.warning("%s failed: %s", self.name, error)
        self._unlisten()
        under_way, self._under_way = self._under_way, []
        for pending, on_reply in under_way:
            on_reply(pending, error)
        self.turn.drop(lambda call: call.env.lost_with(self))
        self._on_failure(self, error)

    def shut(self) -> None:
        """Takes no new call: the pool closes. Calls queued or under way are refused."""
        self._shut = True
        closed = gym.error.ClosedEnvironmentError("the env pool is closed")
        self.turn.drop(lambda call: closed)
        under_way, self._under_way = self._under_way, []
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
