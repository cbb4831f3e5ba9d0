"""First-ready batches (``send``/``recv``/``async_reset``), mixed into RemoteVectorEnv."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from client._connection import HostConnection
from client._results import Flight, Ready, check_options, copied, merged, seeds_for
from envserver.batching import check_batch, merge, select
from envserver.protocol import Command, Status

__all__ = ["FirstReadyMixin"]


class FirstReadyMixin:
    """The first-ready half of :class:`client.RemoteVectorEnv` (it holds the state)."""

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Sends actions to some envs without waiting (EnvPool's interface).

        Each host steps its envs in sub-batches of ``sub_batch_size`` and answers each as soon as
        it is done; :meth:`recv` returns the first ``batch_size`` envs to finish. Autoreset per
        env is exactly that of the chosen mode. While envs are in flight, the lockstep methods
        (``step``, ``reset``, ``call``, ...) refuse to run.

        Args:
            actions: A batch of actions, one per env in ``env_ids``, in that order.
            env_ids: The envs to step (default: all); none of them may be in flight.

        Raises:
            ValueError: If ``env_ids`` or the actions are wrong.
            AlreadyPendingCallError: If a lockstep call is pending.
        """
        ids = self._idle_env_ids(env_ids, "send")
        check_batch(self.single_action_space, actions, len(ids))
        self._refuse_finished(ids, "async_reset(env_ids=...)")
        self._recover_failed()
        lost = self._lost[ids]
        if lost.any():  # their host was re-made: their step is the report of that loss
            for connection in self._pool.connections:
                gone = ids[lost & (ids >= connection.start) & (ids < connection.stop)]
                if gone.size:
                    body = self._lost_step(connection, (gone - connection.start).tolist())
                    self._ready.append(Ready.of(connection, gone, body))
                    self._in_flight[gone] = True
            if lost.all():
                return
            actions = select(self.single_action_space, actions, np.flatnonzero(~lost).tolist())
            ids = ids[~lost]
        space = self.single_action_space
        self._fly(
            Command.STEP,
            ids,
            lambda positions, local: {"actions": select(space, actions, positions)},
        )

    def async_reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
        env_ids: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """Resets envs without waiting; :meth:`recv` returns their first observations.

        Args:
            seed: None, an int (env ``i`` gets ``seed + i``) or one per env in ``env_ids``.
            options: Passed to every env's reset.
            env_ids: The envs to reset (default: all); none of them may be in flight.
        """
        check_options(options)
        ids = self._idle_env_ids(env_ids, "async_reset")
        seeds = seeds_for(seed, ids.tolist())
        if len(seeds) != len(ids):
            raise ValueError(f"{len(seeds)} seeds for {len(ids)} envs")
        self._recover_failed()
        self._autoreset_envs[ids] = False
        self._memory.reset(ids.tolist(), seeds, options)
        self._fly(
            Command.RESET,
            ids,
            lambda positions, local: {
                "seeds": [seeds[p] for p in positions],
                "options": options,
            },
        )

    def recv(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Returns the first ``batch_size`` envs to finish after :meth:`send`/:meth:`async_reset`.

        Within a batch, envs are ordered by env id; with the default ``batch_size`` (all envs)
        a ``send`` and ``recv`` pair returns exactly what ``step`` would.

        Args:
            timeout: Seconds to wait; None waits as long as the hosts are alive. Envs still
                in flight after a timeout stay in flight for a later ``recv``.

        Returns:
            Observations, rewards, terminations, truncations and infos of ``batch_size`` envs;
            ``infos["env_id"]`` holds their ids. Reset results have reward 0 and no flags set.

        Raises:
            RuntimeError: If fewer than ``batch_size`` envs are in flight or waiting.
            WaitTimeoutError: If not enough envs finished in time.
        """
        self._assert_is_running()
        if int(self._in_flight.sum()) < self.batch_size:  # counts the received ones too
            raise RuntimeError(
                f"recv needs {self.batch_size} envs, but only "
                f"{int(self._in_flight.sum())} are in flight or waiting: send more first"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._received() < self.batch_size:
            busy = list({connection for connection, _ in self._flights})
            polled, failure = self._pool.poll(busy, deadline, "recv", timeout)
            error: BaseException | None = None
            to_recover: list[HostConnection] = []
            for connection, reply in polled:  # take in every reply before raising any error
                flight = self._flights.get((connection, reply.request_id))
                if flight is None:
                    continue
                lost = connection.lost(reply)
                if lost is not None and self._recoverable(Command.STEP):
                    connection.failed = lost
                    to_recover.append(connection)
                    continue
                ids = self._land([(connection, reply.request_id)])
                try:
                    if reply.status == Status.ERROR:
                        raise connection.error(reply)
                    if flight.command == Command.RESET:
                        self._found(connection, (ids - connection.start).tolist(), reply.body)
                    self._ready.append(Ready.of(connection, ids, reply.body))
                    self._in_flight[ids] = True  # received, not yet handed out
                except Exception as exc:
                    error = error or exc
            if failure is not None:
                failed = [c for c in busy if c.failed is not None and c not in to_recover]
                if self._recoverable(Command.STEP):
                    to_recover += failed
                else:
                    for connection in failed:  # a failed host's envs are no longer in flight
                        self._land([k for k in self._flights if k[0] is connection])
                    error = error or failure
            for connection in to_recover:
                try:
                    self._recover_flights(connection)
                except Exception as exc:
                    error = error or exc
            if error is not None:
                raise error
        return self._take_batch()

    def _received(self) -> int:
        """How many envs have results received and not yet handed out."""
        return sum(len(item.ids) - item.offset for item in self._ready)

    def _land(self, keys: list[tuple[HostConnection, int]]) -> np.ndarray | None:
        """Forgets the requests ``keys`` and marks their envs as no longer in flight."""
        landed = [self._flights.pop(key).ids for key in keys if key in self._flights]
        if not landed:
            return None
        ids = np.concatenate(landed)
        self._in_flight[ids] = False
        return ids

    def _idle_env_ids(self, env_ids: Sequence[int] | np.ndarray | None, method: str) -> np.ndarray:
        self._assert_is_running()
        self._assert_no_pending_call(method)
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        if (
            ids.ndim != 1
            or ids.size == 0
            or not np.issubdtype(ids.dtype, np.integer)
            or ids.min() < 0
            or ids.max() >= self.num_envs
            or np.unique(ids).size != ids.size
        ):
            raise ValueError(
                f"env_ids must be distinct env indices below {self.num_envs}, got {env_ids!r}"
            )
        busy = ids[self._in_flight[ids]]
        if busy.size:
            raise ValueError(f"envs {busy.tolist()} are already in flight: recv them first")
        return ids.astype(np.int64)

    def _fly(
        self,
        command: Command,
        ids: np.ndarray,
        body: Callable[[list[int], list[int]], dict[str, Any]],
    ) -> None:
        """Sends ``command`` for envs ``ids`` as sub-batches, one request per sub-batch.

        All or nothing (``HostPool.send_all``).
        """
        requests, flights = [], []
        for connection in self._pool.connections:
            positions = np.flatnonzero((ids >= connection.start) & (ids < connection.stop))
            for first in range(0, positions.size, self.sub_batch_size):
                chunk = positions[first : first + self.sub_batch_size].tolist()
                local = (ids[chunk] - connection.start).tolist()
                request = {**body(chunk, local), "env_ids": local}
                requests.append((connection, request))
                flights.append(Flight(ids[chunk], command, request))
        request_ids = self._pool.send_all(command, requests)
        for (connection, _), request_id, flight in zip(requests, request_ids, flights):
            self._flights[(connection, request_id)] = flight
        self._in_flight[ids] = True

    def _take_batch(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Hands out the first ``batch_size`` received envs, ordered by env id."""
        n = self.batch_size
        pieces: list[tuple[Ready, slice]] = []
        taken = 0
        while taken < n:  # the first n envs to arrive
            item = self._ready[0]
            take = min(n - taken, len(item.ids) - item.offset)
            pieces.append((item, slice(item.offset, item.offset + take)))
            item.offset += take
            taken += take
            if item.offset == len(item.ids):
                self._ready.popleft()
        env_ids = np.concatenate([item.ids[source] for item, source in pieces])
        rank = np.empty(n, dtype=np.int64)
        rank[np.argsort(env_ids, kind="stable")] = np.arange(n)
        space = self.single_observation_space
        rewards = np.zeros(n, dtype=np.float64)
        terminations = np.zeros(n, dtype=np.bool_)
        truncations = np.zeros(n, dtype=np.bool_)
        infos = self._batch.start()
        first = 0
        for item, source in pieces:
            target = rank[first : first + source.stop - source.start]
            first += len(target)
            self._batch_observations = merged(
                item.connection,
                space,
                self._batch_observations,
                select(space, item.obs, source),
                target.tolist(),
            )
            rewards[target] = item.rewards[source]
            terminations[target] = item.terminations[source]
            truncations[target] = item.truncations[source]
            positions = {
                int(env) - item.connection.start: int(position)
                for env, position in zip(item.ids[source], target)
            }
            entries = [entry for entry in item.entries if entry[0] in positions]
            infos = self._merge_infos(
                infos, item.connection, entries, positions.__getitem__, self._batch
            )
        env_ids = np.sort(env_ids)
        self._in_flight[env_ids] = False
        self._autoreset_envs[env_ids] = terminations | truncations
        infos = self._batch.label(infos, env_ids)
        observations = self._batch_observations
        self._observations = merge(space, self._observations, observations, env_ids.tolist())
        return (
            copied(observations) if self.copy else observations,
            rewards,
            terminations,
            truncations,
            infos,
        )
