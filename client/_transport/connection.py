"""One client-side connection to an env host: the session it holds, its parts, its failure.

A connection composes the host and envs it names (:class:`~.block.HostBlock`), a link
(:class:`~.link.HostLink`: the socket, its monitor, whole messages in and out), its health
(:class:`~.health.HostHealth`: its failure, once it has one, and the liveness verdicts that find
it) and the requests sent on the link (:class:`~.tracker.RequestTracker`: one
:class:`~.requests.Pending` each, and the session they carry). When the link says the
connection dropped (the host died, froze or became unreachable) while a request was under way,
or refused the handshake, the connection fails with
:class:`~envserver.errors.HostUnavailableError`. A host that is alive but does not answer (a
hung env step) is bounded separately, by a per-request deadline.

The host, in turn, keeps a session only while it hears from its client within the session
lease: a connection given a :class:`~.lease.Heartbeat` has it renew the lease of each session
it holds, from another thread and sockets of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import zmq

from envserver.errors import EnvServerError, HostUnavailableError, ProtocolError
from envserver.wire.bodies import Make
from envserver.wire.channel import SpinBackoff
from envserver.wire.messages import Command, Reply
from envserver.wire.raw import StepLayout
from envserver.wire.reach import check_resolvable
from envserver.wire.replies import MakeReply

from .block import HostBlock
from .error_replies import exception_of, loss_of
from .health import HostHealth
from .hearing import Hearing
from .lease import Heartbeat
from .link import HostLink
from .session import HostSession
from .settings import ConnectionSettings
from .tracker import RequestTracker

__all__ = ["CLOSE_FLUSH_MS", "HostConnection"]

#: A typed reply body (:mod:`envserver.wire.replies`): what :meth:`HostConnection.read` reads.
ReplyBody = TypeVar("ReplyBody")

#: How long a session close sent without waiting may take to leave, at most.
CLOSE_FLUSH_MS = 500


class HostConnection:
    """A connection to one host, holding one session and a block of envs.

    Args:
        context: The ZeroMQ context.
        endpoint: The host's endpoint.
        settings: The vector env's connection settings (bounds, trust, CURVE, shared memory).
        start: The global index of the first env of this host's block.
        count: How many envs the block has.
        ids: Where request ids come from (shared by every connection of a vector env, so an id
            is never reused by a connection that replaces another).
        process: For a local host, a callable that raises ``HostUnavailableError`` once its
            process exited (see :class:`~.liveness.Liveness`); None for a remote host.
        heartbeat: Renews the lease of the session this connection holds, or None.
        hearing: Tells the trainer what this host's envs said, or None (not told).
        name: How messages name the host (default: ``host ENDPOINT``).
        refused_fails: Whether a refused connection (nothing listens at the endpoint) fails
            it at once (see :class:`~.liveness.Liveness`).

    Raises:
        HostUnavailableError: If its ``tcp://`` name does not resolve.
    """

    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        settings: ConnectionSettings,
        *,
        start: int,
        count: int,
        ids: Iterator[int],
        process: Callable[[float], None] | None = None,
        heartbeat: Heartbeat | None = None,
        hearing: Hearing | None = None,
        name: str | None = None,
        refused_fails: bool = False,
    ) -> None:
        #: The host and the envs this connection holds there (how messages name them).
        self.block = HostBlock(name or f"host {endpoint}", endpoint, start, start + count)
        self.settings = settings
        self._heartbeat = heartbeat
        #: Whether this host is usable: its failure, once it has one.
        self.health = HostHealth(self.block, settings, process, refused_fails)
        #: How long messages still queued at :meth:`close` may take to leave (0: dropped).
        self.linger_ms = 0
        try:
            check_resolvable(endpoint)
        except OSError as exc:  # a name that does not resolve: no use waiting for it
            raise HostUnavailableError(f"{self.block.name}: {exc}") from None
        self.link = HostLink(context, endpoint, settings.host_timeout_s, settings.curve)
        #: The requests under way on the link, and the session they carry.
        self.requests = RequestTracker(
            self.link, self.block, self.health, ids, settings.allow_pickle, hearing
        )

    # ------------------------------------------------------------- the session

    def hold(self, session: HostSession) -> None:
        """Holds ``session``: requests carry it, and (with a heartbeat) its lease is renewed."""
        self.requests.session = session
        if self._heartbeat is not None:
            self._heartbeat.track(id(self), self.block.endpoint, session.id, self.link.curve)

    def let_go(self) -> None:
        """Holds no session any more: requests carry none, and its lease is no longer renewed.

        The host keeps the session until it is closed or its lease runs out.
        """
        self.requests.session = None
        if self._heartbeat is not None:
            self._heartbeat.untrack(id(self))

    @property
    def draining(self) -> bool:
        """Whether the host said it drains (its envs are to move to another host)."""
        return self._heartbeat is not None and self._heartbeat.draining(id(self))

    def make_body(self, body: Make) -> Make:
        """A MAKE body for this host, offering it a slab and a channel if it shares memory.

        The slab is for its observations, the channel for its steps (``HostSession``). The
        offers last until :meth:`use_layout` reads the reply (or :meth:`close`).
        """
        if not self.settings.shared_memory:
            return body
        session = self.requests.session
        slab = session.offer_slab()
        channels = session.offer_channels(body.retry_window)  # one per request under way
        return dataclasses.replace(
            body,
            obs_slab=slab,
            channel=channels[0] if channels else None,
            more_channels=tuple(channels[1:]),
        )

    def use_layout(self, made: MakeReply, layout: StepLayout | None) -> None:
        """Steps this host's envs with STEP_RAW if its MAKE reply offered ``layout`` itself.

        Their observations come in the slab offered by :meth:`make_body` if the host took it
        (see ``HostSession.agree``).

        Raises:
            ProtocolError: If the host took the slab at a size the layout does not have.
        """
        session = self.requests.session
        try:
            session.agree(made, layout, self.block.count)
        except ProtocolError as exc:
            raise self.invalid(f"an invalid MAKE reply: {exc}") from exc
        for channel in self.requests.channels:
            channel.spin = SpinBackoff(int(self.settings.reply_spin_s * 1e9))

    # ------------------------------------------------------------- failure

    def check(self) -> None:
        """Raises if this host has failed, or fails it now for what it did or did not do.

        A wait calls it on every round: it also sends what the link could not send at once
        (see ``RequestTracker.flush``).

        Raises:
            HostUnavailableError: The host died, froze, became unreachable, restarted, or
                refused the connection.
            RequestTimeoutError: The host is alive but did not answer within the request
                deadline.
            ProtocolError: It sent something that is not a valid reply.
        """
        health = self.health
        if health.failure is None:
            requests = self.requests
            requests.flush()
            if requests.channels:  # a reply whose wake-up an interruption took
                requests.receive()
            health.watch(self.link.reach, requests.outstanding)
        if health.failure is not None:
            raise self.failure_error()

    def failure_error(self) -> EnvServerError:
        """The exception that reports this host's failure (``HostHealth.error``)."""
        return self.health.error(self.requests.session is not None)

    def read(self, reply_type: type[ReplyBody], body: Any) -> ReplyBody:
        """An OK reply's ``body`` read as ``reply_type`` (from :mod:`envserver.wire.replies`).

        Raises:
            ProtocolError: If it is not one; this host is not trusted again (:meth:`invalid`).
        """
        if type(body) is reply_type:  # read already: a STEP_RAW reply, by its step layout
            return body
        try:
            return reply_type.from_wire(body)
        except ProtocolError as exc:
            raise self.invalid(f"an invalid reply: {exc}") from exc

    def invalid(
        self, what: str, error_type: type[EnvServerError] = ProtocolError
    ) -> EnvServerError:
        """Fails this host for sending ``what``, and returns the error to raise now.

        A host that broke the protocol is not trusted again: later waits on it raise
        ``HostUnavailableError`` (or recover it, with ``on_host_failure="restart"``).
        """
        self.health.fail(f"sent {what}", error_type)
        return self.failure_error()

    def error(self, reply: Reply) -> BaseException:
        """The exception to raise for an error reply (see :mod:`.error_replies`).

        A reply that says this host lost our envs fails it.
        """
        lost = loss_of(reply)
        if lost is not None:
            self.health.fail(lost)
            return self.failure_error()
        block = self.block
        return exception_of(reply, block.name, block.start, block.count)

    # ------------------------------------------------------------- closing

    def close_session_quietly(self) -> None:
        """Asks a live host to close the session held, without waiting for the reply.

        The request gets :data:`CLOSE_FLUSH_MS` to leave once the connection is closed.
        """
        if self.requests.session is not None and self.health.failure is None:
            with contextlib.suppress(Exception):
                self.requests.send(Command.CLOSE, None)
                self.linger_ms = CLOSE_FLUSH_MS

    def close(self) -> None:
        """Closes the link (pending messages get :attr:`linger_ms` to leave).

        A slab offered and not yet answered is withdrawn; one in use is unmapped once no
        connection holds its session.
        """
        if self.requests.session is not None:
            self.requests.session.withdraw_offer()
        self.let_go()
        self.link.close(self.linger_ms)
