"""A host's envs re-created on a new connection, and restored where what is kept allows.

Re-created: HELLO, MAKE (the same spaces as the lost envs), and ``SET_ATTR`` with what the
trainer gave them (``EnvHistory``). Restored (``"restore"``): each env's
snapshot set (``SET_STATE``), the requests since sent again, and the observations that gives
checked against what the trainer was given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Collection, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, iterate

from envserver.errors import EnvServerError
from envserver.wire.bodies import Reset, SetState, Step
from envserver.wire.messages import Command
from envserver.wire.replies import HelloReply, MakeReply, ResetReply, StepReply

from .._env_results import EnvResults
from .._recipe import EnvRecipe
from .._results import space_of
from .._transport.connection import HostConnection
from .._transport.pool import HostPool
from .._transport.requests import Pending
from .._transport.session import HostSession
from .history import BlockHistory, EnvHistory
from .ledger import Ledger

__all__ = ["Restorer", "lost_reset"]

logger = logging.getLogger(__name__)


class Restorer:
    """Re-creates a host's envs on a connection, restored from what is kept where it can.

    Args:
        pool: The hosts.
        recipe: How a host makes its envs.
        env_spaces: Every env's ``(observation_space, action_space)``: re-created envs must
            have the same.
        results: The envs' last results (what the trainer was given).
        ledger: The lost envs (in SAME_STEP mode it keeps their fresh reset).
        history: Each env's history: what the trainer gave it, given again, and (``"restore"``)
            its snapshot and the requests since.
    """

    def __init__(
        self,
        pool: HostPool,
        recipe: EnvRecipe,
        env_spaces: Sequence[tuple[gym.Space, gym.Space]],
        results: EnvResults,
        ledger: Ledger,
        history: EnvHistory,
    ) -> None:
        self._pool = pool
        self._recipe = recipe
        self._env_spaces = list(env_spaces)
        self._results = results
        self._ledger = ledger
        self._history = history

    def restore_or_remake(
        self,
        connection: HostConnection,
        old_session: HostSession | None,
        deadline: float,
        in_flight: Collection[int] = (),
        given: Any = None,
    ) -> BlockHistory | None:
        """Re-creates a failed host's envs on ``connection``, restored where that can be.

        With every env of the block restorable from what is kept (``"restore"``: a snapshot, or
        a reset to start from), the envs are restored and sent again what they were sent
        since (but the requests under way, ``in_flight``); if the observations that gives do
        not equal ``given`` (or a snapshot is refused), they are re-created again, fresh.
        Without, they are re-created fresh (see :meth:`remake`).

        Returns:
            What the envs were restored from; None if they are fresh, to be reported lost.

        Raises:
            EnvServerError: If the host failed meanwhile.
        """
        start, stop = connection.block.start, connection.block.stop
        block = self._history.of_block(start, stop, in_flight)
        if block is not None:
            if given is None:
                given = self._results.last_observations(range(start, stop))
            self.remake(connection, old_session, deadline, fresh=False)
            try:
                if self._restore(connection, block, given, deadline):
                    return block
            except EnvServerError as exc:
                if connection.health.failure is not None:
                    raise  # the host failed: the recovery tries again
                logger.warning(
                    "%s could not restore %s: %s", connection.block.name, connection.block.envs, exc
                )
            old_session = connection.requests.session  # the envs of this attempt are not wanted
        self.remake(connection, old_session, deadline)
        return None

    def _restore(
        self, connection: HostConnection, history: BlockHistory, given: Any, deadline: float
    ) -> bool:
        """Restores ``connection``'s block from ``history``: its snapshots, then its requests.

        Returns:
            Whether the observations that gave equal ``given`` (env by env; an env given
            nothing, its reset under way, is not compared).
        """
        pool, count = self._pool, connection.block.count
        each = batch_space(self._results.space, count)
        got: dict[int, Any] = {}
        with_states = [i for i, state in enumerate(history.states) if state is not None]
        if with_states:
            states = [history.states[i] for i in with_states]
            env_ids = None if len(with_states) == count else with_states
            for i, answer in zip(
                with_states, self.set_states(connection, states, deadline, env_ids)
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
                connection.block.name,
                connection.block.envs,
                len(history.again),
            )
            return False
        logger.warning(
            "restored %s on %s (%d requests sent again)",
            connection.block.envs,
            connection.block.name,
            len(history.again),
        )
        return True

    def set_states(
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

    def remake(
        self,
        connection: HostConnection,
        old_session: HostSession | None,
        deadline: float,
        fresh: bool = True,
    ) -> None:
        """Re-creates a failed host's envs on ``connection``.

        The new envs are made marked for autoreset, so in NEXT_STEP mode they reset on the step
        after their loss is reported, and in DISABLED mode they wait for the user's reset; in
        SAME_STEP mode they are reset at once, for the report to carry a fresh observation.
        What the trainer gave the lost envs is given again (see ``EnvHistory``). Not ``fresh``:
        made to be restored (not reset in SAME_STEP mode); ``fresh``: once the connection takes
        the failed one's place, the policy marks them lost and their history counts the
        re-creation (``EnvHistory.remade``: nothing kept restores them any longer).

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
        start, stop = connection.block.start, connection.block.stop
        body = dataclasses.replace(
            self._recipe.make(start, stop),
            autoreset_pending=True,
            first_resets=self._history.first_resets(start, stop),
        )
        made = connection.read(
            MakeReply, pool.ask_ok(connection, Command.MAKE, connection.make_body(body), deadline)
        )
        connection.use_layout(made, pool.step_layout)
        got = list(zip(map(space_of, made.observation_spaces), map(space_of, made.action_spaces)))
        if got != self._env_spaces[start:stop]:
            raise RuntimeError(
                f"the envs re-made on {connection.block.name} do not have the spaces of the "
                f"lost {connection.block.envs}"
            )
        for attributes in self._history.set_attr_bodies(start, stop):
            pool.ask_ok(connection, Command.SET_ATTR, attributes, deadline)
        if fresh and self._recipe.autoreset_mode == AutoresetMode.SAME_STEP:
            reset = Reset([None] * connection.block.count)
            reply = pool.ask_ok(connection, Command.RESET, reset, deadline)
            self._ledger.keep_fresh(connection, connection.read(ResetReply, reply))


def lost_reset(connection: HostConnection, body: Reset) -> Pending:
    """Sends a reset that lost ``connection``'s envs again: all of them, masked or not.

    The envs the mask left out are fresh too, so they are reset as well (without a seed)
    and reported with the others; every one carries ``infos["host_failure"]``.
    """
    seeds: list[int | None] = [None] * connection.block.count
    for i, seed in zip(body.env_ids or range(connection.block.count), body.seeds):
        seeds[i] = seed
    return connection.requests.send(Command.RESET, Reset(seeds, body.options), views=True)
