"""What ``on_host_failure="restore"`` keeps to bring lost envs back as they were.

Per env: its last snapshot, and what it was sent since (each step's actions, each reset's seed
and options), in order. Lockstep steps send every env the same request; first-ready batches
send each env its own, so each env's history is its own. A recovery restores the snapshots of
a block on the host that replaces it and sends the envs what they were sent since again, round
by round (see ``Recovery``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from envserver.errors import EnvServerError, UnsupportedStateError
from envserver.wire.batching import empty_batch, merge, select
from envserver.wire.bodies import GetState, Reset, Step
from envserver.wire.messages import Command

from ._transport.pool import HostPool

__all__ = ["BlockHistory", "KeptStates", "take_snapshots"]

logger = logging.getLogger(__name__)

#: What an env was sent: a request (a STEP or a RESET) and the env's position in it.
Sent = tuple[Step | Reset, int]


def take_snapshots(pool: HostPool, env_ids: Sequence[int]) -> list[bytes]:
    """Each env's snapshot (GET_STATE), for the envs ``env_ids`` (distinct), in order."""
    states = pool.on_envs(Command.GET_STATE, lambda c, local: GetState(local), env_ids)
    return [bytes(state) for state in states]


@dataclass
class BlockHistory:
    """What brings a block of envs back: their snapshots, and what they were sent since.

    Attributes:
        states: Each env's snapshot, or None for an env whose history starts with a reset.
        again: The requests to send again, in order (env ids are indices in the block).
        under_way: The requests of the envs in flight (their last), not in ``again``.
    """

    states: list[bytes | None]
    again: list[Step | Reset]
    under_way: list[Step | Reset]


