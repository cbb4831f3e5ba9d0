"""Recovery from failed hosts (``on_host_failure="restart"`` or ``"restore"``).

A failed host is brought back by one policy for lockstep calls and first-ready batches alike
(:meth:`Recovery.recover`): on the same endpoint, resuming its session when the host still
holds it; else on a respawned local process or a spare, its envs restored (``"restore"``) or
made anew. Envs made anew are marked lost, and each
reports the loss once, where results are merged: lockstep steps and resets, and first-ready
batches, ask :class:`Recovery` which envs are lost and for the report of their loss. With
``"restore"``, envs made anew during or between calls are restored from the snapshots
kept (:class:`~._kept_states.KeptStates`) and the steps since taken again, checked against
what the trainer was given; only envs that cannot be brought back so are marked lost. And the
envs of a host that drains (it is to stop soon) move, with their state, to another host before
the next lockstep step or reset (:meth:`Recovery.move_draining`).
"""

from __future__ import annotations

import collections
import contextlib
import copy as copy_module
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envserver.errors import (
    EnvServerError,
    HostUnavailableError,
    ProtocolError,
    WaitTimeoutError,
)
from envserver.launch.launcher import Launcher
from envserver.wire.bodies import GetState, RequestBody, Reset, SetState, Step
from envserver.wire.messages import Command
from envserver.wire.replies import HelloReply, MakeReply, ResetReply, StepReply

from ._env_results import EnvResults
from ._kept_states import BlockHistory, KeptStates
from ._options import VectorOptions
from ._recipe import EnvRecipe
from ._replay import EnvMemory
from ._results import space_of
from ._transport.connection import HostConnection
from ._transport.discovery import Discovery
from ._transport.error_replies import loss_of
from ._transport.pool import HostPool
from ._transport.requests import Failure, Pending
from ._transport.session import HostSession

