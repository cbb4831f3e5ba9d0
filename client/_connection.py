"""One client-side connection to an env host: a DEALER socket, a session, request ids, liveness.

Liveness comes from ZeroMQ's own heartbeats (ZMTP PING/PONG): libzmq's I/O thread answers them
even while the host's Python thread is busy in a long ``step``, and they stop when the host dies,
is frozen (SIGSTOP) or becomes unreachable, at which point libzmq drops the connection. A socket
monitor reports that drop (and refused security handshakes) to the connection, which then fails
the requests waiting on it with :class:`~envserver.errors.HostUnavailableError`. A host that is
alive but does not answer (a hung env step) is bounded separately, by a per-request deadline.

The host, in turn, keeps a session only while it hears from its client within the session
lease: a connection given a :class:`~envserver.client._lease.Heartbeat` has it renew the lease
of each session it holds, from another thread and sockets of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from envserver.errors import (
    EnvServerError,
    HostUnavailableError,
    MessageTooLargeError,
    ProtocolError,
    RequestTimeoutError,
    rebuild_exception,
)
from envserver.wire.endpoints import client_socket
from envserver.wire.frames import COPY_THRESHOLD_BYTES, readable, recv_frames, send_frames
from envserver.wire.messages import (
    Command,
    Reply,
    Status,
    decode_reply,
    encode_raw_request,
    encode_request,
    request_id_of,
)
from envserver.wire.raw import StepLayout
from envserver.wire.reach import MONITORED_EVENTS, Reachability, check_resolvable
from envserver.wire.slab import SlabOffer

from ._hearing import Hearing
from ._lease import Heartbeat

__all__ = ["HostConnection", "Prepared"]

#: Error types by which a host says that the envs of this session are gone.
_LOSS_TYPES = frozenset({"UnknownSessionError", "HostUnavailableError"})

logger = logging.getLogger(__name__)

#: How often a wait looks whether a local host's process exited (it also fails the socket).
PROCESS_CHECK_INTERVAL_S = 0.1
#: The longest :meth:`HostConnection.await_reply` blocks (the socket's receive timeout).
AWAIT_REPLY_MS = 50
#: After how many seconds without reaching a host a first warning says so (then at 2x, 4x...).
PROGRESS_FIRST_S = 5.0


class Prepared(NamedTuple):
    """A request encoded by :meth:`HostConnection.prepare`, to be sent by ``transmit``."""

    request_id: int
    frames: list[Any]
    raw: int | list[int] | None  # a STEP sent raw: all envs (their number) or which; else None


class HostConnection:
    """A DEALER socket to one host, holding one session and a block of envs.

    Args:
        context: The ZeroMQ context.
        endpoint: The host's endpoint.
        start: The global index of the first env of this host's block.
        count: How many envs the block has.
        allow_pickle: Whether replies may carry pickled values (trust in the host).
        liveness: A callable that raises if the host process is known to have exited, waiting
            up to the given seconds for it (local hosts), for a more precise error.
        host_timeout_s: How long a connected host may stay silent (no heartbeat answered) or
            unreachable before it counts as failed.
        connect_timeout_s: How long a host may take to accept the first connection.
        request_timeout_s: How long a live host may take to answer a request (None: no bound).
        curve: CURVE keys ``(server_public, client_public, client_secret)``, or None.
        ids: Where request ids come from; shared by the connections that replace one another,
            so that a retried request keeps its id and a new one never reuses an old id.
        heartbeat: Renews the lease of the session this connection holds, while it holds one.
        hearing: Takes what the envs said, from the replies that carry it.
        name: How messages name the host (default: ``host ENDPOINT``; ``local host N``).
        shared_memory: Offer the host a slab for its observations at MAKE (a host on this
            machine: see :mod:`envserver.wire.slab`).
    """

    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        *,
        start: int,
        count: int,
        allow_pickle: bool,
        liveness: Callable[[float], None] | None = None,
        host_timeout_s: float = 5.0,
        connect_timeout_s: float = 60.0,
        request_timeout_s: float | None = None,
        curve: tuple[bytes, bytes, bytes] | None = None,
        ids: Iterator[int] | None = None,
        heartbeat: Heartbeat | None = None,
        hearing: Hearing | None = None,
        name: str | None = None,
        shared_memory: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.name = name or f"host {endpoint}"
        self.hearing = hearing
        self.start = start
        self.stop = start + count
        self.allow_pickle = allow_pickle
        self.liveness = liveness
        self.host_timeout_s = host_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._session: bytes | None = None
        self._curve = curve
        self._heartbeat = heartbeat
        self.info: dict[str, Any] = {}
        # Requests sent and not yet answered, oldest first: id -> (decode as views, the envs
        # of a STEP sent raw or None (see ``Prepared.raw``), sent at).
        self.outstanding: dict[int, tuple[bool, int | list[int] | None, float]] = {}
        #: How STEP requests go raw to this host's session (None: as STEP); see ``use_layout``.
        self.step_layout: StepLayout | None = None
        self.shared_memory = shared_memory
        self._slab_offer: SlabOffer | None = None  # offered in the MAKE not yet answered
        self.failed: str | None = None  # why this host is unusable, once it is
        self._ids = ids if ids is not None else itertools.count(1)
        self._process_check_due = 0.0
        #: How long messages still queued at :meth:`close` may take to leave (0: dropped).
        self.linger_ms = 0
        self.reach = Reachability(endpoint, uses_curve=curve is not None)
        self._next_progress_s = PROGRESS_FIRST_S  # when to say again that it is not reached
        self.socket = client_socket(context, endpoint, curve)
        heartbeat_ms = max(100, int(host_timeout_s * 1000 / 5))
        timeout_ms = max(heartbeat_ms, int(host_timeout_s * 1000))
        self.socket.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
        self.socket.setsockopt(zmq.HEARTBEAT_TTL, min(6_553_500, timeout_ms // 100 * 100))
        self.socket.setsockopt(zmq.RCVTIMEO, AWAIT_REPLY_MS)  # await_reply's bound
        self.monitor = self.socket.get_monitor_socket(MONITORED_EVENTS)
        try:
            check_resolvable(endpoint)
            self.socket.connect(endpoint)
        except OSError as exc:  # a name that does not resolve: no use waiting for it
            self.close()
            raise HostUnavailableError(f"{self.name}: {exc}") from None
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(
                f"invalid host endpoint {endpoint!r} ({exc}); expected e.g. "
                "tcp://sim-a:5555 or ipc:///path/to/socket"
            ) from exc

    @property
    def session(self) -> bytes | None:
        """The session this connection holds on its host (None before HELLO)."""
        return self._session

    def hold(self, session: bytes) -> None:
        """Holds ``session``: requests carry it, and (with a heartbeat) its lease is renewed."""
        self._session = session
        if self._heartbeat is not None:
            self._heartbeat.track(id(self), self.endpoint, session, self._curve)

    def make_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """A MAKE body for this host, offering it a new observation slab if it shares memory.

        The offer lasts until :meth:`use_layout` reads the reply (or :meth:`close`).
        """
        if self._slab_offer is not None:
            self._slab_offer.withdraw()
        self._slab_offer = SlabOffer.make() if self.shared_memory else None
        if self._slab_offer is None:
            return body
        return {**body, "obs_slab": self._slab_offer.name}

    def use_layout(self, made: dict[str, Any], layout: StepLayout | None) -> None:
        """Steps this host's envs with STEP_RAW if its MAKE reply offered ``layout`` itself.

        Their observations come in the slab offered by :meth:`make_body` if the host took it.

        Args:
            made: The MAKE reply.
            layout: The layout the client derives from the vector env's single spaces.

        Raises:
            ProtocolError: If the host took the slab at a size the layout does not have.
        """
        offered = made.get("step_layout")
        self.step_layout = layout if layout is not None and offered == layout.describe() else None
        offer, self._slab_offer = self._slab_offer, None
        if offer is None:
            return
        size = made.get("obs_slab")
        if size is None or self.step_layout is None:
            offer.withdraw()
            return
        try:
            self.step_layout = self.step_layout.slab_for_client(offer, size, self.count)
        except ProtocolError as exc:
            raise self.invalid(f"an invalid MAKE reply: {exc}") from exc

    def let_go(self) -> None:
        """Holds no session any more: requests carry none, and its lease is no longer renewed.

        The host keeps the session until it is closed or its lease runs out.
        """
        self._session = None
        if self._heartbeat is not None:
            self._heartbeat.untrack(id(self))

    @property
    def max_message_bytes(self) -> int | None:
        """The host's bound on a request's size, as its HELLO reply said (None: not said)."""
        bound = self.info.get("max_message_bytes")
        return bound if isinstance(bound, int) else None

    @property
    def count(self) -> int:
        """The number of envs this host holds."""
        return self.stop - self.start

    @property
    def envs(self) -> str:
        """The env indices this host holds, for messages."""
        last = self.stop - 1
        return f"env {self.start}" if last == self.start else f"envs {self.start}-{last}"

    def read_events(self) -> None:
        """Takes in what the socket monitor reported: connections made, lost and refused."""
        while readable(self.monitor):
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            was_up = self.reach.up
            self.reach.on_event(event["event"], event["value"])
            if self.reach.up and not was_up and self._next_progress_s > PROGRESS_FIRST_S:
                logger.info("host %s answered", self.endpoint)

    def check(self) -> None:
        """Raises if this host has failed, or failed the requests waiting on it.

        Raises:
            HostUnavailableError: The host died, froze, became unreachable, restarted, or
                refused the connection.
            RequestTimeoutError: The host is alive but did not answer within the request
                deadline.
        """
        if self.failed is not None:
            raise HostUnavailableError(self.failed)
        reach = self.reach
        reach.diagnose()
        if reach.refusal is not None:
            self._fail(reach.refusal)
        if not self.outstanding:
            return
        now = time.monotonic()
        if now >= self._process_check_due:  # a system call: not on every poll of a busy wait
            self._process_check_due = now + PROCESS_CHECK_INTERVAL_S
            self._check_process(0.0)
        oldest = min(sent for *_, sent in self.outstanding.values())
        if reach.lost_at is not None and reach.lost_at >= oldest:
            self._fail(
                "lost its connection while a request was under way (it died, froze or became "
                "unreachable)"
            )
        if not reach.up and reach.down_since is not None:
            bound = self.host_timeout_s if reach.ever_up else self.connect_timeout_s
            waited = now - reach.down_since
            if waited > bound:
                what = "unreachable" if reach.ever_up else "could not be reached"
                self._fail(f"{what} for {bound:g} s: {reach.why_silent()}")
            # Remote hosts only: a local one is starting, and its process is watched.
            if not reach.ever_up and waited > self._next_progress_s and self.liveness is None:
                self._next_progress_s *= 2
                logger.warning(
                    "host %s not reached after %.0f s: %s; still trying (up to %g s, "
                    "connect_timeout_s)",
                    self.endpoint,
                    waited,
                    reach.why_silent(),
                    bound,
                )
        if self.request_timeout_s is not None and now - oldest > self.request_timeout_s:
            self.failed = (
                f"{self.name} ({self.envs}) is alive but has not answered for "
                f"{self.request_timeout_s:g} s: an env may hang in step or reset"
            )
            raise RequestTimeoutError(self.failed)

    def _check_process(self, grace_s: float) -> None:
        if self.liveness is None:
            return
        try:
            self.liveness(grace_s)
        except HostUnavailableError as exc:
            self.failed = f"{exc}\n(that host held {self.envs})"
            raise HostUnavailableError(self.failed) from None

    def _fail(self, reason: str) -> None:
        self._check_process(1.0)  # a local host that exited: say so, with its status and log
        self.failed = f"{self.name} ({self.envs}) {reason}"
        raise HostUnavailableError(self.failed)

    def prepare(self, command: Command, body: Any, request_id: int | None = None) -> Prepared:
        """Encodes a request (with a new id unless one is given) without sending it.

        A STEP goes as STEP_RAW when this host's session has a step layout and the actions fit
        it exactly (see :mod:`envserver.wire.raw`); otherwise as it is.

        The request owns its frames once sent: a frame ZeroMQ sends without a copy (one of
        :data:`~envserver.wire.frames.COPY_THRESHOLD_BYTES` or more) is copied here, the others are
        copied by the send, so the caller may change its arrays once :meth:`transmit` returned.

        Raises:
            HostUnavailableError: If this host has failed.
            MessageTooLargeError: If the request is over the host's bound, which would make its
                ZeroMQ drop the connection without a word.
        """
        if self.failed is not None:
            raise HostUnavailableError(self.failed)
        if request_id is None:
            request_id = next(self._ids)
        frames = raw = None
        if command is Command.STEP and self.step_layout is not None:
            env_ids = body.get("env_ids")
            count = self.count if env_ids is None else len(env_ids)
            raw = self.step_layout.request_frames(body["actions"], count, env_ids)
            if raw is not None:
                frames = encode_raw_request(request_id, self._session, raw)
                raw = count if env_ids is None else list(env_ids)
        if frames is None:
            frames = encode_request(request_id, command, self._session, body, allow_pickle=True)
        frames = [
            f
            if isinstance(f, bytes) or memoryview(f).nbytes < COPY_THRESHOLD_BYTES
            else np.array(f)
            for f in frames
        ]
        bound = self.max_message_bytes
        if bound is not None:
            size = sum([memoryview(frame).nbytes for frame in frames])
            if size > bound:
                raise MessageTooLargeError(
                    f"a {command.name} request of {size} bytes for {self.name} is over "
                    f"its bound of {bound} bytes (envserver serve --max-message-bytes)"
                )
        return Prepared(request_id, frames, raw)

    def transmit(self, prepared: Prepared, *, views: bool = False) -> int:
        """Sends a prepared request; its reply will be returned by :meth:`receive`.

        Args:
            prepared: What :meth:`prepare` returned.
            views: Decode the reply's out-of-band arrays as read-only views of the received
                frames, for a caller that copies them anyway.

        Returns:
            The request id.
        """
        if readable(self.monitor):  # a loss already reported must not be dated after this send
            self.read_events()
        send_frames(self.socket, prepared.frames)
        self.outstanding[prepared.request_id] = (views, prepared.raw, time.monotonic())
        return prepared.request_id

    def send_raw(self, frames: list[Any], sent_at: float) -> int:
        """Sends a STEP_RAW request for this host's whole block, under a new id.

        The lean step's send (``RawStep``): no checks but the caller's, who read the monitor
        events just before (``HostPool.read_monitors``), so that a loss already reported is
        not dated after this send.

        Args:
            frames: One per action leaf (``StepLayout.action_arrays``, this block's rows). A
                frame ZeroMQ sends without a copy must not change until it is sent.
            sent_at: ``time.monotonic()`` of the send.

        Returns:
            The request id.
        """
        request_id = next(self._ids)
        send_frames(self.socket, encode_raw_request(request_id, self._session, frames))
        self.outstanding[request_id] = (False, self.count, sent_at)
        return request_id

    def send(
        self, command: Command, body: Any, *, views: bool = False, request_id: int | None = None
    ) -> int:
        """Prepares and sends a request (see :meth:`prepare` and :meth:`transmit`).

        Args:
            command: The command.
            body: Its body.
            views: As for :meth:`transmit`.
            request_id: Resend under this id (a retry the host answers from its cache if it
                already ran it); a new id by default.

        Returns:
            The request id.
        """
        return self.transmit(self.prepare(command, body, request_id), views=views)

    def abandon(self) -> None:
        """Forgets every outstanding request: their replies, if they come, are dropped."""
        self.outstanding.clear()

    def receive(self) -> list[Reply]:
        """Reads every queued reply, and returns those answering outstanding requests.

        Replies to abandoned requests are dropped. A host answers requests in order, so an
        error reply without a request id (the host could not read it) answers the oldest.

        Raises:
            ProtocolError: If the host sent something that is not a valid reply.
        """
        answers: list[Reply] = []
        while True:  # every queued reply: one not owed is late, and dropped
            try:  # called when a poll found a reply: read first, ask for more after
                frames = recv_frames(self.socket, zmq.NOBLOCK)
            except zmq.Again:
                return answers
            reply = self.reply_of(frames)
            if reply is not None:
                answers.append(reply)
            if not readable(self.socket):
                return answers

    def await_reply(self) -> Reply | None:
        """Waits up to :data:`AWAIT_REPLY_MS` for a reply to an outstanding request.

        One blocking receive, the cheapest wait there is; the caller watches liveness.

        Returns:
            The reply, or None if none came in time (or none is owed).

        Raises:
            ProtocolError: If the host sent something that is not a valid reply.
        """
        while self.outstanding:
            frames = self.await_frames()
            if frames is None:
                return None
            reply = self.reply_of(frames)
            if reply is not None:
                return reply
        return None

    def await_frames(self) -> list[zmq.Frame] | None:
        """Waits up to :data:`AWAIT_REPLY_MS` for a message; its frames (None: none came)."""
        try:
            return recv_frames(self.socket)  # blocks up to the socket's RCVTIMEO
        except zmq.Again:
            return None

    def reply_of(self, frames: list[zmq.Frame]) -> Reply | None:
        """The reply a message holds, if it answers an outstanding request (None: late).

        The request is no longer outstanding once answered.

        Raises:
            ProtocolError: If the host sent something that is not a valid reply.
        """
        buffers = [frame.buffer for frame in frames]
        request_id = request_id_of(buffers)
        if request_id is None and self.outstanding:
            request_id = next(iter(self.outstanding))
        if request_id not in self.outstanding:
            logger.debug("dropping a late reply %s from %s", request_id, self.endpoint)
            return None
        views, raw, _ = self.outstanding.pop(request_id)
        read = None
        if raw is not None and self.step_layout is not None:
            layout, pickle = self.step_layout, self.allow_pickle

            def read(frames: list[Any]) -> dict[str, Any]:
                count, env_ids = (raw, None) if isinstance(raw, int) else (len(raw), raw)
                return layout.read_reply(
                    frames, count, allow_pickle=pickle, writable=not views, env_ids=env_ids
                )

        try:
            reply = decode_reply(
                buffers, allow_pickle=self.allow_pickle, writable=not views, raw=read
            )
        except EnvServerError as exc:
            raise self.invalid(f"an invalid reply: {exc}", type(exc)) from exc
        if reply.request_id != request_id:  # an error reply without one: the oldest's
            reply = dataclasses.replace(reply, request_id=request_id)
        if reply.said is not None and self.hearing is not None:
            self.hearing.heard(self.name, self.start, reply.said)
        return reply

    def invalid(
        self, what: str, error_type: type[EnvServerError] = ProtocolError
    ) -> EnvServerError:
        """Marks this host failed for sending ``what``, and returns the error to raise.

        A host that broke the protocol is not trusted again: later waits on it raise
        ``HostUnavailableError`` (or recover it, with ``on_host_failure="restart"``).
        """
        self.failed = f"{self.name} ({self.envs}) sent {what}"
        return error_type(self.failed)

    def error(self, reply: Reply) -> BaseException:
        """Rebuilds the exception an error reply describes, naming this host and the env.

        Args:
            reply: An error reply.

        Returns:
            The exception to raise.
        """
        lost = self.lost(reply)
        if lost is not None:
            self.failed = lost
            return HostUnavailableError(lost)
        body = reply.body if isinstance(reply.body, dict) else {}
        where = self.name
        env_index = body.get("env_index")
        if isinstance(env_index, int) and 0 <= env_index < self.count:
            where += f", env {self.start + env_index}"
        exc = rebuild_exception(
            str(body.get("module", "")),
            str(body.get("type", "")),
            f"{where}: {body.get('message', '')}",
            str(body.get("traceback", "")),
        )
        if not body:
            exc = ProtocolError(f"{where}: malformed error reply")
        return exc

    def lost(self, reply: Reply) -> str | None:
        """Why ``reply`` says this host lost our envs (it restarted, closed them, shuts down).

        Returns:
            The reason, for an error message; None if the reply says no such thing.
        """
        body = reply.body if isinstance(reply.body, dict) else {}
        if reply.status != Status.ERROR or body.get("type") not in _LOSS_TYPES:
            return None
        if body["type"] == "UnknownSessionError":
            reason = (
                "no longer holds this client's session: it restarted, or closed the session "
                "(this client was not heard from within its session lease, or was idle past its "
                "idle timeout)"
            )
        else:
            # The host says "this host ..."; the line names it already.
            reason = str(body.get("message", "is shutting down")).removeprefix("this host ")
        return f"{self.name} ({self.envs}) {reason}; the envs it held are lost"

    def close(self) -> None:
        """Closes the socket and its monitor (pending messages get :attr:`linger_ms` to leave).

        A slab offered and not yet answered is withdrawn; one in use is unmapped.
        """
        if getattr(self, "_slab_offer", None) is not None:
            self._slab_offer.withdraw()
        self.step_layout = None  # its slab's pages are unmapped with it
        if getattr(self, "_heartbeat", None) is not None:
            self._heartbeat.untrack(id(self))
        with contextlib.suppress(zmq.ZMQError):
            self.socket.disable_monitor()
        if hasattr(self, "monitor"):
            self.monitor.close(linger=0)
        self.socket.close(linger=self.linger_ms)
