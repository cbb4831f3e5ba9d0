"""One client-side connection to an env host: its requests under way, their replies, liveness.

A connection composes a link (:class:`~.link.HostLink`: the socket, its monitor, whole
messages in and out) and the session it holds (:class:`~.session.HostSession`), and owns the
requests sent on them (:attr:`HostConnection.outstanding`, one :class:`~.requests.Pending` each)
and its :attr:`~HostConnection.failure`. When the link says the connection dropped (the host
died, froze or became unreachable) while a request was under way, or refused the handshake, the
connection fails with :class:`~envserver.errors.HostUnavailableError`. A host that is alive but
does not answer (a hung env step) is bounded separately, by a per-request deadline.

The host, in turn, keeps a session only while it hears from its client within the session
lease: a connection given a :class:`~.lease.Heartbeat` has it renew the lease of each session
it holds, from another thread and sockets of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import zmq

from envserver.errors import (
    EnvServerError,
    HostUnavailableError,
    MessageTooLargeError,
    ProtocolError,
    RequestTimeoutError,
)
from envserver.wire.bodies import Make, RequestBody
from envserver.wire.frames import COPY_THRESHOLD_BYTES, readable
from envserver.wire.messages import (
    Command,
    RawStepEnvelopes,
    Reply,
    encode_raw_request,
    encode_request,
    request_id_of,
)
from envserver.wire.raw import StepLayout
from envserver.wire.reach import check_resolvable
from envserver.wire.replies import MakeReply

from .error_replies import exception_of, loss_of
from .hearing import Hearing
from .lease import Heartbeat
from .link import HostLink
from .liveness import Liveness
from .requests import Failure, Pending
from .session import HostSession
from .settings import ConnectionSettings

__all__ = ["HostConnection"]

#: A typed reply body (:mod:`envserver.wire.replies`): what :meth:`HostConnection.read` reads.
ReplyBody = TypeVar("ReplyBody")

#: The failures after which a host's replies are still taken (it did not break the protocol).
_TAKEN_AFTER = (HostUnavailableError, RequestTimeoutError)

#: What the error of a host lost says in a vector env that does not recover.
_RECOVERY_HINT = (
    '; on_host_failure="restart" would make its envs anew and go on (or "restore", with their '
    'state): vector_kwargs={"on_host_failure": "restart"} for make_vec, or the RemoteVectorEnv '
    "argument"
)

logger = logging.getLogger(__name__)


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
        self.endpoint = endpoint
        self.name = name or f"host {endpoint}"
        self.settings = settings
        self.hearing = hearing
        self.start = start
        self.stop = start + count
        self.allow_pickle = settings.allow_pickle
        self._heartbeat = heartbeat
        #: The session this connection holds on its host (None before HELLO).
        self.session: HostSession | None = None
        #: The requests sent and not yet answered, oldest first, by id.
        self.outstanding: dict[int, Pending] = {}
        #: Why this host is unusable, once it is (see :meth:`fail`).
        self.failure: Failure | None = None
        self._failure_told = False  # whether a wait reported it yet
        self._ids = ids
        #: Whether to give up on the host while requests are under way.
        self.liveness = Liveness(endpoint, self.who, self.envs, settings, process, refused_fails)
        #: How long messages still queued at :meth:`close` may take to leave (0: dropped).
        self.linger_ms = 0
        #: Called when the link's socket is replaced (see :meth:`_renew`): its poller is stale.
        self.on_renew: Callable[[], None] | None = None
        try:
            check_resolvable(endpoint)
        except OSError as exc:  # a name that does not resolve: no use waiting for it
            raise HostUnavailableError(f"{self.name}: {exc}") from None
        self.link = HostLink(context, endpoint, settings.host_timeout_s, settings.curve)

    def hold(self, session: HostSession) -> None:
        """Holds ``session``: requests carry it, and (with a heartbeat) its lease is renewed."""
        self.session = session
        if self._heartbeat is not None:
            self._heartbeat.track(id(self), self.endpoint, session.id, self.link.curve)

    @property
    def draining(self) -> bool:
        """Whether the host said it drains (its envs are to move to another host)."""
        return self._heartbeat is not None and self._heartbeat.draining(id(self))

    def make_body(self, body: Make) -> Make:
        """A MAKE body for this host, offering it a new observation slab if it shares memory.

        The offer lasts until :meth:`use_layout` reads the reply (or :meth:`close`).
        """
        if not self.settings.shared_memory:
            return body
        return dataclasses.replace(body, obs_slab=self.session.offer_slab())

    def use_layout(self, made: MakeReply, layout: StepLayout | None) -> None:
        """Steps this host's envs with STEP_RAW if its MAKE reply offered ``layout`` itself.

        Their observations come in the slab offered by :meth:`make_body` if the host took it
        (see ``HostSession.agree``).

        Raises:
            ProtocolError: If the host took the slab at a size the layout does not have.
        """
        try:
            self.session.agree(made, layout, self.count)
        except ProtocolError as exc:
            raise self.invalid(f"an invalid MAKE reply: {exc}") from exc

    def let_go(self) -> None:
        """Holds no session any more: requests carry none, and its lease is no longer renewed.

        The host keeps the session until it is closed or its lease runs out.
        """
        self.session = None
        if self._heartbeat is not None:
            self._heartbeat.untrack(id(self))

    @property
    def count(self) -> int:
        """The number of envs this host holds."""
        return self.stop - self.start

    @property
    def who(self) -> str:
        """The host and its envs, as failures name them: ``host X (envs 0-3)``."""
        return f"{self.name} ({self.envs})"

    @property
    def envs(self) -> str:
        """The env indices this host holds, for messages."""
        last = self.stop - 1
        return f"env {self.start}" if last == self.start else f"envs {self.start}-{last}"

    def read_events(self) -> None:
        """Takes in what the link's monitor reported: connections made, lost and refused."""
        link = self.link
        if link.read_events():
            self.liveness.reached()
        if link.cut:  # an event cut by an interruption: what the link did is not known
            self._renew()

    # ------------------------------------------------------------- failure

    @property
    def failed(self) -> bool:
        """Whether this host is unusable (see :attr:`failure`)."""
        return self.failure is not None

    def fail(self, reason: str, error_type: type[EnvServerError] = HostUnavailableError) -> None:
        """Marks this host unusable for ``reason`` (the host and its envs are named before it).

        The first wait that reports it raises ``error_type``; later ones
        ``HostUnavailableError`` (or recover it, with ``on_host_failure="restart"``). An earlier
        failure stays: it is the cause.
        """
        if self.failure is None:
            self.failure = Failure(error_type, f"{self.who} {reason}")

    def failure_error(self) -> EnvServerError:
        """The exception that reports :attr:`failure` (see :meth:`fail`).

        A host lost while it held envs, in a vector env that does not recover, says how it
        could have gone on.
        """
        first, self._failure_told = not self._failure_told, True
        failure = self.failure
        lost = failure.error_type is HostUnavailableError and self.session is not None
        if lost and not self.settings.recovers:
            failure = dataclasses.replace(failure, message=failure.message + _RECOVERY_HINT)
        return failure.error(first)

    def check(self) -> None:
        """Raises if this host has failed, or fails it now for what it did or did not do.

        A wait calls it on every round: it also sends what the link could not send at once
        (see :meth:`_send_left`).

        Raises:
            HostUnavailableError: The host died, froze, became unreachable, restarted, or
                refused the connection.
            RequestTimeoutError: The host is alive but did not answer within the request
                deadline.
            ProtocolError: It sent something that is not a valid reply.
        """
        if self.failure is None:
            self._send_left()
            self._watch()
        if self.failure is not None:
            raise self.failure_error()

    def _watch(self) -> None:
        """Fails this host if its connection, its process or the request deadline says so."""
        reach = self.link.reach
        reach.diagnose()
        outstanding = self.outstanding
        oldest = min(p.sent_at for p in outstanding.values()) if outstanding else None
        if self.failure is None:
            self.failure = self.liveness.verdict(reach, oldest)

    # ------------------------------------------------------------- requests

    def prepare(
        self, command: Command, body: RequestBody | None, *, views: bool = False
    ) -> Pending:
        """Encodes a request under a new id without sending it (see :meth:`transmit`).

        A STEP goes as STEP_RAW when this host's session has a step layout and the actions fit
        it exactly (see :mod:`envserver.wire.raw`); otherwise as it is.

        The request owns its frames: a frame ZeroMQ sends without a copy (one of
        :data:`~envserver.wire.frames.COPY_THRESHOLD_BYTES` or more) is copied here, the others
        are copied by the send, so the caller may change its arrays once it is sent (and a
        retry sends the very same values).

        Args:
            command: The command.
            body: Its body (None: a command without one).
            views: Read the reply's arrays as read-only views of its frames, for a caller that
                copies them anyway.

        Raises:
            HostUnavailableError: If this host has failed.
            MessageTooLargeError: If the request is over the host's bound, which would make its
                ZeroMQ drop the connection without a word.
        """
        if self.failure is not None:
            raise self.failure_error()
        request_id = next(self._ids)
        session = self.session
        session_id = None if session is None else session.id
        layout = None if session is None else session.step_layout
        pending = None
        if command is Command.STEP and layout is not None:
            env_ids = body.env_ids
            count = self.count if env_ids is None else len(env_ids)
            raw = layout.request_frames(body.actions, count, env_ids)
            if raw is not None:
                frames = encode_raw_request(request_id, session_id, raw)
                env_ids = None if env_ids is None else list(env_ids)
                pending = Pending(request_id, command, None, frames, views, layout, env_ids, count)
        if pending is None:
            wire = None if body is None else body.to_wire()
            frames = encode_request(request_id, command, session_id, wire, allow_pickle=True)
            pending = Pending(request_id, command, body, frames, views)
        pending.frames = [
            f
            if isinstance(f, bytes) or memoryview(f).nbytes < COPY_THRESHOLD_BYTES
            else np.array(f)
            for f in pending.frames
        ]
        bound = None if session is None else session.max_message_bytes
        if bound is not None:
            size = sum([memoryview(frame).nbytes for frame in pending.frames])
            if size > bound:
                raise MessageTooLargeError(
                    f"a {command.name} request of {size} bytes for {self.name} is over "
                    f"its bound of {bound} bytes (envserver serve --max-message-bytes)"
                )
        return pending

    def prepare_raw(self, frames: list[Any], envelopes: RawStepEnvelopes) -> Pending:
        """Encodes a STEP_RAW request for this host's whole block, under a new id.

        The lean step's encoding (``RawStep``): no checks but the caller's.

        Args:
            frames: One per action leaf (``StepLayout.action_arrays``, this block's rows). A
                frame ZeroMQ sends without a copy must not change while the request is under
                way (a retry sends it again).
            envelopes: Packs the request's envelope and its OK reply's.
        """
        request_id = next(self._ids)
        session = self.session
        envelope, reply_envelope = envelopes.of(request_id, session.id)
        return Pending(
            request_id,
            Command.STEP,
            None,
            [envelope, *frames],
            False,
            session.step_layout,
            None,
            self.stop - self.start,
            reply_envelope=reply_envelope,
        )

    def transmit(self, pending: Pending, sent_at: float | None = None) -> Pending:
        """Sends a prepared request; its reply will be taken into it (see :meth:`receive`).

        It is outstanding from before its first frame leaves: a send interrupted half-way is
        finished by the writer (``MessageWriter``) before anything else goes, or by the wait.

        Args:
            pending: What :meth:`prepare` (or :meth:`prepare_raw`) returned.
            sent_at: ``time.monotonic()`` now, from a caller who read the monitor events just
                before (``HostPool.read_monitors``); None reads this host's.
        """
        if sent_at is None:
            if readable(self.link.monitor):  # a loss already reported must not be dated after this
                self.read_events()
            sent_at = time.monotonic()
        pending.sent_at = sent_at
        self.outstanding[pending.request_id] = pending
        self._send(pending.frames)
        return pending

    def send(self, command: Command, body: RequestBody | None, *, views: bool = False) -> Pending:
        """Prepares and sends a request (see :meth:`prepare` and :meth:`transmit`)."""
        return self.transmit(self.prepare(command, body, views=views))

    def retry(self, pending: Pending) -> Pending:
        """Sends a request of another connection to this host's session again, unchanged.

        Its frames, id and session are the same: a host that already ran it answers from its
        cache, and its reply is read as the request's own.

        Returns:
            The record of the request on this connection.
        """
        return self.transmit(pending.again())

    def settle(self) -> None:
        """Finishes what an interrupted send or receive left on this connection.

        The rest of a send is sent (on a new socket if it was cut: see :meth:`_renew`), a
        reply received and not yet taken is taken, a message cut by an interrupted receive is
        dropped, and the requests whose replies were lost are asked again.
        """
        self._send_left()
        self.receive()

    def _send_left(self) -> None:
        """Sends what the link's writer still holds.

        Messages the socket could not take at once (no peer yet, or none any more: the host
        refused the handshake), and what an interrupted send left (on a new socket if it was
        cut: see :meth:`_renew`).
        """
        link = self.link
        if link.cut:
            self._renew()
        elif not link.writer.idle:
            link.writer.flush()

    def _send(self, frames: list[Any]) -> None:
        """Sends one message, on a new socket if a send was cut short on this one."""
        writer = self.link.writer
        if writer.cut:
            self._renew()
            writer = self.link.writer
        try:
            writer.send(frames)  # never blocks: what the socket cannot take waits in the writer
        except zmq.Again:  # cut half-way: libzmq dropped it, the requests go again anew
            self._renew()

    def _renew(self) -> None:
        """Renews a link that a send left in the middle of a message, and asks again.

        Also a link whose monitor lost an event to an interruption (it may have said the
        connection dropped). Replies still on their way to the old socket die with it
        (:meth:`HostLink.renew`): every outstanding request is sent again, unchanged, on the new
        socket, oldest first, and the host answers those it ran from its cache. The session is
        the host's, not the socket's: it goes on.
        """
        logger.info("%s: a send or an event was cut off by an interruption: new socket", self.name)
        link = self.link
        link.renew()
        if self.on_renew is not None:
            self.on_renew()
        for pending in self.outstanding.values():
            pending.sent_at = time.monotonic()
            link.writer.send(pending.frames)

    def abandon(self) -> None:
        """Forgets every outstanding request: their replies, if they come, are dropped."""
        self.outstanding.clear()

    # ------------------------------------------------------------- replies

    def receive(self) -> None:
        """Takes every queued reply into the request it answers (see :meth:`take`)."""
        reader = self.link.reader
        while True:
            try:
                frames = reader.next(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.take(frames)
            reader.release()
        if reader.lost:
            self._ask_again()

    def await_reply(self, pending: Pending) -> bool:
        """Waits for ``pending``'s reply, while messages keep coming within ``AWAIT_REPLY_MS``.

        One blocking receive at a time, the cheapest wait there is; the caller watches
        liveness. Other replies that come meanwhile are taken into their own requests.

        Returns:
            Whether ``pending`` is answered (False: nothing came in time, or the host failed).
        """
        reader = self.link.reader
        while pending.reply is None and self.failure is None:
            frames = self.next_message()
            if frames is None:
                return False
            self.take(frames)
            reader.release()
        return pending.reply is not None

    def next_message(self) -> list[zmq.Frame] | None:
        """The next message, waiting up to ``AWAIT_REPLY_MS`` (None: none came).

        It stays held until ``reader.release()`` (see ``MessageReader``): whoever reads it
        releases it once its reply is taken (:meth:`take`, or the lean step's write). A reply
        lost to an interrupted receive is asked for again first.
        """
        reader = self.link.reader
        try:
            frames = reader.next()  # blocks up to the socket's RCVTIMEO
        except zmq.Again:
            frames = None
        if reader.lost:
            self._ask_again()
        return frames

    def take(self, frames: list[zmq.Frame]) -> None:
        """Takes a message into the outstanding request it answers; drops a late one.

        A host answers requests in order, so an error reply without a request id (the host
        could not read the request) answers the oldest. A message that is not a valid reply to
        its request fails this host (:attr:`failure`): it is not trusted again, and what else
        it sends is dropped.
        """
        if self.failure is not None and self.failure.error_type not in _TAKEN_AFTER:
            return  # a host that broke the protocol is not trusted: what it sends is dropped
        buffers = [frame.buffer for frame in frames]
        request_id = request_id_of(buffers)
        if request_id is None and self.outstanding:
            request_id = next(iter(self.outstanding))
        pending = self.outstanding.get(request_id)
        if pending is None:
            logger.debug("dropping a late reply %s from %s", request_id, self.endpoint)
            return
        try:
            reply = pending.decode(buffers, self.allow_pickle)
        except EnvServerError as exc:
            self.fail(f"sent an invalid reply: {exc}", type(exc))
            return
        if reply.request_id != request_id:  # an error reply without one: the oldest's
            reply = dataclasses.replace(reply, request_id=request_id)
        self.answer(pending, reply)

    def answer(self, pending: Pending, reply: Reply, written: list[Any] | None = None) -> None:
        """Records ``reply`` as ``pending``'s (``written``: the lean step wrote it already)."""
        pending.written = written
        pending.reply = reply
        del self.outstanding[pending.request_id]
        if reply.said is not None and self.hearing is not None:
            self.hearing.heard(self.name, self.start, reply.said)

    def _ask_again(self) -> None:
        """Sends again the requests whose replies an interrupted receive lost.

        The host answers each from its cache (it keeps the replies of as many requests as
        this session may have under way: MAKE's ``"retry_window"``). A lost reply whose id was
        lost too may be any outstanding request's: all are asked again, and the replies that
        come twice are dropped as late.
        """
        lost = self.link.reader.lost
        while lost:
            request_id = lost[0]
            again = list(self.outstanding.values()) if request_id is None else []
            if request_id in self.outstanding:
                again = [self.outstanding[request_id]]
            for pending in again:
                logger.info(
                    "the reply to request %d from %s was cut off by an interruption: asked again",
                    pending.request_id,
                    self.name,
                )
                self._send(pending.frames)
            del lost[0]

    def read(self, reply_type: type[ReplyBody], body: Any) -> ReplyBody:
        """An OK reply's ``body`` read as ``reply_type`` (from :mod:`envserver.wire.replies`).

        Raises:
            ProtocolError: If it is not one; this host is not trusted again (:meth:`invalid`).
        """
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
        self.fail(f"sent {what}", error_type)
        return self.failure_error()

    def error(self, reply: Reply) -> BaseException:
        """The exception to raise for an error reply (see :mod:`.error_replies`).

        A reply that says this host lost our envs fails it.
        """
        lost = loss_of(reply)
        if lost is not None:
            self.fail(lost)
            return self.failure_error()
        return exception_of(reply, self.name, self.start, self.count)

    def close(self) -> None:
        """Closes the link (pending messages get :attr:`linger_ms` to leave).

        A slab offered and not yet answered is withdrawn; one in use is unmapped once no
        connection holds its session.
        """
        if self.session is not None:
            self.session.withdraw_offer()
        self.let_go()
        self.link.close(self.linger_ms)
