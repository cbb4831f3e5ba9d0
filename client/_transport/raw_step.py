"""The lean lockstep step: STEP_RAW to every host, the replies written straight into the batches.

A lockstep step takes this path when every host's session steps raw (``StepLayout``), no env is
lost and the actions fit the layout exactly; otherwise it goes the general way
(``HostConnection.prepare``: still STEP_RAW to a host whose layout fits the envs it steps, else
STEP; its reply read by the general wait). It is an encoding and a fast receive of the same
requests (:class:`~.requests.Pending`), not a control flow of its own: per host and step it does
what a protocol-free client must do anyway, and little more: one send of the envelope and the
host's rows of each action array; one blocking receive of the reply; one comparison of the
reply's envelope with the one an OK reply with nothing said has; the frames' lengths and flag
bytes checked; the values copied into the vector env's batches, and the request marked answered
(with its info entries, merged at the end).

Anything else is the general wait's, on the same requests, with nothing to hand over: a reply
with another envelope is taken the general way (what the envs said, a late reply, an error, a
lost session), and a reply that does not come within ``AWAIT_REPLY_MS`` (or a deadline nearer
than that) ends the lean receive, and the wait watches the hosts' liveness, keeps the deadline,
and lets the caller recover failed ones.
"""

from __future__ import annotations

import time
from typing import Any

from envserver.errors import EnvServerError
from envserver.wire.messages import MAX_ENVELOPE_BYTES, Reply, Status, raw_reply_envelope

from .connection import HostConnection
from .pool import IN_ORDER_WAIT_S, HostPool
from .requests import Pending

__all__ = ["RawStep"]


class RawStep:
    """The lean step of one vector env: its sends, and the replies it writes (module docstring).

    Args:
        pool: The hosts.
        num_envs: How many envs the hosts hold together.
    """

    def __init__(self, pool: HostPool, num_envs: int) -> None:
        self._pool = pool
        self._num_envs = num_envs
        self._actions: Any = None  # the batch sent: its rows are the requests' frames

    def prepare(self, actions: Any) -> dict[HostConnection, Pending] | None:
        """Encodes a step of every env to every host raw, or nothing (sent by :meth:`transmit`).

        Args:
            actions: The batched actions, which the caller will not change (a large frame is
                sent from it without a copy, and sent again by a retry).

        Returns:
            The request to each host, in host order; None if they do not all go raw (the
            caller steps the general way).
        """
        layout = self._pool.step_layout
        arrays = None if layout is None else layout.action_arrays(actions, self._num_envs)
        if arrays is None:
            return None
        connections = self._pool.connections
        row_bytes = sum(a.nbytes for a in arrays) // self._num_envs
        if not all(_fits(c, row_bytes) for c in connections):
            return None
        self._actions = actions  # kept while its rows may be sent again
        return {c: c.prepare_raw([a[c.start : c.stop] for a in arrays]) for c in connections}

    def transmit(self, requests: dict[HostConnection, Pending]) -> None:
        """Sends what :meth:`prepare` returned, after one read of every host's monitor."""
        self._pool.read_monitors()  # a loss already reported is not dated after the sends
        now = time.monotonic()
        for connection, pending in requests.items():
            connection.transmit(pending, now)

    def receive(
        self,
        requests: dict[HostConnection, Pending],
        into: list[memoryview],
        deadline: float | None,
    ) -> bool:
        """Receives the replies host after host, while each comes soon, and writes them.

        A reply that is not a plain OK one is taken the general way (into its request).

        Args:
            requests: The step's requests, in host order.
            into: Where the replies' values go: the batches' views in the pool's step layout
                (``StepLayout.reply_views``).
            deadline: ``time.monotonic()`` the step's wait ends at (None: none).

        Returns:
            Whether every reply came and was written (nothing is left for the general wait).
        """
        written = True
        for connection, pending in requests.items():
            if pending.reply is None:
                if deadline is not None and deadline - time.monotonic() <= IN_ORDER_WAIT_S:
                    return False
                if not self._take(connection, pending, into):
                    return False
            written = written and pending.written is not None
        self._pool.tell()
        return written

    def _take(self, connection: HostConnection, pending: Pending, into: list[memoryview]) -> bool:
        """Writes ``pending``'s reply once it came (False: it did not come soon)."""
        expected = raw_reply_envelope(pending.request_id)
        while pending.reply is None and connection.failure is None:
            frames = connection.next_message()
            if frames is None:
                return False
            if frames[0].bytes != expected:
                connection.take(frames)  # decoded as usual: it may be another's, or late
            else:
                try:
                    entries = pending.layout.write_reply(
                        frames[1:],
                        into,
                        connection.start,
                        connection.count,
                        allow_pickle=connection.allow_pickle,
                    )
                except EnvServerError as exc:
                    connection.fail(f"sent an invalid reply: {exc}", type(exc))
                else:
                    connection.answer(pending, Reply(pending.request_id, Status.OK, None), entries)
            connection.link.reader.release()
        return pending.reply is not None


def _fits(connection: HostConnection, row_bytes: int) -> bool:
    """Whether a step of ``row_bytes`` of actions per env goes raw to ``connection``.

    Its session must step raw, and the request be within its message bound.
    """
    session = connection.session
    if session is None or session.step_layout is None or connection.failure is not None:
        return False
    bound = session.max_message_bytes
    return bound is None or row_bytes * connection.count + MAX_ENVELOPE_BYTES <= bound
