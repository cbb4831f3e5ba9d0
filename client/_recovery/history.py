"""Each env's history: what the trainer gave it and was sent, for re-created and restored envs.

Always, per env: the attributes set with ``set_attr`` (the last value of each, in the order they
were last set), the seed of its last seeded reset, the options of its last reset, and how often
it was re-created. A re-created env gets every attribute again (one ``SET_ATTR`` per
``set_attr`` call still in effect), then at its first reset (an autoreset or the trainer's),
where that reset gives none, the options of the lost env's last reset and the seed
:func:`derived_seed` gives.

With ``on_host_failure="restore"`` (snapshots on), also: its last snapshot, and what it was sent
since (each step's actions, each reset's seed and options), in order. Lockstep steps send every
env the same request; first-ready batches send each env its own, so each env's history is its
own. A recovery restores the snapshots of a block on the host that replaces it and sends the
envs what they were sent since again, round by round (:meth:`EnvHistory.of_block`).
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from envserver.errors import EnvServerError, UnsupportedStateError
from envserver.wire.batching import empty_batch, merge, select
from envserver.wire.bodies import GetState, Reset, SetAttr, Step
from envserver.wire.messages import Command

from .._transport.pool import HostPool

__all__ = ["BlockHistory", "EnvHistory", "derived_seed", "take_snapshots"]

logger = logging.getLogger(__name__)

#: What an env was sent: a request (a STEP or a RESET) and the env's position in it.
Sent = tuple[Step | Reset, int]


def derived_seed(last_seed: int | None, restarts: int) -> int | None:
    """The seed of an env's first reset after its ``restarts``-th re-creation.

    Derived from the seed the env was last reset with, so a rerun reproduces, and from the
    restart count, so a second re-creation does not repeat the first; envs seeded apart stay
    apart (``numpy.random.SeedSequence`` mixes both). An env never seeded stays unseeded.
    """
    if last_seed is None:
        return None
    state = np.random.SeedSequence(last_seed, spawn_key=(restarts,)).generate_state(1)
    return int(state[0])


def take_snapshots(pool: HostPool, env_ids: Sequence[int]) -> list[bytes]:
    """Each env's snapshot (GET_STATE), for the envs ``env_ids`` (distinct), in order."""
    states = pool.on_envs(Command.GET_STATE, lambda c, local: GetState(local), env_ids)
    return [bytes(state) for state in states]


def _copied(value: Any) -> Any:
    """A copy to give again later, unaffected by what the trainer does to its own object."""
    try:
        return copy.deepcopy(value)
    except Exception:  # not copyable: give the object itself
        return value


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


