"""One connection's requests under way: encoded, sent whole, their replies taken into them.

A :class:`RequestTracker` owns the requests a connection sent and that are not answered yet
(:attr:`~RequestTracker.outstanding`, one :class:`~.requests.Pending` each, oldest first) and
the session they carry (:attr:`~RequestTracker.session`, held by the connection). Each reply is
taken into the request it answers, read by what that request was; a late one is dropped.

A session with channels (:mod:`envserver.wire.channel`, a host on this machine: one per
request it may have under way) has its steps and resets posted there rather than sent on the
socket, one at a time per channel and only while every other request under way is in a channel
too (so the host, which serves a session's channels by id before its socket, serves the
connection's requests in the order they were sent); its replies are read from there the same
way, and one too large for a channel is asked for again on the socket.

It also gets every request answered whatever an interruption (Ctrl-C) cut: a socket left in
the middle of a message, or whose monitor lost an event, is replaced and every outstanding
request sent again on the new one (:meth:`~RequestTracker.renew`), and a reply lost to an
interrupted receive is asked for again. The host answers a repeated request from its cache.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import zmq

from envserver.errors import (
    EnvServerError,
    HostUnavailableError,
    MessageTooLargeError,
    ProtocolError,
    RequestTimeoutError,
)
from envserver.wire.bodies import RequestBody
from envserver.wire.channel import Channel
from envserver.wire.frames import COPY_THRESHOLD_BYTES, readable
from envserver.wire.messages import (
    Command,
    RawStepEnvelopes,
    Reply,
    encode_raw_request,
    encode_request,
    request_id_of,
)

from .block import HostBlock
from .health import HostHealth
from .hearing import Hearing
from .link import AWAIT_REPLY_MS, HostLink
from .requests import Pending
from .session import HostSession

__all__ = ["RequestTracker"]

#: The failures after which a host's replies are still taken (it did not break the protocol).
_TAKEN_AFTER = (HostUnavailableError, RequestTimeoutError)
#: The commands posted in a session's channel, when it has one.
_POSTED = frozenset({Command.STEP, Command.RESET})

logger = logging.getLogger(__name__)


class RequestTracker:
    """The requests under way on one connection's link (see the module docstring).

    Args:
        link: The connection's link.
        block: The host and its envs.
        health: The connection's health: a failed host is sent nothing, and one that sends
            what is not a valid reply fails.
        ids: Where request ids come from (shared by every connection of a vector env, so an id
            is never reused by a connection that replaces another).
        allow_pickle: Whether replies may carry pickled values.
        hearing: Tells the trainer what this host's envs said, or None (not told).
    """

    def __init__(
        self,
        link: HostLink,
        block: HostBlock,
        health: HostHealth,
        ids: Iterator[int],
        allow_pickle: bool,
        hearing: Hearing | None = None,
    ) -> None:
        self._link = link
        self._block = block
        self._health = health
        self._ids = ids
        self._hearing = hearing
        #: Whether replies may carry pickled values.
        self.allow_pickle = allow_pickle
        #: The session requests carry (None before HELLO; see ``HostConnection.hold``).
        self.session: HostSession | None = None
        #: The requests sent and not yet answered, oldest first, by id.
        self.outstanding: dict[int, Pending] = {}
        self._channel_held: Channel | None = None  # the channel of the message returned last

    # ------------------------------------------------------------- sends

    def prepare(
        self, command: Command, body: RequestBody | None, *, views: bool = False
    ) -> Pending:
        """Encodes a request under a new id without sending it (see :meth:`transmit`).

        A STEP goes as STEP_RAW when the session has a step layout and the actions fit it
        exactly (see :mod:`envserver.wire.raw`); otherwise as it is.

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
        session = self.session
        if self._health.failure is not None:
            raise self._health.error(session is not None)
        request_id = next(self._ids)
        session_id = None if session is None else session.id
        layout = None if session is None else session.step_layout
        pending = None
        if command is Command.STEP and layout is not None:
            env_ids = body.env_ids
            count = self._block.count if env_ids is None else len(env_ids)
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
                    f"a {command.name} request of {size} bytes for {self._block.name} is over "
                    f"its bound of {bound} bytes (envserver serve --max-message-bytes)"
                )
        return pending

    def prepare_raw(self, frames: list[Any], envelopes: RawStepEnvelopes) -> Pending:
        """Encodes a STEP_RAW request for the whole block, under a new id.

        The lean step's encoding (``RawStep``): no checks but the caller's.

        Args:
            frames: One per action leaf (``StepLayout.action_arrays``, this block's rows). A
                frame ZeroMQ sends without a copy must not change while the request is under
                way (a retry sends it again).
            envelopes: Packs the request's envelope and its OK reply's.
        """
        request_id = next(self._ids)
        session, block = self.session, self._block
        envelope, reply_envelope = envelopes.of(request_id, session.id)
        return Pending(
            request_id,
            Command.STEP,
            None,
            [envelope, *frames],
            False,
            session.step_layout,
            None,
            block.stop - block.start,
            reply_envelope=reply_envelope,
        )

    def transmit(self, pending: Pending, sent_at: float | None = None) -> Pending:
        """Sends a prepared request; its reply will be taken into it (see :meth:`receive`).

        It is outstanding from before its first frame leaves: a send interrupted half-way is
        finished by the writer (``MessageWriter``) before anything else goes, or by the wait.

        Args:
            pending: What :meth:`prepare` (or :meth:`prepare_raw`) returned.
            sent_at: ``time.monotonic()`` now, from a caller who read the monitor events just
                before (``Waits.read_monitors``); None reads this link's.
        """
        if sent_at is None:
            if readable(self._link.monitor):  # a loss already reported must not be dated after
                self.read_events()
            sent_at = time.monotonic()
        pending.sent_at = sent_at
        outstanding = self.outstanding
        outstanding[pending.request_id] = pending
        session = self.session
        channel = None if session is None else session.channel
        if channel is None or pending.command not in _POSTED:
            self._send(pending.frames)
        elif channel.busy is None and len(outstanding) == 1:  # (a lockstep call's: one)
            if channel.post(pending.frames, pending.request_id):
                pending.channel = channel
            else:
                self._send(pending.frames)
        elif not self._post_beside(pending):
            self._send(pending.frames)
        return pending

    def _post_beside(self, pending: Pending) -> bool:
        """Posts ``pending`` in a free channel if every other request under way is in one.

        Then the host, which serves a session's channels in the order of their requests' ids
        before its socket, serves the session's requests in the order sent.

        Returns:
            Whether it was posted (False: it goes on the socket).
        """
        for other in self.outstanding.values():
            if other is not pending and other.channel is None:
                return False
        for channel in self.channels:
            if channel.busy is None:
                if not channel.post(pending.frames, pending.request_id):
                    return False  # (too large for a channel)
                pending.channel = channel
                return True
        return False

    @property
    def channels(self) -> tuple[Channel, ...]:
        """The session's channels, the first one first (none: no session, or no channel)."""
        session = self.session
        if session is None or session.channel is None:
            return ()
        return (session.channel, *session.more_channels)

    def send(self, command: Command, body: RequestBody | None, *, views: bool = False) -> Pending:
        """Prepares and sends a request (see :meth:`prepare` and :meth:`transmit`)."""
        return self.transmit(self.prepare(command, body, views=views))

    # ------------------------------------------------------------- replies

    def receive(self) -> None:
        """Takes every queued reply into the request it answers (see :meth:`take`)."""
        for channel in self.channels:
            if channel.busy is None:  # nothing posted there that is not answered
                continue
            frames = self._posted(channel)
            if frames is not None:
                self.take(frames)
                self.release()
        reader = self._link.reader
        while (frames := reader.next(zmq.NOBLOCK)) is not None:
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
        health = self._health
        while pending.reply is None and health.failure is None:
            frames = self.next_message()
            if frames is None:
                return False
            self.take(frames)
            self.release()
        return pending.reply is not None

    def next_message(self) -> list[Any] | None:
        """The next message, waiting up to ``AWAIT_REPLY_MS`` (None: none came).

        From the channel or the socket. It stays held until :meth:`release` (see
        ``MessageReader``): whoever reads it releases it once its reply is taken (:meth:`take`,
        or the lean step's write). A reply lost to an interrupted receive is asked for again
        first.
        """
        reader = self._link.reader
        flags = 0  # a blocking receive, up to the socket's RCVTIMEO
        session = self.session
        channel = None if session is None else session.channel
        if channel is not None and session.more_channels:  # the oldest request's: it comes first
            oldest = next(iter(self.outstanding.values()), None)
            channel = None if oldest is None else oldest.channel
        if channel is not None and channel.busy is not None and reader.held is None:
            frames = self._posted(channel, AWAIT_REPLY_MS)
            if frames is not None:
                return frames
            if channel.busy is not None:  # none came in time: what the socket has, if anything
                flags = zmq.NOBLOCK
        frames = reader.next(flags)
        if reader.lost:
            self._ask_again()
        return frames

    def release(self) -> None:
        """The message :meth:`next_message` returned is taken: the next call reads a new one."""
        channel, self._channel_held = self._channel_held, None
        if channel is not None:
            channel.release()
        else:
            self._link.reader.release()

    def _posted(self, channel: Channel, timeout_ms: int = 0) -> list[Any] | None:
        """The reply the host posted in the channel, held; waits up to ``timeout_ms`` for it.

        None: none came. One too large for the channel is asked for again on the socket; one
        that does not fit its area fails this host.
        """
        try:
            frames = channel.await_reply(timeout_ms) if timeout_ms else channel.next()
        except ProtocolError as exc:
            self._health.fail(f"sent an invalid reply: {exc}", ProtocolError)
            return None
        if frames is None:
            return None
        if not frames:  # not in the channel: ask for it on the socket (from the retry cache)
            channel.release()
            pending = self.outstanding.get(channel.taken)
            if pending is not None:
                self._send(pending.frames)
            return None
        self._channel_held = channel
        return frames

    def take(self, frames: list[zmq.Frame]) -> None:
        """Takes a message into the outstanding request it answers; drops a late one.

        A host answers requests in order, so an error reply without a request id (the host
        could not read the request) answers the oldest. A message that is not a valid reply to
        its request fails this host (its health): it is not trusted again, and what else it
        sends is dropped.
        """
        health = self._health
        if health.failure is not None and health.failure.error_type not in _TAKEN_AFTER:
            return  # a host that broke the protocol is not trusted: what it sends is dropped
        buffers = [frame.buffer for frame in frames]
        request_id = request_id_of(buffers)
        if request_id is None and self.outstanding:
            request_id = next(iter(self.outstanding))
        pending = self.outstanding.get(request_id)
        if pending is None:
            logger.debug("dropping a late reply %s from %s", request_id, self._block.endpoint)
            return
        try:
            reply = pending.decode(buffers, self.allow_pickle)
        except EnvServerError as exc:
            health.fail(f"sent an invalid reply: {exc}", type(exc))
            return
        if reply.request_id != request_id:  # an error reply without one: the oldest's
            reply = dataclasses.replace(reply, request_id=request_id)
        self.answer(pending, reply)

    def answer(self, pending: Pending, reply: Reply, written: list[Any] | None = None) -> None:
        """Records ``reply`` as ``pending``'s (``written``: the lean step wrote it already)."""
        pending.written = written
        pending.reply = reply
        del self.outstanding[pending.request_id]
        if reply.said is not None and self._hearing is not None:
            self._hearing.heard(self._block.name, self._block.start, reply.said)

    # ------------------------------------------------------------- interruptions

    def read_events(self) -> None:
        """Takes in what the link's monitor reported: connections made, lost and refused.

        An event cut by an interruption leaves what the link did unknown: it is renewed.
        """
        link = self._link
        if link.read_events():
            self._health.liveness.reached()
        if link.cut:
            self.renew()

    def settle(self) -> None:
        """Finishes what an interrupted send or receive left on this link.

        The rest of a send is sent (on a new socket if it was cut: see :meth:`renew`), a
        reply received and not yet taken is taken, a message cut by an interrupted receive is
        dropped, and the requests whose replies were lost are asked again.
        """
        self.flush()
        self.receive()

    def flush(self) -> None:
        """Sends what the link's writer still holds.

        Messages the socket could not take at once (no peer yet, or none any more: the host
        refused the handshake), and what an interrupted send left (on a new socket if it was
        cut: see :meth:`renew`).
        """
        link = self._link
        for channel in self.channels:
            channel.flush()
        if link.cut:
            self.renew()
        elif not link.writer.idle:
            link.writer.flush()

    def renew(self) -> None:
        """Renews a link that a send left in the middle of a message, and asks again.

        Also a link whose monitor lost an event to an interruption (it may have said the
        connection dropped). Replies still on their way to the old socket die with it
        (:meth:`HostLink.renew`): every outstanding request is sent again, unchanged, on the new
        socket, oldest first, and the host answers those it ran from its cache. The session is
        the host's, not the socket's: it goes on.
        """
        logger.info(
            "%s: a send or an event was cut off by an interruption: new socket", self._block.name
        )
        link = self._link
        link.renew()
        for pending in self.outstanding.values():
            pending.sent_at = time.monotonic()
            link.writer.send(pending.frames)

    def _send(self, frames: list[Any]) -> None:
        """Sends one message, on a new socket if a send was cut short on this one."""
        writer = self._link.writer
        if writer.cut:
            self.renew()
            writer = self._link.writer
        try:
            writer.send(frames)  # never blocks: what the socket cannot take waits in the writer
        except zmq.Again:  # cut half-way: libzmq dropped it, the requests go again anew
            self.renew()

    def _ask_again(self) -> None:
        """Sends again the requests whose replies an interrupted receive lost.

        The host answers each from its cache (it keeps the replies of as many requests as
        this session may have under way: MAKE's ``"retry_window"``). A lost reply whose id was
        lost too may be any outstanding request's: all are asked again, and the replies that
        come twice are dropped as late.
        """
        lost = self._link.reader.lost
        outstanding = self.outstanding
        while lost:
            request_id = lost[0]
            again = list(outstanding.values()) if request_id is None else []
            if request_id in outstanding:
                again = [outstanding[request_id]]
            for pending in again:
                logger.info(
                    "the reply to request %d from %s was cut off by an interruption: asked again",
                    pending.request_id,
                    self._block.name,
                )
                self._send(pending.frames)
            del lost[0]
