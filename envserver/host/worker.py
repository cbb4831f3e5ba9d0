"""The envs of one session and the worker loop body that drives them.

:class:`EnvBlock` is the body of Gymnasium's vector worker loop applied to a contiguous block of
envs: it resets, steps and autoresets them exactly as ``gymnasium.vector.SyncVectorEnv`` does in
each :class:`~gymnasium.vector.AutoresetMode`, and returns per-env infos in the order the client
must merge them, so that the client builds the very infos SyncVectorEnv builds.

A block may step and reset its envs concurrently on a small thread pool, for envs that wait
(I/O, sleeps, C code that waits with the GIL released): a fixed number at once
(``env_threads``), or as many as it has when its envs are seen to wait (automatic, see
:mod:`envserver.host.concurrency`). The results are the same, gathered in env order. Each env is
touched by one thread at a time, and the pool lives and dies with the block.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, MultiBinary, MultiDiscrete
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envserver.errors import ProtocolError
from envserver.host.concurrency import Concurrency
from envserver.host.relay import speaker
from envserver.state import Episode, Snapshot, capture, check
from envserver.wire.batching import check_batch

__all__ = ["EnvBlock", "EnvCallError", "InfoEntries"]

logger = logging.getLogger(__name__)

#: Per-env infos in merge order: ``[[local_index, info], ...]``, empty infos left out.
InfoEntries = list[list[Any]]

#: The names of a block's pool threads (``envserver-env_0``, ...).
THREAD_NAME_PREFIX = "envserver-env"

#: Batched spaces whose batches ``iterate`` walks with a plain ``iter`` (checked by check_batch).
_PLAIN_BATCHES = (Box, MultiDiscrete, MultiBinary)

#: Methods that `call` must not reach: they would bypass the autoreset bookkeeping.
RESERVED_CALLS = frozenset({"reset", "step", "close"})


class EnvCallError(Exception):
    """An exception raised by the env at ``index`` (within the block), kept with its index."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"env {index}: {error!r}")
        self.index = index
        self.error = error


