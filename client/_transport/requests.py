"""Requests in flight: one record per request, from its send to its reply, and failed hosts.

A :class:`Pending` is made when a request is sent and holds everything about it: its id, its
command and body, the frames sent (sent again unchanged, under the same id, when a reply must
be asked for again: a host answers a repeated request from its cache), how its reply is read,
and, once it came, the reply. The reply is read by what *this* request was (a STEP sent raw
with the step layout of its session at the send), never by what its connection is now; a reply
no outstanding request is waiting for is late, and dropped. Every wait (lockstep, first-ready,
recovery) waits on these records, and nothing else keeps a request's state. Beside each one
under way, the in-flight engine keeps its :class:`Flight`: the host, and what it is for.

A :class:`Failure` is why a host is unusable: a typed state (the error its first report
raises) plus a reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from envserver.errors import EnvServerError, HostUnavailableError
from envserver.wire.bodies import RequestBody
from envserver.wire.messages import Command, Reply, Status, decode_reply
from envserver.wire.raw import StepLayout

if TYPE_CHECKING:
    from envserver.wire.channel import Channel

    from .connection import HostConnection

__all__ = ["Failure", "Flight", "Pending"]


@dataclass(eq=False, slots=True)
class Pending:
    """A request sent to a host, and its reply once it came (see the module docstring).

    Attributes:
        request_id: Its id; a retry keeps it.
        command: Its command (STEP for one sent as STEP_RAW).
        body: Its body, for a recovery that must run it anew (None for a STEP sent raw).
        frames: The frames sent: what a retry sends again.
        views: Whether the reply's arrays are read as read-only views of its frames (for a
            caller that copies them).
        layout: For a STEP sent raw, the layout its OK reply is read with (None: the codec).
        raw_env_ids: For a STEP sent raw, the envs of the block stepped (None: all).
        count: For a STEP sent raw, how many envs were stepped.
        sent_at: ``time.monotonic()`` of its send (0: not sent yet).
        reply: The reply, once it came.
        written: For a reply the lean step wrote straight into the batches: its info entries.
        reply_envelope: For a STEP sent by the lean step, the envelope of its OK reply with
            nothing said (a reply whose first frame is these bytes is written the lean way).
        channel: The channel it was posted in (None: it went on the socket).
    """

    request_id: int
    command: Command
    body: RequestBody | None
    frames: list[Any]
    views: bool = False
    layout: StepLayout | None = None
    raw_env_ids: list[int] | None = None
    count: int = 0
    sent_at: float = 0.0
    reply: Reply | None = None
    written: list[Any] | None = None
    reply_envelope: bytes | None = None
    channel: Channel | None = None

    @classmethod
    def answered(cls, command: Command, reply: Reply) -> Pending:
        """A record of a request answered without a send (recovery's report of lost envs)."""
        request_id = -1 if reply.request_id is None else reply.request_id
        return cls(request_id, command, None, [], reply=reply)

    def again(self) -> Pending:
        """A new record of this request, not yet answered, for a retry on another connection.

        Transmitted there, its frames, id and session are the same: a host that already ran it
        answers from its cache, and its reply is read as the request's own.
        """
        return Pending(
            self.request_id,
            self.command,
            self.body,
            self.frames,
            self.views,
            self.layout,
            self.raw_env_ids,
            self.count,
            reply_envelope=self.reply_envelope,
        )

    def decode(self, buffers: list[Any], allow_pickle: bool) -> Reply:
        """Reads this request's reply from its frames' buffers.

        Raises:
            EnvServerError: (``ProtocolError`` and its kin) If it is not a valid reply to it.
        """
        layout, raw = self.layout, None
        if layout is not None:
            count, env_ids, writable = self.count, self.raw_env_ids, not self.views

            def raw(frames: list[Any]) -> dict[str, Any]:
                return layout.read_reply(
                    frames, count, allow_pickle=allow_pickle, writable=writable, env_ids=env_ids
                )

        return decode_reply(buffers, allow_pickle=allow_pickle, writable=not self.views, raw=raw)

    @property
    def ok(self) -> bool:
        """Whether it was answered OK."""
        return self.reply is not None and self.reply.status is Status.OK


@dataclass(frozen=True, eq=False, slots=True)
class Flight:
    """What a request under way is for.

    Attributes:
        connection: The host it was sent to.
        command: Its command.
        body: What it asked (None: a step sent raw, whose actions the history keeps).
        ids: The envs it is for, by global index (None: those its request names, in its host's
            block: a lockstep call's).
    """

    connection: HostConnection
    command: Command
    body: RequestBody | None
    ids: np.ndarray | None = None


@dataclass(frozen=True)
class Failure:
    """Why a host is unusable: the error its first report raises, and the message.

    Attributes:
        error_type: ``HostUnavailableError`` (it died, froze, became unreachable, restarted,
            refused the connection or lost the envs), ``RequestTimeoutError`` (alive, but did
            not answer in time), ``ProtocolError`` or a kin (it sent something that is not a
            valid reply: it is not trusted again).
        message: The whole message, naming the host and its envs.
    """

    error_type: type[EnvServerError]
    message: str

    def error(self, first: bool) -> EnvServerError:
        """The exception to raise: of :attr:`error_type` the first time, else host unavailable."""
        return (self.error_type if first else HostUnavailableError)(self.message)