class KeptStates:
    """Every env's last snapshot, and what it was sent since.

    Args:
        pool: The hosts (the snapshots are taken there).
        action_space: One env's action space.
        every: How many requests an env is sent between two of its snapshots, at most.
    """

    def __init__(self, pool: HostPool, action_space: gym.Space, every: int) -> None:
        num_envs = sum(connection.count for connection in pool.connections)
        self._pool = pool
        self._space = action_space
        self.every = every
        self._states: list[bytes | None] = [None] * num_envs
        self._sent: list[list[Sent]] = [[] for _ in range(num_envs)]
        # Per env, in arrays (a lockstep step asks about every env): how many requests since
        # its snapshot, and whether it has none.
        self._counts = np.zeros(num_envs, dtype=np.int64)
        self._missing = np.ones(num_envs, dtype=np.bool_)

    @property
    def size(self) -> int:
        """How many bytes the snapshots kept take."""
        return sum(len(state) for state in self._states if state is not None)

    def due(self, ids: np.ndarray | None = None) -> bool:
        """Whether one of the envs ``ids`` (all if None) has no snapshot, or is ``every`` behind."""
        index = slice(None) if ids is None else ids
        return bool(self._missing[index].any() or (self._counts[index] >= self.every).any())

    def keep(self, ids: np.ndarray | None = None) -> None:
        """Takes the snapshots of the envs ``ids`` (all if None; none in flight) if due.

        A host that fails meanwhile leaves the snapshots kept as they were (they and what was
        sent since still hold); it is recovered by the next step.

        Raises:
            UnsupportedStateError: If an env's state cannot be taken: ``"restore"`` cannot
                bring it back.
        """
        if not self.due(ids):
            return
        ids = list(range(len(self._states))) if ids is None else ids.tolist()
        try:
            states = take_snapshots(self._pool, ids)
        except UnsupportedStateError:
            raise
        except EnvServerError as exc:
            logger.warning("the envs' snapshots were not taken (the last ones are kept): %s", exc)
            return
        self.taken(ids, states)

    def retake(self, ids: Sequence[int]) -> None:
        """Takes the snapshots of the envs ``ids`` now (none in flight), due or not.

        After a ``set_attr``: a recovery restores from after it, where an older snapshot would
        undo it (a pickled attribute) or step again without it (see :meth:`keep`'s failures).
        """
        self._missing[list(ids)] = True
        self.keep(np.asarray(ids, dtype=np.int64))

    def taken(self, ids: Sequence[int], states: Sequence[bytes]) -> None:
        """Keeps the snapshots of the envs ``ids``, just taken (or just restored from)."""
        for i, state in zip(ids, states):
            self._states[i] = state
            self._sent[i] = []
        self._counts[ids] = 0
        self._missing[ids] = False

    def forget(self, start: int, stop: int) -> None:
        """Forgets the envs ``start:stop`` (made anew fresh): none can be restored until kept."""
        for i in range(start, stop):
            self._states[i] = None
            self._sent[i] = []
        self._counts[start:stop] = 0
        self._missing[start:stop] = True

    def sent(self, ids: Sequence[int] | None, request: Step | Reset) -> None:
        """Notes a request sent to the envs ``ids`` (all if None; in the request's order)."""
        for position, i in enumerate(range(len(self._states)) if ids is None else ids):
            self._sent[i].append((request, position))
        self._counts[slice(None) if ids is None else ids] += 1

    def of_block(self, start: int, stop: int, in_flight: Collection[int]) -> BlockHistory | None:
        """What a recovery of the envs ``start:stop`` needs; None if one cannot be restored.

        Args:
            start: The block's first env.
            stop: One past its last.
            in_flight: The envs (of all) whose last request was not answered.
        """
        states = self._states[start:stop]
        histories: list[list[Sent]] = []
        under_way: list[list[Sent]] = []
        for i, state in zip(range(start, stop), states):
            sent = self._sent[i]
            if state is None and not (sent and isinstance(sent[0][0], Reset)):
                return None  # neither a snapshot nor a reset to start from
            flying = i in in_flight and bool(sent)
            histories.append(sent[:-1] if flying else sent)
            under_way.append(sent[-1:] if flying else [])
        return BlockHistory(states, self._rounds(histories), self._rounds(under_way))

    def _rounds(self, histories: list[list[Sent]]) -> list[Step | Reset]:
        """The requests that send each env of a block its history again, round by round.

        Round ``r`` sends every env its ``r``-th request: one STEP for the envs stepped, one
        RESET per reset call (each has its options). Env ids are indices in the block.
        """
        requests: list[Step | Reset] = []
        for r in range(max(map(len, histories), default=0)):
            steps: list[tuple[int, Step, int]] = []
            resets: dict[int, tuple[Reset, list[int], list[int | None]]] = {}
            for local, history in enumerate(histories):
                if r >= len(history):
                    continue
                request, position = history[r]
                if isinstance(request, Step):
                    steps.append((local, request, position))
                else:
                    _, ids, seeds = resets.setdefault(id(request), (request, [], []))
                    ids.append(local)
                    seeds.append(request.seeds[position])
            if steps:
                requests.append(self._step(steps, len(histories)))
            for request, ids, seeds in resets.values():
                requests.append(Reset(seeds, request.options, _ids(ids, len(histories))))
        return requests

    def _step(self, steps: list[tuple[int, Step, int]], count: int) -> Step:
        """One STEP of the envs ``steps`` names, each with its action in the request it took."""
        space = self._space
        ids = [local for local, _, _ in steps]
        if all(request is steps[0][1] for _, request, _ in steps):
            actions = select(space, steps[0][1].actions, [position for _, _, position in steps])
        else:
            actions = empty_batch(space, len(steps))
            for j, (_, request, position) in enumerate(steps):
                actions = merge(space, actions, select(space, request.actions, [position]), [j])
        return Step(actions, _ids(ids, count))


def _ids(ids: list[int], count: int) -> list[int] | None:
    """A request's env ids: None where they are the whole block, in order."""
    return None if ids == list(range(count)) else ids