class EnvBlock:
    """A block of envs stepped together, with SyncVectorEnv's autoreset semantics.

    Args:
        envs: The envs, already made.
        autoreset_mode: How finished envs are reset.
        env_threads: How many envs to step (and reset) at once, on a thread pool of that many
            threads (at most one per env); 1 steps them one after another, with no pool. None
            chooses: one after another while the envs compute, up to ``max_env_threads`` at
            once while they wait.
        max_env_threads: The most envs stepped at once when ``env_threads`` is None.
        allow_pickle: Whether the envs' snapshots may pickle a layer no other mechanism
            covers (a host started with ``--allow-pickle``; :mod:`envserver.state.pickled`).
        overlap: Whether several requests step the block's envs at once, from threads of
            their own (:mod:`envserver.host.overlap`): the pool then has as many threads as
            envs may be stepped at once from the start, and keeps them as the block grows;
            choosing, the envs start on threads (an agent's envs are expected to wait).
    """

    def __init__(
        self,
        envs: Sequence[gym.Env],
        autoreset_mode: AutoresetMode,
        env_threads: int | None = 1,
        max_env_threads: int = 64,
        allow_pickle: bool = False,
        overlap: bool = False,
    ) -> None:
        self.envs = list(envs)
        self._allow_pickle = allow_pickle
        self.num_envs = len(self.envs)
        self.autoreset_mode = autoreset_mode
        self._requested_threads, self._max_env_threads = env_threads, max_env_threads
        self._overlap = overlap
        sized_for = max_env_threads if overlap else self.num_envs
        self.concurrency = Concurrency(sized_for, env_threads, max_env_threads, threaded=overlap)
        self._pool = self._new_pool()
        #: The envs closed one by one (:meth:`close_envs`): their indices stay theirs.
        self.closed: set[int] = set()
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        #: The observation space's shape (a Box's is a property: read once).
        self._obs_shape = self.single_observation_space.shape
        self._action_spaces: dict[int, gym.Space] = {}
        self._env_obs: list[Any] = [None] * self.num_envs
        self._env_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._autoreset = [False] * self.num_envs  # a list: read and set env by env
        # Envs made anew after a host failure: the seed and options of their first reset.
        self._first_resets: dict[int, tuple[int | None, dict[str, Any] | None]] = {}
        # The record of each episode, for the envs whose snapshots are taken from one.
        self._episodes = [Episode.of(env, allow_pickle) for env in self.envs]
        self._recording = any(episode is not None for episode in self._episodes)

    @classmethod
    def make(
        cls,
        factories: Sequence[Callable[[], gym.Env]],
        autoreset_mode: AutoresetMode,
        env_threads: int | None = 1,
        max_env_threads: int = 64,
        allow_pickle: bool = False,
        overlap: bool = False,
    ) -> EnvBlock:
        """Creates the envs one by one; on failure closes those already made.

        Args:
            factories: One callable per env.
            autoreset_mode: How finished envs are reset.
            env_threads: How many envs to step at once, None to choose (see :class:`EnvBlock`).
            max_env_threads: The most envs stepped at once when choosing.
            allow_pickle: As :class:`EnvBlock`'s.
            overlap: As :class:`EnvBlock`'s.

        Returns:
            The block.

        Raises:
            EnvCallError: If a factory raised or did not return an env.
        """
        envs = _made(factories, 0)
        return cls(envs, autoreset_mode, env_threads, max_env_threads, allow_pickle, overlap)

    def _new_pool(self) -> ThreadPoolExecutor | None:
        """A pool of as many threads as envs are stepped at once at most (None: one)."""
        most = self.concurrency.most
        return ThreadPoolExecutor(most, THREAD_NAME_PREFIX) if most > 1 else None

    def _fit_concurrency(self) -> None:
        """Sizes how many envs are stepped at once, and the pool, to the envs held now."""
        if self._overlap:
            return  # sized once (requests on other threads may be using the pool)
        concurrency = Concurrency(self.num_envs, self._requested_threads, self._max_env_threads)
        if concurrency.most == self.concurrency.most:
            return  # as many at once as before: its measures go on
        self.concurrency.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.concurrency = concurrency
        self._pool = self._new_pool()

    def extend(self, factories: Sequence[Callable[[], gym.Env]]) -> range:
        """Makes more envs, one by one, and adds them after the others (a session that grows).

        Each new env must have the block's spaces (its steps are batched with theirs). On a
        failure the new envs already made are closed, and the block is as it was.

        Returns:
            The new envs' indices.

        Raises:
            EnvCallError: If a factory raised, did not return an env, or returned one whose
                spaces differ from the block's.
        """
        start = self.num_envs
        envs = _made(factories, start)
        for i, env in enumerate(envs, start):
            if (
                env.observation_space != self.single_observation_space
                or env.action_space != self.single_action_space
            ):
                _close_all(envs)
                raise EnvCallError(
                    i,
                    ValueError(
                        f"its spaces ({env.observation_space}, {env.action_space}) differ from "
                        f"the session's ({self.single_observation_space}, "
                        f"{self.single_action_space}): envs that differ need a session each"
                    ),
                )
        self.envs += envs
        self.num_envs = len(self.envs)
        self._env_obs += [None] * len(envs)
        self._env_infos += [{} for _ in envs]
        self._autoreset += [False] * len(envs)
        episodes = [Episode.of(env, self._allow_pickle) for env in envs]
        self._episodes += episodes
        self._recording = self._recording or any(e is not None for e in episodes)
        self._fit_concurrency()
        return range(start, self.num_envs)

    def close_envs(self, env_ids: Sequence[int]) -> None:
        """Closes the envs ``env_ids`` (one that fails to close is logged): the others go on.

        Their indices stay theirs: a command that names one is refused.
        """
        for i in self._targets(env_ids):
            self.closed.add(i)
            _close_all([self.envs[i]], i)
            self.envs[i] = None  # its memory goes with it
            self._env_obs[i] = self._episodes[i] = None
            self._env_infos[i] = {}

    @property
    def open_envs(self) -> int:
        """How many envs the block holds (those closed one by one are not counted)."""
        return self.num_envs - len(self.closed)

    def _observations(
        self, env_ids: Sequence[int] | None, out: Any = None, blanks: bool = False
    ) -> Any:
        """Batches the current observations of ``env_ids`` (all envs if None) into fresh arrays.

        Never reused: a previous batch may still be queued for sending without a copy. Given
        ``out`` (a batch of all envs), written into it instead, as Gymnasium's ``concatenate``
        writes. ``blanks``: some envs may have no observation yet (they raised before their
        first), and get one of zeros.
        """
        space = self.single_observation_space
        if out is not None:
            items = self._env_obs
            dtype, shape = space.dtype, self._obs_shape
            if type(space) is Box and all(
                type(x) is np.ndarray and x.dtype == dtype and x.shape == shape for x in items
            ):  # nothing to cast or broadcast: one assignment (numpy's stack is twice as slow)
                out[...] = items
                return out
            return concatenate(space, items, out)
        items = self._env_obs if env_ids is None else [self._env_obs[i] for i in env_ids]
        if blanks:  # an env not reset yet that failed (env_errors): a blank in its place
            items = [self._blank() if item is None else item for item in items]
        if type(space) is Box:  # the common case in one call, when no item needs a cast
            batch = np.array(items)
            if batch.dtype == space.dtype and batch.shape == (len(items), *self._obs_shape):
                return batch
        out = create_empty_array(space, n=len(items), fn=np.zeros)
        return concatenate(space, items, out)

    def _blank(self) -> Any:
        """An observation of zeros (or empty values), for an env that has none yet."""
        space = self.single_observation_space
        batch = create_empty_array(space, n=1, fn=np.zeros)
        return next(iter(iterate(batch_space(space, 1), batch)))

    def _batched_action_space(self, count: int) -> gym.Space:
        space = self._action_spaces.get(count)
        if space is None:
            space = self._action_spaces[count] = batch_space(self.single_action_space, count)
        return space

    def reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | None,
        env_ids: Sequence[int] | None = None,
        errors: list[EnvCallError] | None = None,
    ) -> tuple[Any, InfoEntries]:
        """Resets the envs (all, or those in ``env_ids``) as SyncVectorEnv.reset does.

        Unlike a step, a reset goes on past an env that raises, so that every other env is in
        a known state afterwards; the first failure is raised at the end.

        Args:
            seeds: One seed (or None) per env reset.
            options: Passed to every env's reset.
            env_ids: The envs to reset, by index in the block; None for all.
            errors: Where the envs that raise go, in order (their observations in the batch
                are their last ones), rather than raising; None raises.

        Returns:
            The batched observations of the envs reset, in ``env_ids`` order, and their info
            entries (keyed by env index).

        Raises:
            EnvCallError: For the first env that raised (without ``errors``).
        """
        work = zip(self._targets(env_ids), seeds)
        run = functools.partial(self._reset_envs, options=options)
        if self.env_threads == 1:
            entries: InfoEntries = []
            failures = run(work, entries)
        else:
            entries, failures = self._on_pool(run, list(work))
        if errors is not None:
            errors += failures
        elif failures:
            raise failures[0] from failures[0].error
        return self._observations(env_ids, blanks=bool(errors)), entries

    def _reset_envs(
        self,
        work: Iterable[tuple[int, int | None]],
        entries: InfoEntries,
        options: dict[str, Any] | None,
    ) -> list[EnvCallError]:
        """Resets env ``i`` with ``seed`` for each ``(i, seed)``; returns the failures."""
        failures = []
        for i, seed in work:
            speaker.env = i
            try:
                self._env_obs[i], info = self._reset_env(i, seed, options)
            except BaseException as exc:
                failures.append(EnvCallError(i, exc))
                continue
            self._env_infos[i] = info
            self._autoreset[i] = False
            if info:
                entries.append([i, info])
        return failures

    def step(
        self,
        actions: Any,
        env_ids: Sequence[int] | None = None,
        obs_out: Any = None,
        errors: list[EnvCallError] | None = None,
        *,
        checked: bool = False,
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, InfoEntries]:
        """Steps envs as SyncVectorEnv.step does, autoresetting per mode.

        When an env raises, the step raises :class:`EnvCallError` for the first env (in
        ``env_ids`` order) that raised. One after another, the envs after it are not stepped,
        as in SyncVectorEnv; with ``env_threads``, every other env is stepped, as in
        AsyncVectorEnv.

        Args:
            actions: Batched actions, one per env stepped.
            env_ids: The envs to step, by index in the block, in the order of ``actions``;
                None for all.
            obs_out: A batch of every env's observation space to write the observations into
                (for all envs only), rather than fresh arrays.
            errors: Where the envs that raise go, in ``env_ids`` order, rather than raising:
                every env is stepped (in turn too), and one that raised has its last
                observation, a reward of 0 and false flags in the batches. None raises.
            checked: Whether ``actions`` are known to fit the batched action space exactly
                (a raw step's, read by its layout): they are not checked again.

        Returns:
            Batched observations, float64 rewards, bool terminations and truncations (all in
            ``env_ids`` order) and info entries (keyed by env index).
        """
        ids = self._targets(env_ids)
        n = len(ids)
        ended: set[int] = set()
        if self.autoreset_mode == AutoresetMode.DISABLED:
            for i in ids:
                if self._autoreset[i]:
                    failure = EnvCallError(
                        i,
                        AssertionError(
                            "stepping an env whose episode ended, with autoreset_mode DISABLED: "
                            "reset it first (options={'reset_mask': ...})"
                        ),
                    )
                    if errors is None:
                        raise failure
                    ended.add(i)
                    errors.append(failure)
        if not checked:
            check_batch(self.single_action_space, actions, n)
        columns = (
            np.zeros(n, dtype=np.float64),
            np.zeros(n, dtype=np.bool_),
            np.zeros(n, dtype=np.bool_),
        )
        batched = self._batched_action_space(n)
        # What gymnasium's iterate does for these spaces, without its single dispatch.
        per_env = iter(actions) if type(batched) in _PLAIN_BATCHES else iterate(batched, actions)
        work = zip(itertools.count(), ids, per_env)
        if ended:
            work = [item for item in work if item[1] not in ended]
        if self.concurrency.threads == 1 or n < 2:
            entries = self._step_in_turn(work, columns, n, errors)
        else:
            entries = self._step_on_pool(list(work), columns, errors)
        if errors and len(errors) > 1:  # in request order, whatever the pool's parts did
            position = {i: p for p, i in enumerate(ids)}
            errors.sort(key=lambda failure: position[failure.index])
        return self._observations(env_ids, obs_out, bool(errors)), *columns, entries

    @property
    def env_threads(self) -> int:
        """How many envs are stepped at once now (1: one after another)."""
        return self.concurrency.threads

    def _step_in_turn(
        self,
        work: Iterable[tuple[int, int, Any]],
        columns: tuple[np.ndarray, np.ndarray, np.ndarray],
        n: int,
        errors: list[EnvCallError] | None,
    ) -> InfoEntries:
        """Steps the envs one after another, measured when the concurrency is automatic.

        The first env that raises stops the step, unless ``errors`` takes the failures.
        """
        entries: InfoEntries = []
        concurrency = self.concurrency
        stop = errors is None
        measured = concurrency.measuring and concurrency.sample_due()
        mark = concurrency.timer.start() if measured else None
        failures = self._step_envs(work, entries, columns, stop_at_failure=stop)
        if mark is not None:
            concurrency.record(*concurrency.timer.blocked_since(mark), envs=n)
        if errors is not None:
            errors += failures
        return entries

    def _step_on_pool(
        self,
        work: list[tuple[int, int, Any]],
        columns: tuple[np.ndarray, np.ndarray, np.ndarray],
        errors: list[EnvCallError] | None,
    ) -> InfoEntries:
        """Steps the envs on the pool; when a probe is due, one of them alone first, measured."""
        concurrency = self.concurrency
        run = functools.partial(self._step_envs, columns=columns, stop_at_failure=False)
        entries: InfoEntries = []
        failures: list[EnvCallError] = []
        probe = concurrency.probe(len(work)) if concurrency.measuring else None
        rest = work
        if probe is not None:
            mark = concurrency.timer.start()
            failures = run(work[probe : probe + 1], entries)
            concurrency.record(*concurrency.timer.blocked_since(mark), envs=1)
            rest = work[:probe] + work[probe + 1 :]
        pooled, pool_failures = self._on_pool(run, rest)
        entries += pooled
        failures += pool_failures
        if probe:  # not the first: its results go back where they belong, in work order
            position = {i: p for p, (_, i, _) in enumerate(work)}
            entries.sort(key=lambda entry: position[entry[0]])  # stable: pairs stay in order
            failures.sort(key=lambda failure: position[failure.index])
        if errors is not None:
            errors += failures
        elif failures:
            raise failures[0] from failures[0].error
        return entries

    def _step_envs(
        self,
        work: Iterable[tuple[int, int, Any]],
        entries: InfoEntries,
        columns: tuple[np.ndarray, np.ndarray, np.ndarray],
        stop_at_failure: bool,
    ) -> list[EnvCallError]:
        """Steps env ``i`` with ``action`` for each ``(k, i, action)``, its results at ``k``.

        Appends the envs' info entries, in order, to ``entries``. Returns the failures, or
        raises the first one if ``stop_at_failure`` (the envs after it are not stepped).
        """
        rewards, terminations, truncations = columns
        next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
        same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        autoreset, env_obs, env_infos = self._autoreset, self._env_obs, self._env_infos
        episodes = self._episodes if self._recording else None
        failures = []
        for k, i, action in work:
            env = self.envs[i]
            speaker.env = i
            final = None
            try:
                if next_step and autoreset[i]:
                    env_obs[i], info = self._reset_env(i, None, None)
                    autoreset[i] = False
                else:
                    obs, rewards[k], terminations[k], truncations[k], info = env.step(action)
                    env_obs[i] = obs
                    if episodes is not None and (episode := episodes[i]) is not None:
                        episode.acted(action, obs)
                    # Only once the step's results were all stored, as SyncVectorEnv.
                    done = autoreset[i] = bool(terminations[k] or truncations[k])
                    if same_step and done:
                        final = {"final_obs": obs, "final_info": info}
                        entries.append([i, final])
                        if episodes is not None and (episode := episodes[i]) is not None:
                            env_obs[i], info = episode.reset(None, None)
                        else:
                            env_obs[i], info = env.reset()
            except BaseException as exc:
                if stop_at_failure:
                    raise EnvCallError(i, exc) from exc
                failures.append(EnvCallError(i, exc))
                continue
            # The env's infos of this step, as the client merges them: the end's, then the reset's.
            env_infos[i] = info if final is None else {**final, **info}
            if info:
                entries.append([i, info])
        return failures

    def _on_pool(
        self, run: Callable[[list[Any], InfoEntries], list[EnvCallError]], work: list[Any]
    ) -> tuple[InfoEntries, list[EnvCallError]]:
        """Splits ``work`` into contiguous parts, one per thread, and runs them on the pool.

        Each env appears once in ``work``, so each is touched by one thread at a time.

        Returns:
            The info entries and the failures of all parts, in ``work`` order.
        """
        assert self._pool is not None
        threads = max(1, min(self.env_threads, len(work)))
        bounds = [len(work) * t // threads for t in range(threads + 1)]
        parts: list[InfoEntries] = [[] for _ in range(threads)]
        said = getattr(speaker, "said", None)  # what the command collects: its threads too

        def part(envs: list[Any], entries: InfoEntries) -> list[EnvCallError]:
            speaker.said = said
            try:
                return run(envs, entries)
            finally:
                speaker.said = None

        futures = [
            self._pool.submit(part, work[bounds[t] : bounds[t + 1]], parts[t])
            for t in range(threads)
        ]
        failures = [failure for future in futures for failure in future.result()]
        return [entry for part in parts for entry in part], failures

    def get_states(self, env_ids: Sequence[int] | None = None) -> list[bytes]:
        """A snapshot of each env (all, or ``env_ids``), as bytes (:mod:`envserver.state`).

        Beside the env stack's state, a snapshot holds this block's bookkeeping of the env:
        its last observation (held once: by the replay, where the replay ends on it), its infos
        (an end step's ``final_obs`` and ``final_info`` too, in SAME_STEP mode), and whether
        its next step resets it.

        Raises:
            EnvCallError: For the first env whose state cannot be taken (its type is
                :class:`~envserver.errors.UnsupportedStateError` when no mechanism covers a
                layer of its stack).
        """
        states = []
        for i in self._targets(env_ids):
            speaker.env = i
            try:
                states.append(self._snapshot(i).to_bytes())
            except BaseException as exc:
                raise EnvCallError(i, exc) from exc
        return states

    def _snapshot(self, i: int) -> Snapshot:
        """Env ``i``'s snapshot with the block's bookkeeping of it (see :meth:`get_states`)."""
        obs = self._env_obs[i]
        extra = {"info": self._env_infos[i], "ended": self._autoreset[i]}
        episode = self._episodes[i]
        if episode is None:
            return capture(self.envs[i], extra | {"obs": obs}, allow_pickle=self._allow_pickle)
        snapshot = episode.capture(extra)
        ends_on = None if snapshot.replay is None else snapshot.replay.last_obs
        if ends_on is None or not data_equivalence(ends_on, obs, exact=True):
            snapshot.extra["obs"] = obs
        return snapshot

    def set_states(
        self, states: Sequence[bytes], env_ids: Sequence[int] | None = None
    ) -> list[list[Any]]:
        """Restores each env (all, or ``env_ids``) from a snapshot :meth:`get_states` took.

        Returns:
            Per env, ``[obs, info, ended]`` of the snapshot's moment: its observation and
            infos, and whether its episode had ended (its next step resets it).

        Raises:
            EnvCallError: For the first env that cannot take its snapshot (a damaged one, or
                one of another env, stack, version or machine); then no env is restored.
        """
        targets = list(self._targets(env_ids))
        restores, moments = [], []
        for i, data in zip(targets, states):  # every snapshot checked before any is restored
            speaker.env = i
            try:
                snapshot = Snapshot.from_bytes(data)
                restores.append(check(self.envs[i], snapshot, allow_pickle=self._allow_pickle))
                moments.append(_moment(snapshot))
            except BaseException as exc:
                raise EnvCallError(i, exc) from exc
        for i, ready, moment in zip(targets, restores, moments):
            speaker.env = i
            try:
                ready.apply()
            except BaseException as exc:  # a layer's own set_state raised, a replay diverged
                if (episode := self._episodes[i]) is not None:
                    episode.lost()
                raise EnvCallError(i, exc) from exc
            if (episode := self._episodes[i]) is not None:
                episode.restored(ready.snapshot)
            self._env_obs[i], self._env_infos[i], self._autoreset[i] = moment
            self._first_resets.pop(i, None)  # its episode is the snapshot's, not a new one
        return [list(moment) for moment in moments]

    def mark_for_autoreset(self) -> None:
        """Makes the next step reset every env (NEXT_STEP), as if their episodes had ended."""
        self._autoreset = [True] * self.num_envs

    def set_first_resets(self, resets: Sequence[tuple[int | None, dict[str, Any] | None]]) -> None:
        """Sets the seed and options of every env's next reset, where that reset gives none.

        For envs made anew in place of lost ones: their first reset, whether an autoreset or
        the trainer's, is seeded and configured as the lost envs were.
        """
        self._first_resets = {i: tuple(r) for i, r in enumerate(resets) if r != (None, None)}

    def _reset_env(
        self, i: int, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any]]:
        if self._first_resets:
            first_seed, first_options = self._first_resets.pop(i, (None, None))
            seed = first_seed if seed is None else seed
            options = options or first_options
        if (episode := self._episodes[i]) is not None:
            return episode.reset(seed, options)
        return self.envs[i].reset(seed=seed, options=options)

    def _targets(self, env_ids: Sequence[int] | None) -> Sequence[int]:
        """The envs a command is for: ``env_ids``, or all; never one closed.

        Raises:
            ProtocolError: If one is closed, or some are and the command names none.
        """
        closed = self.closed
        if closed:
            if env_ids is None:
                raise ProtocolError(
                    f"envs {sorted(closed)} of this session are closed: name the envs (env_ids)"
                )
            for i in env_ids:
                if i in closed:
                    raise ProtocolError(f"env {i} of this session is closed")
        return range(self.num_envs) if env_ids is None else env_ids

    def call(
        self,
        name: str,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        env_ids: Sequence[int] | None = None,
    ) -> list[Any]:
        """Calls method ``name`` (or reads attribute ``name``) on every env, or on ``env_ids``."""
        if name in RESERVED_CALLS:
            raise ValueError(
                f"Trying to call function `{name}` with `call`, use `{name}` directly instead."
            )
        results = []
        for i in self._targets(env_ids):
            speaker.env = i
            try:
                attr = self.envs[i].get_wrapper_attr(name)
                results.append(attr(*args, **kwargs) if callable(attr) else attr)
            except BaseException as exc:
                raise EnvCallError(i, exc) from exc
        return results

    def set_attr(
        self,
        name: str,
        values: Sequence[Any],
        env_ids: Sequence[int] | None = None,
        outermost: bool = False,
    ) -> None:
        """Sets attribute ``name`` on every env (or on ``env_ids``), one value each.

        As Gymnasium's vector envs do (``set_wrapper_attr``: on the wrapper or env that has
        the attribute), or with ``outermost`` as SB3's do (on the outermost wrapper only).
        """
        targets = self._targets(env_ids)
        if len(values) != len(targets):
            raise ValueError(f"expected {len(targets)} values, got {len(values)}")
        for i, value in zip(targets, values):
            speaker.env = i
            try:
                if outermost:
                    setattr(self.envs[i], name, value)
                else:
                    self.envs[i].set_wrapper_attr(name, value)
            except BaseException as exc:
                raise EnvCallError(i, exc) from exc

    def wrappers(self, env_ids: Sequence[int] | None = None) -> list[list[list[str]]]:
        """The wrapper chain of every env (or of ``env_ids``), outermost first.

        Each wrapper is given by the ``module.qualname`` of its class and of every base class
        (its MRO), so that a client can tell ``isinstance`` from names alone, without pickle.
        """
        chains = []
        for i in self._targets(env_ids):
            chain, env = [], self.envs[i]
            while isinstance(env, gym.Wrapper):
                chain.append([f"{c.__module__}.{c.__qualname__}" for c in type(env).__mro__])
                env = env.env
            chains.append(chain)
        return chains

    def render(self) -> list[Any]:
        """Renders every env."""
        frames = []
        for i in self._targets(None):
            env = self.envs[i]
            speaker.env = i
            try:
                frames.append(env.render())
            except BaseException as exc:
                raise EnvCallError(i, exc) from exc
        return frames

    def close(self) -> None:
        """Closes every env (one that fails to close is logged and skipped), then the pool."""
        _close_all(self.envs)  # those closed one by one are None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.concurrency.close()