class EnvHistory:
    """Per env, what a re-created env is given again, and (snapshots on) what restores it.

    Args:
        pool: The hosts (the snapshots are taken there).
        action_space: One env's action space.
        snapshot_every: How many requests an env is sent between two of its snapshots, at
            most; None for no snapshots (``on_host_failure`` other than ``"restore"``).
    """

    def __init__(self, pool: HostPool, action_space: gym.Space, snapshot_every: int | None) -> None:
        num_envs = sum(connection.block.count for connection in pool.connections)
        self._pool = pool
        self._space = action_space
        #: Whether snapshots and the requests since are kept (``"restore"``). Without, a step
        #: is of no interest: callers need not build one to note it.
        self.keeps_snapshots = snapshot_every is not None
        self._every = snapshot_every or 0
        self._seeds: list[int | None] = [None] * num_envs
        self._options: list[dict[str, Any] | None] = [None] * num_envs
        self._restarts = [0] * num_envs
        # Per env: (name, outermost) -> (order of the set_attr call, value).
        self._attributes: list[dict[tuple[str, bool], tuple[int, Any]]] = [
            {} for _ in range(num_envs)
        ]
        self._calls = itertools.count()
        self._states: list[bytes | None] = [None] * num_envs
        self._sent: list[list[Sent]] = [[] for _ in range(num_envs)]
        # Per env, in arrays (a lockstep step asks about every env): how many requests since
        # its snapshot, and whether it has none.
        self._counts = np.zeros(num_envs, dtype=np.int64)
        self._missing = np.ones(num_envs, dtype=np.bool_)

    def grow(self, count: int = 1) -> range:
        """Adds ``count`` envs with nothing kept yet, and returns their indices.

        An agent-loop pool's envs come one by one.
        """
        start = len(self._states)
        self._seeds += [None] * count
        self._options += [None] * count
        self._restarts += [0] * count
        self._attributes += [{} for _ in range(count)]
        self._states += [None] * count
        self._sent += [[] for _ in range(count)]
        self._counts = np.concatenate([self._counts, np.zeros(count, dtype=np.int64)])
        self._missing = np.concatenate([self._missing, np.ones(count, dtype=np.bool_)])
        return range(start, start + count)

    def due(self, i: int) -> bool:
        """Whether env ``i``'s snapshot is due (snapshots on).

        Due: it has none, or ``snapshot_every`` requests were sent since its last.
        """
        return self.keeps_snapshots and bool(self._missing[i] or self._counts[i] >= self._every)

    # ------------------------------------------------------------- what the trainer did

    def sent(self, ids: Sequence[int] | None, request: Step | Reset) -> None:
        """Notes a request sent to the envs ``ids`` (all if None; in the request's order).

        A reset's seeds (None keeps the last seed) and options are kept for re-created envs;
        with snapshots on, the request is kept for a restore too.
        """
        envs = range(len(self._states)) if ids is None else ids
        if isinstance(request, Reset):
            options = _copied(request.options) if request.options else None
            for i, seed in zip(envs, request.seeds):
                if seed is not None:
                    self._seeds[i] = seed
                self._options[i] = options
            if request.options:  # kept as given, whatever the trainer does to its dict later
                request = Reset(request.seeds, options, request.env_ids)
        if self.keeps_snapshots:
            for position, i in enumerate(envs):
                self._sent[i].append((request, position))
            self._counts[slice(None) if ids is None else ids] += 1

    def set_attr(self, name: str, values: dict[int, Any], outermost: bool) -> None:
        """Notes a ``set_attr`` call: ``values`` by env index (none of them in flight).

        With snapshots on, those envs take theirs again now: a restore starts from after the
        call, where an older snapshot would undo it (a pickled attribute) or step again
        without it.
        """
        call = next(self._calls)
        for i, value in values.items():
            attributes = self._attributes[i]
            attributes.pop((name, outermost), None)  # moves to the end: the order last set
            attributes[(name, outermost)] = (call, _copied(value))
        if self.keeps_snapshots:
            ids = np.fromiter(values, dtype=np.int64, count=len(values))
            self._missing[ids] = True
            self.snapshot_due(ids)

    def remade(self, start: int, stop: int) -> None:
        """Counts a re-creation of envs ``start..stop-1``, fresh: nothing kept restores them."""
        for i in range(start, stop):
            self._restarts[i] += 1
            self._states[i] = None
            self._sent[i] = []
        self._counts[start:stop] = 0
        self._missing[start:stop] = True

    # ------------------------------------------------------------- snapshots

    def snapshot_due(self, ids: np.ndarray | None = None) -> None:
        """Takes the snapshots of the envs ``ids`` (all if None; none in flight) that are due.

        An env is due with no snapshot, or ``snapshot_every`` requests after its last. A host
        that fails meanwhile leaves the snapshots kept as they were (they and what was sent
        since still hold); it is recovered by the next step. Only with snapshots on.

        Raises:
            UnsupportedStateError: If an env's state cannot be taken: ``"restore"`` cannot
                bring it back.
        """
        index = slice(None) if ids is None else ids
        if not (self._missing[index].any() or (self._counts[index] >= self._every).any()):
            return
        ids = list(range(len(self._states))) if ids is None else ids.tolist()
        try:
            states = take_snapshots(self._pool, ids)
        except UnsupportedStateError:
            raise
        except EnvServerError as exc:
            logger.warning("the envs' snapshots were not taken (the last ones are kept): %s", exc)
            return
        self.snapshots_taken(ids, states)

    def snapshots_taken(self, ids: Iterable[int], states: Sequence[bytes]) -> None:
        """Keeps the snapshots of the envs ``ids``, just taken or restored from (snapshots on)."""
        if not self.keeps_snapshots:
            return
        ids = list(ids)
        for i, state in zip(ids, states):
            self._states[i] = state
            self._sent[i] = []
        self._counts[ids] = 0
        self._missing[ids] = False

    # ------------------------------------------------------------- what envs get again

    def set_attr_bodies(self, start: int, stop: int) -> list[SetAttr]:
        """``SET_ATTR`` bodies that set the attributes of envs ``start..stop-1`` again.

        One per ``set_attr`` call still in effect for them, in call order; env ids are local
        to the block.
        """
        calls: dict[int, SetAttr] = {}
        for local, attributes in enumerate(self._attributes[start:stop]):
            for (name, outermost), (call, value) in attributes.items():
                body = calls.setdefault(call, SetAttr(name, [], [], outermost))
                body.values.append(value)
                body.env_ids.append(local)
        return [calls[call] for call in sorted(calls)]

    def first_resets(self, start: int, stop: int) -> list[list[Any]]:
        """``[seed, options]`` of the first reset of envs ``start..stop-1`` re-created."""
        return [
            [derived_seed(self._seeds[i], self._restarts[i] + 1), self._options[i]]
            for i in range(start, stop)
        ]

    def of_block(self, start: int, stop: int, in_flight: Collection[int]) -> BlockHistory | None:
        """What a restore of the envs ``start:stop`` needs; None if one cannot be restored.

        Args:
            start: The block's first env.
            stop: One past its last.
            in_flight: The envs (of all) whose last request was not answered.
        """
        if not self.keeps_snapshots:
            return None
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
