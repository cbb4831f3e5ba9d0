"""The lean lockstep step: STEP_RAW to every host, the replies written straight into the batches.

A lockstep step takes this path when every host's session steps raw (``StepLayout``), no env is
lost and the actions fit the layout exactly; otherwise it goes the general way
(``RequestTracker.prepare``: still STEP_RAW to a host whose layout fits the envs it steps, else
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

import operator
import time
from typing import Any

import numpy as np

from envserver.errors import EnvServerError
from envserver.wire.messages import Command, RawStepEnvelopes, Reply, Status

from .connection import HostConnection
from .pool import HostPool
from .requests import Flight, Pending
from .waits import IN_ORDER_WAIT_S

__all__ = ["RawStep"]


class RawStep:
    """The lean step of one vector env: its sends, and the replies it writes (module docstring).

    Args:
        pool: The hosts.
    """

    def __init__(self, pool: HostPool) -> None:
        self._pool = pool
        self._envelopes = RawStepEnvelopes()
        self._actions: Any = None  # the batch sent: its rows are the requests' frames
        self._views_of: tuple[Any, ...] = (None,) * 4  # the layout and batches of _views
        self._views: list[memoryview] | None = None
        self._flights: dict[HostConnection, Flight] = {}  # each connection's (one per step)

    def prepare(
        self, actions: Any, arrays: list[np.ndarray] | None
    ) -> dict[Pending, Flight] | None:
        """Encodes a step of every env to every host raw, or nothing (sent by the engine).

        Nothing while a host has failed or drains: the caller mends that first (``InFlight.heal``).

        Args:
            actions: The batched actions, which the caller will not change (a large frame is
                sent from it without a copy, and sent again by a retry).
            arrays: Their leaves' arrays in the pool's step layout (``StepLayout.action_arrays``;
                None: they do not fit it).

        Returns:
            The request to each host and its flight, in host order; None if they do not all
            go raw (the caller steps the general way).
        """
        pool = self._pool
        if arrays is None or (pool.heartbeat is not None and pool.heartbeat.any_draining):
            return None
        connections = pool.connections
        for connection in connections:  # each session's fit was decided at its MAKE
            session = connection.requests.session
            if connection.health.failure is not None or session is None or not session.steps_raw:
                return None
        self._actions = actions  # kept while its rows may be sent again
        if len(self._flights) > len(connections):  # connections replaced: theirs go
            self._flights = {c: f for c, f in self._flights.items() if c in connections}
        requests, flights = {}, self._flights
        for connection in connections:  # (map and itemgetter: the rows without Python calls)
            flight = flights.get(connection)
            if flight is None:  # a connection new since the last step
                flight = flights[connection] = Flight(connection, Command.STEP, None)
            block = connection.block
            rows = operator.itemgetter(slice(block.start, block.stop))
            pending = connection.requests.prepare_raw(list(map(rows, arrays)), self._envelopes)
            requests[pending] = flight
        return requests

    def receive(
        self,
        requests: dict[Pending, Flight],
        batches: tuple[Any, np.ndarray, np.ndarray],
        deadline: float | None,
    ) -> bool:
        """Receives the replies host after host, while each comes soon, and writes them.

        A reply that is not a plain OK one is taken the general way (into its request).

        Args:
            requests: The step's requests and their flights, in host order.
            batches: Where the replies' values go: the observations, rewards and flags (their
                ``StepLayout.reply_views``, made again only for other arrays than the last).
            deadline: ``time.monotonic()`` the step's wait ends at (None: none).

        Returns:
            Whether every reply came and was written (nothing is left for the general wait).
        """
        layout = self._pool.step_layout
        made_of = (layout, *batches)
        if not all(map(operator.is_, made_of, self._views_of)):  # (no Python calls)
            self._views = layout.reply_views(*batches)
            self._views_of = made_of
        into = self._views
        if into is None:
            return False
        written, heard = True, False
        for pending, flight in requests.items():
            connection = flight.connection
            late = deadline is not None and deadline - time.monotonic() <= IN_ORDER_WAIT_S
            if pending.reply is None and late:
                return False
            tracker, health = connection.requests, connection.health
            while pending.reply is None and health.failure is None:
                frames = tracker.next_message()
                if frames is None:
                    break
                if bytes(frames[0]) != pending.reply_envelope:  # (a channel's too: no call)
                    tracker.take(frames)  # decoded as usual: it may be another's, or late
                    heard = True
                else:
                    try:
                        entries = pending.layout.write_reply(
                            frames[1:],
                            into,
                            connection.block.start,
                            pending.count,
                            allow_pickle=tracker.allow_pickle,
                        )
                    except EnvServerError as exc:
                        health.fail(f"sent an invalid reply: {exc}", type(exc))
                    else:
                        reply = Reply(pending.request_id, Status.OK, None)
                        tracker.answer(pending, reply, entries)
                tracker.release()
            if pending.reply is None:
                return False
            written = written and pending.written is not None
        if heard:  # what the envs said, in replies taken the general way
            self._pool.tell()
        return written