def _moment(snapshot: Snapshot) -> tuple[Any, dict[str, Any], bool]:
    """A snapshot's ``(obs, info, ended)``: the block's bookkeeping of its env then.

    Raises:
        ProtocolError: If the snapshot does not hold them.
    """
    extra, replay = snapshot.extra, snapshot.replay
    obs = extra.get("obs", None if replay is None else replay.last_obs)
    info, ended = extra.get("info"), extra.get("ended")
    if obs is None or not isinstance(info, dict) or not isinstance(ended, (bool, np.bool_)):
        raise ProtocolError("a snapshot without its env's last observation, infos and end")
    return obs, info, bool(ended)


def _made(factories: Sequence[Callable[[], gym.Env]], start: int) -> list[gym.Env]:
    """Calls each factory (the envs ``start``, ``start + 1``, ...); on failure closes those made.

    Raises:
        EnvCallError: If a factory raised or did not return a ``gymnasium.Env``.
    """
    envs: list[gym.Env] = []
    for i, factory in enumerate(factories, start):
        speaker.env = i
        try:
            env = factory()
            if not isinstance(env, gym.Env):
                raise TypeError(
                    f"the env factory returned {type(env).__qualname__}, not a gymnasium.Env"
                )
        except BaseException as exc:
            _close_all(envs, start)
            raise EnvCallError(i, exc) from exc
        envs.append(env)
    return envs


def _close_all(envs: Sequence[gym.Env | None], start: int = 0) -> None:
    """Closes each env (None: closed already), logging one that fails."""
    for i, env in enumerate(envs, start):
        if env is None:
            continue
        speaker.env = i
        try:
            env.close()
        except BaseException:
            logger.exception("closing env %r failed", env)
