"""The lean lockstep step: STEP_RAW to every host, the replies written straight into the batches.

A lockstep step takes this path when every host's session steps raw (``StepLayout``), no env
is lost and the actions fit the layout exactly; otherwise, and for whatever it does not expect,
the general path (``HostPool.gather``) takes over. Per host and step it does what a protocol-free
client must do anyway, and little more: one send of the envelope and the host's rows of each
action array; one blocking receive of the reply; one comparison of the reply's envelope with
the one an OK reply with nothing said has; the frames' lengths and flag bytes checked; the
values copied into the vector env's batches.

Anything else hands over, with nothing lost: a reply that does not come within
``AWAIT_REPLY_MS`` (the general wait watches the hosts' liveness, recovers failed ones and
keeps the deadline), a reply with another envelope (decoded as usual: what the envs said, a late
reply, an error, a lost session), a wait with a deadline nearer than that.
"""

from __future__ import annotations

import time
from typing import Any

from envserver.errors import EnvServerError
from envserver.wire.batching import select
from envserver.wire.messages import MAX_ENVELOPE_BYTES, Command, Status, raw_reply_envelope

from ._connection import HostConnection
from ._env_results import EnvResults
from ._pool import IN_ORDER_WAIT_S, HostPool
from ._results import Request, add_infos

__all__ = ["RawStep"]


class RawStep:
    """The lean step of one vector env: its sends, and the replies it writes (module docstring).

    Args:
        pool: The hosts.
        results: The batches replies are written into.
        action_space: One env's action space.
    """

    def __init__(self, pool: HostPool, results: EnvResults, action_space: Any) -> None:
        self._pool = pool
        self._results = results
        self._action_space = action_space
        self._num_envs = len(results.rewards)
        #: The requests sent and not yet answered, in host order: connection and request id.
        self.sent: list[tuple[HostConnection, int]] = []
        self._actions: Any = None  # the batch sent, for the general wait's requests

    def send(self, actions: Any) -> bool:
        """Sends a step of every env to every host raw, or nothing.

        Args:
            actions: The batched actions, which the caller will not change (a large frame is
                sent from it without a copy).

        Returns:
            Whether it was sent; if not, nothing was (the caller steps the general way).
        """
        layout = self._pool.step_layout
        arrays = None if layout is None else layout.action_arrays(actions, self._num_envs)
        if arrays is None:
            return False
        connections = self._pool.connections
        row_bytes = sum(a.nbytes for a in arrays) // self._num_envs
        if not all(_fits(c, row_bytes) for c in connections):
            return False
        self._pool.read_monitors()
        now = time.monotonic()
        self.sent = [
            (c, c.send_raw([a[c.start : c.stop] for a in arrays], now)) for c in connections
        ]
        self._actions = actions
        return True

    def receive(self, infos: Any, deadline: float | None) -> Any:
        """Receives the replies host after host, while each comes soon, and writes them.

        The hosts answered are taken off :attr:`sent`; those left are the general wait's
        (:meth:`requests`). A reply that is not a plain OK one is decoded; an error is kept in
        the pool for that wait.

        Args:
            infos: The step's infos so far.
            deadline: ``time.monotonic()`` the step's wait ends at (None: none).

        Returns:
            The infos, with the answered hosts' added.

        Raises:
            ProtocolError: If a host sent a reply that does not fit (it is not trusted again).
        """
        results = self._results
        into = self._pool.step_layout.reply_views(
            results.observations, results.rewards, results.flags
        )
        if into is None or self._pool.has_early:
            return infos
        while self.sent:
            if deadline is not None and deadline - time.monotonic() <= IN_ORDER_WAIT_S:
                return infos
            connection, request_id = self.sent[0]
            taken = self._take(connection, request_id, into, infos)
            if taken is None:
                return infos
            infos = taken
            del self.sent[0]
        self._pool.tell()
        return infos

    def _take(
        self, connection: HostConnection, request_id: int, into: list[memoryview], infos: Any
    ) -> Any | None:
        """Writes ``connection``'s reply to ``request_id``; the infos, or None to hand over."""
        expected = raw_reply_envelope(request_id)
        while True:
            frames = connection.await_frames()
            if frames is None:
                return None
            if frames[0].bytes == expected:
                connection.outstanding.pop(request_id, None)
                try:
                    entries = connection.step_layout.write_reply(
                        frames[1:],
                        into,
                        connection.start,
                        connection.count,
                        allow_pickle=connection.allow_pickle,
                    )
                except EnvServerError as exc:
                    raise connection.invalid(f"an invalid reply: {exc}", type(exc)) from exc
                if entries:
                    infos = add_infos(self._results.infos, infos, connection, entries)
                return infos
            reply = connection.reply_of(frames)
            if reply is None or reply.request_id != request_id:
                continue  # a late reply, or one to another request: not this step's
            if reply.status is Status.OK:
                return self._results.merge_step(infos, connection, None, reply.body)
            self._pool.keep(connection, reply)
            return None

    def requests(self) -> dict[HostConnection, Request]:
        """The requests not yet answered, for the general wait (they leave :attr:`sent`)."""
        space, actions = self._action_space, self._actions
        pending = {}
        for connection, request_id in self.sent:
            rows = select(space, actions, slice(connection.start, connection.stop))
            pending[connection] = Request(request_id, Command.STEP, {"actions": rows})
        self.sent = []
        return pending

    def abandon(self) -> None:
        """Forgets the requests not yet answered: their replies are dropped if they come."""
        for connection, _ in self.sent:
            connection.abandon()
        self.sent = []


def _fits(connection: HostConnection, row_bytes: int) -> bool:
    """Whether a step of ``row_bytes`` of actions per env goes raw to ``connection``.

    Its session must step raw, and the request be within its message bound.
    """
    if connection.step_layout is None or connection.failed is not None:
        return False
    bound = connection.max_message_bytes
    return bound is None or row_bytes * connection.count + MAX_ENVELOPE_BYTES <= bound
