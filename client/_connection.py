"""One client-side connection to an env host: a DEALER socket, a session, request ids."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable
from typing import Any

import zmq

from envserver.errors import EnvServerError, ProtocolError, rebuild_exception
from envserver.protocol import Command, Reply, decode_reply, encode_request, request_id_of

__all__ = ["HostConnection"]

logger = logging.getLogger(__name__)


class HostConnection:
    """A DEALER socket to one host, holding one session and a block of envs.

    Args:
        context: The ZeroMQ context.
        endpoint: The host's endpoint.
        start: The global index of the first env of this host's block.
        count: How many envs the block has.
        allow_pickle: Whether replies may carry pickled values (trust in the host).
        liveness: A callable that raises if the host is known to be dead (embedded hosts).
    """

    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        *,
        start: int,
        count: int,
        allow_pickle: bool,
        liveness: Callable[[], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.start = start
        self.stop = start + count
        self.allow_pickle = allow_pickle
        self.liveness = liveness
        self.session: bytes | None = None
        self.info: dict[str, Any] = {}
        # Requests sent and not yet answered, oldest first: request id -> decode as views.
        self.outstanding: dict[int, bool] = {}
        self._ids = itertools.count(1)
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        try:
            self.socket.connect(endpoint)
        except zmq.ZMQError as exc:
            self.socket.close()
            raise ValueError(
                f"invalid host endpoint {endpoint!r} ({exc}); expected e.g. "
                "tcp://sim-a:5555 or ipc:///path/to/socket"
            ) from exc

    @property
    def count(self) -> int:
        """The number of envs this host holds."""
        return self.stop - self.start

    def send(self, command: Command, body: Any, *, views: bool = False) -> int:
        """Sends a request; its reply will be returned by :meth:`receive`.

        Args:
            command: The command.
            body: Its body.
            views: Decode the reply's out-of-band arrays as read-only views of the received
                frames, for a caller that copies them anyway.

        Returns:
            The request id.
        """
        request_id = next(self._ids)
        frames = encode_request(request_id, command, self.session, body, allow_pickle=True)
        self.socket.send_multipart(frames, copy=False)
        self.outstanding[request_id] = views
        return request_id

    def abandon(self) -> None:
        """Forgets every outstanding request: their replies, if they come, are dropped."""
        self.outstanding.clear()

    def receive(self) -> list[Reply]:
        """Reads every queued reply and returns those answering outstanding requests.

        Replies to abandoned requests are dropped. A host answers requests in order, so an
        error reply without a request id (the host could not read it) answers the oldest.

        Raises:
            ProtocolError: If the host sent something that is not a valid reply.
        """
        answers = []
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return answers
            buffers = [frame.buffer for frame in frames]
            request_id = request_id_of(buffers)
            if request_id is None and self.outstanding:
                request_id = next(iter(self.outstanding))
            if request_id not in self.outstanding:
                logger.debug("dropping a late reply %s from %s", request_id, self.endpoint)
                continue
            views = self.outstanding.pop(request_id)
            try:
                reply = decode_reply(buffers, allow_pickle=self.allow_pickle, writable=not views)
            except EnvServerError as exc:
                raise type(exc)(f"host {self.endpoint} sent an invalid reply: {exc}") from exc
            answers.append(dataclasses.replace(reply, request_id=request_id))

    def error(self, reply: Reply) -> BaseException:
        """Rebuilds the exception an error reply describes, naming this host and the env.

        Args:
            reply: An error reply.

        Returns:
            The exception to raise.
        """
        body = reply.body if isinstance(reply.body, dict) else {}
        where = f"host {self.endpoint}"
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

    def close(self) -> None:
        """Closes the socket at once (pending messages are dropped)."""
        self.socket.close(linger=0)
