"""The one recovery policy for lockstep calls and first-ready batches, and drains.

A failed host is brought back (:meth:`Recovery.recover`) on the same endpoint, resuming its
session when the host still holds it; else on a respawned local process or a spare
(:mod:`.reconnect`), its envs restored (``"restore"``) or re-created (:mod:`.restore`). Envs
re-created are marked lost in the :mod:`.ledger`, and each reports the loss once. The envs of
a host that drains (it is to stop soon) move, with their state, to another host between steps
(:meth:`Recovery.move`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from envserver.errors import EnvServerError, ProtocolError
from envserver.launch.launcher import Launcher
from envserver.wire.bodies import GetState, RequestBody
from envserver.wire.messages import Command

from .._env_results import EnvResults
from .._options import VectorOptions
from .._recipe import EnvRecipe
from .._transport.connection import HostConnection
from .._transport.discovery import Discovery
from .._transport.error_replies import loss_of
from .._transport.pool import HostPool
from .._transport.requests import Pending
from .._transport.session import HostSession
from .history import BlockHistory, EnvHistory
from .ledger import Ledger
from .reconnect import Reconnector
from .restore import Restorer

__all__ = ["Decision", "Recovery"]

logger = logging.getLogger(__name__)


class Decision(enum.Enum):
    """How a failed host was brought back (the policy's order)."""

    RESUMED = "resumed"  # its session, held by the same endpoint, answered again
    RESTORED = "restored"  # its envs re-created from what is kept, the requests sent again
    REMADE = "re-made"  # its envs re-created fresh, marked lost


class Recovery:
    """Brings failed hosts back and moves the envs of hosts that drain.

    Args:
        pool: The hosts.
        recipe: How a host makes its envs (for re-creating them).
        env_spaces: Every env's ``(observation_space, action_space)``: re-created envs must
            have the same.
        results: The envs' last results (a lost env reports its last observation).
        options: The vector env's options (``on_host_failure``, timeouts, spares).
        history: Each env's history: what re-created envs are given again, and (``"restore"``)
            what restores them.
        launcher: What started the hosts (local hosts, Ray actors): it replaces a lost one; or
            None.
        discovery: How the host list's specs resolve (replacements for a lost host), or None.
    """

    def __init__(
        self,
        pool: HostPool,
        recipe: EnvRecipe,
        env_spaces: Sequence[tuple[gym.Space, gym.Space]],
        results: EnvResults,
        options: VectorOptions,
        history: EnvHistory,
        launcher: Launcher | None = None,
        discovery: Discovery | None = None,
    ) -> None:
        self._pool = pool
        self._options = options
        self._enabled = options.on_host_failure in ("restart", "restore")
        self._launched = launcher is not None  # launched hosts do not move (see draining)
        #: The lost envs, until each reports its loss.
        self.ledger = Ledger(len(env_spaces), results, recipe.autoreset_mode)
        #: Each env's history (resets, steps, ``set_attr``), for re-created and restored envs.
        self.history = history
        self._reconnector = Reconnector(pool, options, launcher, discovery)
        self._restorer = Restorer(pool, recipe, env_spaces, results, self.ledger, history)
        #: How many times a failed host's envs were re-created or restored.
        self.host_restarts = 0
        #: How many envs moved off hosts that drain.
        self.envs_moved = 0
        self._staying: set[HostConnection] = set()  # draining hosts whose envs could not move

    def stop(self) -> None:
        """No recovery from now on (the vector env is closing)."""
        self._enabled = False

    def recoverable(self, command: Command) -> bool:
        """Whether a host failing during ``command`` is recovered now.

        Only steps and resets recover: they can account for the lost envs. A host that fails
        during another call makes it raise, and is recovered at the next step or reset.
        """
        return self._enabled and command in (Command.STEP, Command.RESET)

    def recover(
        self,
        failed: HostConnection,
        requests: Sequence[Pending],
        what: str,
        given: Any = None,
        bodies: Sequence[RequestBody] | None = None,
    ) -> tuple[HostConnection, list[Pending | None], bool]:
        """Brings a failed host back, with the requests it had under way: the one policy.

        Lockstep calls (one request) and first-ready batches (one per sub-batch under way, or
        none for a host that failed between calls) take the same decisions, in this order:

        1. Resume: the same endpoint still holds the session, and answers every request sent
           again as it was (its frames, under its id; a host that ran it answers from its
           cache).
        2. Restore (``"restore"``): the envs are re-created, restored from what is kept (see
           ``Restorer.restore_or_remake``), and the requests sent again.
        3. Re-create: the envs are re-created, fresh, and marked lost; the requests are not
           sent again (a step's envs report the loss instead; a reset is the caller's to send).

        Args:
            failed: The failed connection.
            requests: Its requests under way (their envs are in flight).
            what: The call it failed in, for the log.
            given: The observations of its envs the trainer was given or received last,
                batched (default: those it was given).
            bodies: What each request asked (default, or None for one: its body; for a step
                sent raw, the step kept under way).

        Returns:
            The new connection (in the failed one's place); for each request, the one that
            answers it on the new connection (answered if resumed, else under way), or None
            where the envs were re-created; and whether they were.
        """
        resumable = failed.requests.session is not None and bool(requests)
        in_flight = {failed.block.start + i for p in requests for i in _local_ids(failed, p)}

        def attempt(connection: HostConnection, deadline: float) -> tuple[list, Decision]:
            nonlocal resumable
            if resumable and connection.block.endpoint == failed.block.endpoint:
                try:
                    again = self._resumed(connection, failed.requests.session, requests, deadline)
                except ProtocolError:  # the host is not trusted: its envs are re-created
                    resumable = False
                    raise
                if again is not None:
                    return again, Decision.RESUMED
                resumable = False
            same = connection.block.endpoint == failed.block.endpoint  # it may keep the envs
            history = self._restorer.restore_or_remake(
                connection, failed.requests.session if same else None, deadline, in_flight, given
            )
            if history is None:
                return [None] * len(requests), Decision.REMADE
            asked = bodies or [None] * len(requests)
            again = [
                connection.requests.send(
                    p.command, _asked(p, history) if body is None else body, views=True
                )
                for p, body in zip(requests, asked)
            ]
            return again, Decision.RESTORED

        new, (answers, decision) = self._reconnector.replace(failed, what, attempt)
        if decision is not Decision.RESUMED:
            self.host_restarts += 1
        if decision is Decision.REMADE:
            self.ledger.mark_lost(new)
            self.history.remade(new.block.start, new.block.stop)
            logger.warning("re-made %s on %s", new.block.envs, new.block.name)
        return new, answers, decision is Decision.REMADE

    def _resumed(
        self,
        connection: HostConnection,
        session: HostSession,
        requests: Sequence[Pending],
        deadline: float,
    ) -> list[Pending] | None:
        """The requests sent again in ``session`` on ``connection``, answered; None if it is gone.

        A resumed session has no channel: the one it had was the failed host process's (a new
        process at the endpoint never reads it), and its requests go on the socket from now on.

        Raises:
            EnvServerError: If the host failed again, or is not trusted (``ProtocolError``).
        """
        session.channel = None  # bound to the host process that failed: steps on the socket
        session.more_channels = ()
        connection.hold(session)  # its step layout and slab with it
        try:
            again = [connection.requests.transmit(p.again()) for p in requests]
            replies = [self._pool.await_one(connection, p, deadline, p.command.name) for p in again]
        finally:  # resumed or not, it is for the new connection to hold it now
            connection.let_go()
        if any(loss_of(reply) is not None for reply in replies):
            return None
        connection.hold(session)
        logger.warning("resumed the session on %s", connection.block.name)
        return again

    def draining(self) -> list[HostConnection]:
        """The hosts that drain and whose envs may move (see :meth:`move`)."""
        if not self._enabled or self._launched:
            return []
        return [
            c
            for c in self._pool.connections
            if c.health.failure is None and c not in self._staying and c.draining
        ]

    def move(self, draining: HostConnection) -> None:
        """Moves the envs of a host that drains (none in flight) to another host, or leaves them.

        Each env's snapshot is taken on the draining host, restored on another (a spare, or
        what a ``dns://`` or ``slurm://`` spec names now; not for launched hosts), and the
        draining host's session closed: the envs go on exactly, with no truncation. Where
        their state cannot be taken or no other host takes them, they stay, to be recovered as
        any failed host's when it stops.
        """
        deadline = time.monotonic() + self._options.restart_timeout_s
        try:
            states = self._pool.ask_ok(draining, Command.GET_STATE, GetState(None), deadline)
        except EnvServerError as exc:
            self._staying.add(draining)
            logger.warning(
                "%s drains, but its envs' state could not be taken: they stay until it stops (%s)",
                draining.block.name,
                exc,
            )
            return

        def attempt(connection: HostConnection, deadline: float) -> None:
            self._restorer.remake(connection, None, deadline, fresh=False)
            self._restorer.set_states(connection, list(states), deadline)

        moved = self._reconnector.run(draining, attempt, deadline, leaving=True)
        if moved is None:
            self._staying.add(draining)
            logger.warning(
                "%s drains, and no other host took its envs: they stay until it stops",
                draining.block.name,
            )
            return
        block = draining.block
        self.envs_moved += block.count
        self.history.snapshots_taken(range(block.start, block.stop), states)
        logger.warning(
            "moved %s from %s, which drains, to %s", block.envs, block.name, moved[0].block.name
        )


def _local_ids(connection: HostConnection, request: Pending) -> Sequence[int]:
    """The envs of ``connection``'s block a step or a reset is for (indices in the block)."""
    if request.body is None:  # a step sent raw
        return range(connection.block.count) if request.raw_env_ids is None else request.raw_env_ids
    env_ids = getattr(request.body, "env_ids", None)
    return range(connection.block.count) if env_ids is None else env_ids


def _asked(request: Pending, history: BlockHistory) -> RequestBody:
    """What ``request`` asked: its body, or for a step sent raw, the step kept under way."""
    if request.body is not None:
        return request.body
    (step,) = history.under_way
    return step