__all__ = ["Recovery"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class Recovery:
    """Brings failed hosts back, and keeps which envs were lost until they report it.

    Args:
        pool: The hosts.
        recipe: How a host makes its envs (for re-making them).
        env_spaces: Every env's ``(observation_space, action_space)``: envs made anew must
            have the same.
        results: The envs' last results (a lost env reports its last observation).
        options: The vector env's options (``on_host_failure``, timeouts, spares).
        launcher: What started the hosts (local hosts, Ray actors): it replaces a lost one; or
            None.
        discovery: How the host list's specs resolve (replacements for a lost host), or None.
        kept: The snapshots and actions kept to restore lost envs (``"restore"``), or None.
    """

    def __init__(
        self,
        pool: HostPool,
        recipe: EnvRecipe,
        env_spaces: Sequence[tuple[gym.Space, gym.Space]],
        results: EnvResults,
        options: VectorOptions,
        launcher: Launcher | None = None,
        discovery: Discovery | None = None,
        kept: KeptStates | None = None,
    ) -> None:
        num_envs = len(env_spaces)
        self._pool = pool
        self._recipe = recipe
        self._env_spaces = list(env_spaces)
        self._results = results
        self._options = options
        self._launcher = launcher
        self._discovery = discovery
        self._kept = kept
        self._enabled = options.on_host_failure in ("restart", "restore")
        #: How many times a failed host's envs were re-made.
        self.host_restarts = 0
        #: How many envs moved off hosts that drain.
        self.envs_moved = 0
        self._staying: set[HostConnection] = set()  # draining hosts whose envs could not move
        self._memory = EnvMemory(num_envs)  # what the trainer gave each env, given again
        # Envs re-made after a failure: each reports the loss once, at its next step
        # (truncated) or reset; in SAME_STEP mode with the fresh (obs, info) kept here.
        self._lost = np.zeros(num_envs, dtype=np.bool_)
        self._fresh: dict[int, tuple[Any, dict[str, Any]]] = {}
        # Where a recovery attempt found nothing: addresses where no connection came up (a lost
        # node's other hosts are not worth a wait each) and endpoints where nothing listens.
        # Tried after the others, until an attempt there succeeds.
        self._unreachable: set[str] = set()

    def note_reset(
        self, ids: Sequence[int], seeds: Sequence[int | None], options: dict[str, Any] | None
    ) -> None:
        """Notes a reset of the envs ``ids`` (sent), for envs made anew later."""
        self._memory.reset(ids, seeds, options)

    def note_set_attr(self, name: str, values: dict[int, Any], outermost: bool) -> None:
        """Notes a ``set_attr`` call (done), for envs made anew later."""
        self._memory.set_attr(name, values, outermost)

    def stop(self) -> None:
        """No recovery from now on (the vector env is closing)."""
        self._enabled = False

    def recoverable(self, command: Command) -> bool:
        """Whether a host failing during ``command`` is recovered now.

        Only steps and resets recover: they can account for the lost envs. A host that fails
        during another call makes it raise, and is recovered at the next step or reset.
        """
        return self._enabled and command in (Command.STEP, Command.RESET)

    # ------------------------------------------------------------- lost envs

    @property
    def any_lost(self) -> bool:
        """Whether some envs have yet to report their loss."""
        # Not from host_restarts (a trainer may reset that); bytes: cheaper than ndarray.any.
        return b"\x01" in self._lost.tobytes()

    def lost_mask(self, ids: np.ndarray) -> np.ndarray:
        """Which of the envs ``ids`` have yet to report their loss (a mask over ``ids``)."""
        return self._lost[ids]

    def lost_in(self, connection: HostConnection) -> list[int]:
        """The envs of ``connection``'s block (indices in it) that have yet to report."""
        return np.flatnonzero(self._lost[connection.start : connection.stop]).tolist()

    def lost_step(self, connection: HostConnection, local: list[int]) -> StepReply:
        """:meth:`loss_report` for the lost envs ``local``, which have then reported it."""
        report = self.loss_report(connection, local)
        self.reported(connection, local)
        return report

    def loss_report(self, connection: HostConnection, local: list[int]) -> StepReply:
        """Host-shaped step results for lost envs (by index in the block): truncated episodes.

        NEXT_STEP and DISABLED report the last observation the client saw; SAME_STEP reports
        the fresh reset observation, with the last one as ``final_obs``. Nothing changes until
        :meth:`reported` says the report was handed out.
        """
        count = len(local)
        space = self._results.space
        positions = [connection.start + i for i in local]
        last = self._results.last_observations(positions)
        if self._recipe.autoreset_mode == AutoresetMode.SAME_STEP:
            fresh = [self._fresh[p] for p in positions]
            obs = concatenate(
                space, [o for o, _ in fresh], create_empty_array(space, count, fn=np.zeros)
            )
            entries = []
            for i, final, (_, info) in zip(local, iterate(batch_space(space, count), last), fresh):
                entries.append([i, {"final_obs": final, "final_info": {}}])
                entries.append([i, {**info, "host_failure": True}])
        else:
            obs, entries = last, [[i, {"host_failure": True}] for i in local]
        return StepReply(
            obs,
            np.zeros(count),
            np.zeros(count, dtype=np.bool_),
            np.ones(count, dtype=np.bool_),
            entries,
        )

    def found(self, connection: HostConnection, local: Sequence[int]) -> list[list[Any]]:
        """The info entries that flag lost envs a reset just brought back (``host_failure``).

        Nothing changes until :meth:`reported` says they were handed out.
        """
        start = connection.start
        return [[int(i), {"host_failure": True}] for i in local if self._lost[start + i]]

    def reported(self, connection: HostConnection, local: Sequence[int]) -> None:
        """Notes that the envs ``local`` of ``connection``'s block reported their loss."""
        for i in local:
            position = connection.start + i
            self._lost[position] = False
            self._fresh.pop(position, None)

    # ------------------------------------------------------------- bringing hosts back

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
        2. Restore (``"restore"``): the envs are made anew, restored from what is kept (see
           :meth:`_restored`), and the requests sent again.
        3. Re-make: the envs are made anew, fresh, and marked lost; the requests are not sent
           again (a step's envs report the loss instead; a reset is the caller's to send).

        Args:
            failed: The failed connection.
            requests: Its requests under way (their envs are in flight).
            what: The call it failed in, for the log.
            given: The observations of its envs the trainer was given or received last,
                batched (default: those it was given).
            bodies: What each request asked (default: its body; for a step sent raw, the
                step kept under way).

        Returns:
            The new connection (in the failed one's place); for each request, the one that
            answers it on the new connection (answered if resumed, else under way), or None
            where the envs were made anew; and whether they were.
        """
        resumable = failed.session is not None and bool(requests)
        in_flight = {failed.start + i for p in requests for i in _local_ids(failed, p)}

        def attempt(connection: HostConnection, deadline: float) -> tuple[list, bool]:
            nonlocal resumable
            if resumable and connection.endpoint == failed.endpoint:
                connection.hold(failed.session)  # its step layout and slab with it
                try:
                    again = [connection.retry(p) for p in requests]
                    replies = [
                        self._pool.await_one(connection, p, deadline, p.command.name) for p in again
                    ]
                except ProtocolError:  # the host is not trusted: its envs are made anew
                    resumable = False
                    raise
                finally:  # resumed or not, it is for the new connection to hold it now
                    connection.let_go()
                if all(loss_of(reply) is None for reply in replies):
                    connection.hold(failed.session)
                    logger.warning("resumed the session on %s", connection.name)
                    return again, False
                resumable = False
            old_session = _held(failed, connection)
            history = self._restored(connection, old_session, deadline, in_flight, given)
            if history is None:
                return [None] * len(requests), True
            asked = bodies or [_asked(p, history) for p in requests]
            again = [
                connection.send(p.command, body, views=True) for p, body in zip(requests, asked)
            ]
            return again, False

        new, (answers, remade) = self._reconnect(failed, what, attempt)
        return new, answers, remade

    def move_draining(self) -> None:
        """Moves the envs of every host that drains to another host, with their state.

        Called before a lockstep step or reset is sent (the envs are between steps). See
        :meth:`move`.
        """
        for connection in self.draining():
            self.move(connection)

    def draining(self) -> list[HostConnection]:
        """The hosts that drain and whose envs may move (see :meth:`move`)."""
        if not self._enabled or self._launcher is not None:
            return []
        return [
            c
            for c in self._pool.connections
            if c.failure is None and c not in self._staying and c.draining
        ]

    def move(self, draining: HostConnection) -> None:
        """Moves the envs of a host that drains (none in flight) to another host, or leaves them.

        Each env's snapshot is taken on the draining host, restored on another (a spare, or
        what a ``dns://`` or ``slurm://`` spec names now; not for launched hosts), and the
        draining host's session closed: the envs go on exactly, with no truncation. Where
        their state cannot be taken or no other host takes them, they stay, to be recovered as
        any failed host's when it stops.
        """
        self._move(self._pool.connections.index(draining), draining)

    def _move(self, index: int, draining: HostConnection) -> None:
        """Moves ``draining``'s envs (host ``index``) to another host, or leaves them."""
        pool = self._pool
        deadline = time.monotonic() + self._options.restart_timeout_s
        try:
            states = pool.ask_ok(draining, Command.GET_STATE, GetState(None), deadline)
        except EnvServerError as exc:
            self._staying.add(draining)
            logger.warning(
                "%s drains, but its envs' state could not be taken: they stay until it stops (%s)",
                draining.name,
                exc,
            )
            return
        for endpoint in self._replacements(draining, index, fresh=False):
            if time.monotonic() >= deadline:
                break
            if endpoint == draining.endpoint:
                continue
            connection = None
            try:  # one try may not take the whole deadline (a host there that stopped)
                connection = self._open(index, endpoint, draining)
                attempt = min(deadline, time.monotonic() + self._attempt_s())
                self._remake(connection, None, attempt, fresh=False)
                self._set_states(connection, list(states), attempt)
            except EnvServerError as exc:
                reason = _attempt_failure(connection, exc)
                self._drop_attempt(endpoint, connection)
                logger.info(
                    "%s did not take the envs of draining %s: %s", endpoint, draining.name, reason
                )
                continue
            self._found_host(endpoint)
            pool.drop(pool.install(index, connection))  # and the draining host's session closed
            self.envs_moved += draining.count
            if self._kept is not None:  # the snapshots just taken are the latest
                self._kept.taken(range(draining.start, draining.stop), list(states))
            logger.warning(
                "moved %s from %s, which drains, to %s",
                draining.envs,
                draining.name,
                connection.name,
            )
            return
        self._staying.add(draining)
        logger.warning(
            "%s drains, and no other host took its envs: they stay until it stops", draining.name
        )

    def recover_failed(self) -> None:
        """Re-makes the hosts that failed outside a step or a reset (during a call, say).

        Called before a lockstep step or reset is sent: the envs of those hosts then report the
        loss in it (first-ready batches recover theirs with what they received and have under
        way: ``FirstReady._recover_failed``).
        """
        if not self.recoverable(Command.STEP):
            return
        for connection in list(self._pool.connections):
            if connection.failure is not None:
                self.recover(connection, [], "next step")

    def _reconnect(
        self,
        failed: HostConnection,
        what: str,
        attempt: Callable[[HostConnection, float], tuple[_T, bool]],
    ) -> tuple[HostConnection, tuple[_T, bool]]:
        """Retries ``attempt`` on new connections for a failed host until it succeeds.

        Each try connects to the same endpoint (a respawned process for a local host) or, for
        remote hosts, to the next candidate (see :meth:`_replacements`) at once, with backoff
        between rounds of every candidate, all within ``restart_timeout_s``. Only a connection
        whose attempt succeeded takes the failed one's place: a recovery interrupted (Ctrl-C)
        leaves the failed host as it was, to be recovered again by the next wait.

        Args:
            failed: The failed connection.
            what: The call it failed in, for the log.
            attempt: Brings the host back on a connection before the deadline; returns its
                result, and whether the envs were made anew.

        Raises:
            HostUnavailableError: If nothing worked in time.
            RuntimeError: If the envs made anew have other spaces than the lost ones.
        """
        pool = self._pool
        index = pool.connections.index(failed)
        logger.warning("%s; recovering (%s)", failed.failure.message, what)
        deadline = time.monotonic() + self._options.restart_timeout_s
        attempt_s = self._attempt_s()
        delay, tries = 0.1, 0
        tried: set[str] = set()
        told: dict[str, str] = {}  # each endpoint's last failure warned about (once per reason)
        while True:
            endpoints = self._replacements(failed, index, fresh=tries == 0)
            if not endpoints:  # its launcher has no host for it yet (a Ray actor restarting)
                tries += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._unrecovered(failed, ": what started it gave no host")
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 2.0)
                continue
            untried = [e for e in endpoints if e not in tried]
            if not untried:  # every candidate failed once: go round again
                tried.clear()
                untried = endpoints
            endpoint = untried[0]
            tried.add(endpoint)
            tries += 1
            connection = None
            try:
                connection = self._open(index, endpoint, failed)
                result = attempt(connection, min(deadline, time.monotonic() + attempt_s))
            except EnvServerError as exc:
                reason = _attempt_failure(connection, exc)
                self._drop_attempt(endpoint, connection)
                where = failed.name if endpoint == failed.endpoint else f"host {endpoint}"
                level = logging.INFO if told.get(endpoint) == reason else logging.WARNING
                told[endpoint] = reason
                logger.log(level, "recovery attempt %d on %s failed: %s", tries, where, reason)
                remaining = deadline - time.monotonic()
                if remaining > 0 and tried.issuperset(endpoints):  # a round over: back off
                    time.sleep(min(delay, remaining))
                    delay = min(delay * 2, 2.0)
                if time.monotonic() >= deadline:  # no time left for another attempt
                    last = f"; last error: {_unnamed(reason, failed.name)}"
                    raise self._unrecovered(failed, last) from exc
                continue
            except BaseException as exc:  # interrupted, or not a host failure
                if connection is not None:
                    pool.drop(connection)
                if not isinstance(exc, Exception):
                    raise  # interrupted (Ctrl-C): the failed host stays, to be recovered later
                self._give_up(failed, f"could not be made anew: {exc!r}")
                raise
            self._found_host(endpoint)
            pool.drop(pool.install(index, connection))
            if result[1]:
                self._remade(connection)
            return connection, result

    def _open(self, index: int, endpoint: str, block: HostConnection) -> HostConnection:
        """A connection to ``endpoint`` to try for host ``index``, with the envs of ``block``.

        Nothing listening there fails it at once (the next candidate is tried), but for a
        launched host, which may still be starting.
        """
        return self._pool.open(
            index, endpoint, block.start, block.count, refused_fails=self._launcher is None
        )

    def _drop_attempt(self, endpoint: str, connection: HostConnection | None) -> None:
        """Drops the connection of an attempt at ``endpoint`` that failed, noting what it found.

        Where nothing was found is tried last: the endpoint where nothing listens (the address
        answered), the address where no connection came up.
        """
        if connection is not None and connection.link.reach.refused:
            self._unreachable.add(endpoint)
        elif connection is None or not connection.link.reach.ever_up:
            self._unreachable.add(_address(endpoint))
        if connection is not None:
            self._pool.drop(connection)

    def _found_host(self, endpoint: str) -> None:
        """Notes an attempt at ``endpoint`` that succeeded: it and its address are tried again."""
        self._unreachable.difference_update((endpoint, _address(endpoint)))

    def _attempt_s(self) -> float:
        """How long one attempt on one endpoint may take (room left for the other candidates).

        A launched host's: the time it needs to start.
        """
        options = self._options
        if self._launcher is not None:
            return options.connect_timeout_s
        return max(2.0, 2 * options.host_timeout_s)

    def _unrecovered(self, failed: HostConnection, why: str) -> EnvServerError:
        """Marks ``failed`` as not recovered within ``restart_timeout_s``; the error to raise.

        Args:
            failed: The failed connection.
            why: What ends the message (``"; last error: ..."``).
        """
        failed.failure = Failure(
            HostUnavailableError,
            f"{failed.name} ({failed.envs}) failed and could not be recovered within "
            f"{self._options.restart_timeout_s:g} s{why}",
        )
        return failed.failure_error()

    def _give_up(self, connection: HostConnection, reason: str) -> None:
        """Marks a connection failed for good (its session was closed, or is gone)."""
        connection.failure = None
        connection.fail(reason)

    def _replacements(self, failed: HostConnection, index: int, fresh: bool) -> list[str]:
        """Where a failed host's envs may go, best first (looked up anew on every try).

        A launched host: where its launcher starts it again (a local host is respawned in
        place; see ``Launcher.replacements``). A host of the host list: its endpoint (or, for
        an address of a ``dns://`` or ``slurm://`` spec, what the spec names now: see
        ``Discovery.replacements``), then the other candidates, fewest envs of this vector env
        first (an idle spare before one in use), ties in that order; endpoints where an
        attempt found nothing (nothing listens there, or no connection came up at their
        address) come after the others.
        """
        if self._launcher is not None:
            return self._launcher.replacements(index, failed.endpoint, fresh)
        if self._discovery is None:
            return [failed.endpoint]
        others = [c for c in self._pool.connections if c is not failed]
        candidates = self._discovery.replacements(
            failed.endpoint, {c.endpoint for c in others}, self._options.spare_hosts
        )
        load = collections.Counter[str]()
        for connection in others:
            load[connection.endpoint] += connection.count
        same = candidates[:1] if candidates[:1] == [failed.endpoint] else []  # resumes first
        candidates = same + sorted(candidates[len(same) :], key=lambda e: load[e])
        unreachable = self._unreachable
        return sorted(candidates, key=lambda e: e in unreachable or _address(e) in unreachable)

    def _restored(
        self,
        connection: HostConnection,
        old_session: HostSession | None,
        deadline: float,
        in_flight: Collection[int] = (),
        given: Any = None,
    ) -> BlockHistory | None:
        """Makes a failed host's envs anew on ``connection``, restored where that can be.

        With every env of the block restorable from what is kept (``"restore"``: a snapshot, or
        a reset to start from), the envs are restored and sent again what they were sent
        since (but the requests under way, ``in_flight``); if the observations that gives do
        not equal ``given`` (or a snapshot is refused), the envs are made anew again, fresh.
        Without, they are made anew fresh (see :meth:`_remake`).

        Returns:
            What the envs were restored from; None if they are fresh, to be reported lost.

        Raises:
            EnvServerError: If the host failed meanwhile.
        """
        start, stop = connection.start, connection.stop
        history = None if self._kept is None else self._kept.of_block(start, stop, in_flight)
        if history is not None:
            if given is None:
                given = self._results.last_observations(range(start, stop))
            self._remake(connection, old_session, deadline, fresh=False)
            try:
                if self._restore(connection, history, given, deadline):
                    return history
            except EnvServerError as exc:
                if connection.failure is not None:
                    raise  # the host failed: the recovery tries again
                logger.warning("%s could not restore %s: %s", connection.name, connection.envs, exc)
            old_session = connection.session  # the envs of this attempt are not wanted
        self._remake(connection, old_session, deadline)
        return None

    def _restore(
        self, connection: HostConnection, history: BlockHistory, given: Any, deadline: float
    ) -> bool:
        """Restores ``connection``'s block from ``history``: its snapshots, then its requests.

        Returns:
            Whether the observations that gave equal ``given`` (env by env; an env given
            nothing, its reset under way, is not compared).
        """
        pool, count = self._pool, connection.count
        each = batch_space(self._results.space, count)
        got: dict[int, Any] = {}
        with_states = [i for i, state in enumerate(history.states) if state is not None]
        if with_states:
            states = [history.states[i] for i in with_states]
            env_ids = None if len(with_states) == count else with_states
            for i, answer in zip(
                with_states, self._set_states(connection, states, deadline, env_ids)
            ):
                got[i] = answer[0]
        for request in history.again:
            command, kind = (
                (Command.STEP, StepReply)
                if isinstance(request, Step)
                else (Command.RESET, ResetReply)
            )
            reply = connection.read(kind, pool.ask_ok(connection, command, request, deadline))
            ids = range(count) if request.env_ids is None else request.env_ids
            part = batch_space(self._results.space, len(ids))
            got.update(zip(ids, iterate(part, reply.obs)))
        if not all(
            data_equivalence(got[i], obs, exact=True)
            for i, obs in enumerate(iterate(each, given))
            if i in got
        ):
            logger.warning(
                "%s restored %s, but the %d requests sent again did not give the observations "
                "the trainer was given: they are made anew",
                connection.name,
                connection.envs,
                len(history.again),
            )
            return False
        self.host_restarts += 1
        logger.warning(
            "restored %s on %s (%d requests sent again)",
            connection.envs,
            connection.name,
            len(history.again),
        )
        return True

    def _set_states(
        self,
        connection: HostConnection,
        states: list[bytes],
        deadline: float,
        env_ids: list[int] | None = None,
    ) -> list[Any]:
        """Restores the envs ``env_ids`` (all if None) of ``connection``'s block from ``states``.

        Returns:
            Each env's answer: its observation, infos and whether its episode had ended.
        """
        body = SetState(states, env_ids)
        answers = self._pool.ask_ok(connection, Command.SET_STATE, body, deadline)
        if not isinstance(answers, list) or len(answers) != len(states):
            raise connection.invalid("SET_STATE results for other envs than asked")
        return answers

    def _remake(
        self,
        connection: HostConnection,
        old_session: HostSession | None,
        deadline: float,
        fresh: bool = True,
    ) -> None:
        """Makes a failed host's envs anew on ``connection``.

        A lost env reports one truncated step (``infos["host_failure"]``) at its next step, or
        the flag with its next reset. The new envs are made marked for autoreset, so in NEXT_STEP
        mode they reset on the step after that report, and in DISABLED mode they wait for the
        user's reset; in SAME_STEP mode they are reset at once, for the report to carry a fresh
        observation. What the trainer gave the lost envs is given again (see ``EnvMemory``).
        They are marked lost once the connection takes the failed one's place (:meth:`_remade`).
        Not ``fresh``: made to be restored (not reset in SAME_STEP mode); ``fresh``, none of
        the snapshots kept for them holds any longer.

        Raises:
            RuntimeError: If the new envs have other spaces than the lost ones.
        """
        pool = self._pool
        if old_session is not None:  # a host that is still up must not keep the lost envs
            connection.hold(old_session)
            with contextlib.suppress(EnvServerError):
                pool.ask(connection, Command.CLOSE, None, deadline)
            connection.let_go()
        hello = connection.read(
            HelloReply, pool.ask_ok(connection, Command.HELLO, self._recipe.hello(), deadline)
        )
        connection.hold(HostSession(hello.session, hello.info))
        start, stop = connection.start, connection.stop
        body = dataclasses.replace(
            self._recipe.make(start, stop),
            autoreset_pending=True,
            first_resets=self._memory.first_resets(start, stop),
        )
        made = connection.read(
            MakeReply, pool.ask_ok(connection, Command.MAKE, connection.make_body(body), deadline)
        )
        connection.use_layout(made, pool.step_layout)
        got = list(zip(map(space_of, made.observation_spaces), map(space_of, made.action_spaces)))
        if got != self._env_spaces[start:stop]:
            raise RuntimeError(
                f"the envs re-made on {connection.name} do not have the spaces of the "
                f"lost {connection.envs}"
            )
        for attributes in self._memory.set_attr_bodies(start, stop):
            pool.ask_ok(connection, Command.SET_ATTR, attributes, deadline)
        if fresh and self._kept is not None:
            self._kept.forget(start, stop)
        if fresh and self._recipe.autoreset_mode == AutoresetMode.SAME_STEP:
            self._keep_fresh(connection, deadline)

    def _remade(self, connection: HostConnection) -> None:
        """Marks the envs made anew on ``connection`` lost (each reports it once)."""
        start, stop = connection.start, connection.stop
        self._lost[start:stop] = True
        self._memory.remade(start, stop)
        self.host_restarts += 1
        logger.warning("re-made %s on %s", connection.envs, connection.name)

    def _keep_fresh(self, connection: HostConnection, deadline: float) -> None:
        """Resets envs made anew at once, keeping each one's (obs, info) for its report."""
        count = connection.count
        reset = connection.read(
            ResetReply,
            self._pool.ask_ok(connection, Command.RESET, Reset([None] * count), deadline),
        )
        infos = dict(reset.infos)
        for i, obs in enumerate(iterate(batch_space(self._results.space, count), reset.obs)):
            self._fresh[connection.start + i] = (copy_module.deepcopy(obs), infos.get(i, {}))

    def lost_reset(self, connection: HostConnection, body: Reset) -> Pending:
        """Sends a reset that lost ``connection``'s envs again: all of them, masked or not.

        The envs the mask left out are fresh too, so they are reset as well (without a seed)
        and reported with the others; every one carries ``infos["host_failure"]``.
        """
        seeds: list[int | None] = [None] * connection.count
        for i, seed in zip(body.env_ids or range(connection.count), body.seeds):
            seeds[i] = seed
        return connection.send(Command.RESET, Reset(seeds, body.options), views=True)


def _local_ids(connection: HostConnection, request: Pending) -> Sequence[int]:
    """The envs of ``connection``'s block a step or a reset is for (indices in the block)."""
    if request.body is None:  # a step sent raw
        return range(connection.count) if request.raw_env_ids is None else request.raw_env_ids
    env_ids = getattr(request.body, "env_ids", None)
    return range(connection.count) if env_ids is None else env_ids


def _asked(request: Pending, history: BlockHistory) -> RequestBody:
    """What ``request`` asked: its body, or for a step sent raw, the step kept under way."""
    if request.body is not None:
        return request.body
    (step,) = history.under_way
    return step


def _held(failed: HostConnection, connection: HostConnection) -> HostSession | None:
    """The session ``failed`` held, if ``connection`` is to its endpoint (where it may be kept)."""
    return failed.session if connection.endpoint == failed.endpoint else None


def _unnamed(reason: str, name: str) -> str:
    """``reason`` without its leading ``name`` (and envs), for a message that names the host."""
    if not reason.startswith(name):
        return reason
    return re.sub(r"^\s*(\(envs? [\d-]+\))?[\s:]*", "", reason[len(name) :])


def _address(endpoint: str) -> str:
    """An endpoint without its port (``tcp://node3:5556`` -> ``tcp://node3``)."""
    return endpoint.rpartition(":")[0] if endpoint.startswith("tcp://") else endpoint


def _attempt_failure(connection: HostConnection | None, exc: BaseException) -> str:
    """Why a recovery attempt failed: a wait that ran out says what the address did."""
    if isinstance(exc, WaitTimeoutError) and connection is not None and not connection.failed:
        connection.read_events()
        return f"{connection.name}: {connection.link.reach.why_silent()}"
    return str(exc)
