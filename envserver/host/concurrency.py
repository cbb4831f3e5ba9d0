"""How many of a session's envs a host steps at once: a fixed number, or fitted to the envs.

Threads pay off for envs that wait (I/O, sleeps, a simulator over a socket, C code that waits
with the GIL released): stepping envs that compute in Python on threads gains nothing (they
share the GIL) and costs a hand-off per thread. Envs that compute in C with the GIL released
count as computing too (their thread's CPU time): a host has about one core to itself, as the
embedded hosts (one per core) do. :class:`Concurrency` with ``requested=None`` tells the two
apart from how the envs' steps spend their time, and switches between stepping the envs one after
another and stepping them all at once:

- An env step's *blocked* time is its wall time minus the CPU time of the thread that ran it
  (``time.thread_time``) minus the time that thread waited to be scheduled (the run delay in
  ``/proc/thread-self/schedstat``, where Linux has it). The run delay is left out so that a
  compute-bound env on a busy machine, whose wall time grows while it waits for a core, is not
  mistaken for one that waits.
- Stepping one after another, the first steps are measured, then one in :data:`SAMPLE_EVERY`
  (all its envs together): envs that wait are on threads after five steps. Stepping on
  threads, one env is stepped alone, measured, every :data:`PROBE_EVERY` steps before the others
  go to the pool (each time the next env): threads would blur the measure (a thread waiting for
  the GIL is neither running nor blocked on I/O).
- The decision uses the median of the last :data:`WINDOW` measures, so a step that was slow by
  accident does not count, and two thresholds with a gap (hysteresis) plus a minimum number of
  steps between two switches, so it does not flap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque

__all__ = ["Concurrency", "StepTimer"]

logger = logging.getLogger(__name__)

#: How many measures the decision looks at (their median), and how many it needs at least.
WINDOW = 9
MIN_SAMPLES = 5
#: Stepping in turn, the first WINDOW steps are measured, then one in this many (a measure
#: costs about 6 us: a few percent of a step of 8 CartPole envs, were every step measured).
SAMPLE_EVERY = 8
#: Stepping on threads, one step in this many measures one env alone (costing that env's step
#: time once: about 1% for envs that wait). Rarer than measures in turn, because envs that
#: compute lose little on threads, and envs that wait lose much in turn.
PROBE_EVERY = 128
#: The fewest vector steps between two switches.
DWELL_STEPS = 64
#: Switch to threads when the envs' steps are blocked at least this share of their time ...
THREADS_ABOVE = 0.5
#: ... and each env's step at least this long (less is not worth a thread hand-off).
MIN_BLOCKED_S = 50e-6
#: Switch back to one after another below this share, or below half of MIN_BLOCKED_S.
SERIAL_BELOW = 0.2


class StepTimer:
    """How long a stretch of one thread's work was blocked: neither running nor waiting to run.

    Use :meth:`start` and :meth:`blocked_since` on the same thread. Several threads may
    measure at once (the requests of a session that overlaps them): each reads its own file.
    """

    def __init__(self) -> None:
        self._fds: dict[int, int | None] = {}  # per thread: its schedstat file (None: none)
        self._lock = threading.Lock()

    def _run_delay_s(self) -> float:
        """The calling thread's total time waiting to run, in seconds (0 where unknown)."""
        thread = threading.get_ident()
        fd = self._fds.get(thread, -1)
        if fd == -1:
            fd = None
            with contextlib.suppress(OSError):
                fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            with self._lock:
                self._fds[thread] = fd
        if fd is None:
            return 0.0
        try:
            return int(os.pread(fd, 64, 0).split()[1]) * 1e-9
        except (OSError, IndexError, ValueError):
            return 0.0

    def start(self) -> tuple[float, float, float]:
        """A mark to measure from: wall clock, thread CPU time and run delay."""
        return time.perf_counter(), time.thread_time(), self._run_delay_s()

    def blocked_since(self, mark: tuple[float, float, float]) -> tuple[float, float]:
        """The wall time since ``mark``, and how much of it the thread was blocked."""
        wall = time.perf_counter() - mark[0]
        busy = (time.thread_time() - mark[1]) + (self._run_delay_s() - mark[2])
        return wall, max(0.0, wall - busy)

    def close(self) -> None:
        """Releases the files the run delay is read from (no thread measures any more)."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            if fd is not None:
                os.close(fd)


class Concurrency:
    """How many of a block's envs are stepped at once: fixed, or chosen from how they behave.

    Args:
        num_envs: The envs of the block.
        requested: A fixed number of envs to step at once (capped at ``num_envs``), or None to
            choose between 1 and ``most`` automatically.
        most: The most envs stepped at once when choosing (the host's ``--max-env-threads``).
        threaded: Choosing, start with the envs stepped at once rather than one after another
            (for envs expected to wait: an agent-loop pool's).
    """

    def __init__(
        self, num_envs: int, requested: int | None, most: int, threaded: bool = False
    ) -> None:
        #: Whether the number is chosen from the envs' behaviour.
        self.auto = requested is None
        #: The most envs stepped at once (the size of the block's thread pool).
        self.most = max(1, min(num_envs, most if requested is None else requested))
        #: How many envs are stepped at once now (1: one after another).
        self.threads = 1 if self.auto and not threaded else self.most
        self.timer = StepTimer()
        self._shares: deque[float] = deque(maxlen=WINDOW)
        self._per_env: deque[float] = deque(maxlen=WINDOW)
        self._steps = 0
        self._since_switch = DWELL_STEPS  # the first switch may come at once

    @property
    def measuring(self) -> bool:
        """Whether steps are measured at all (automatic, with more than one env to overlap)."""
        return self.auto and self.most > 1

    def sample_due(self) -> bool:
        """Stepping in turn: counts the step, and says whether to measure it."""
        self._steps += 1
        self._since_switch += 1
        return self._steps <= WINDOW or self._steps % SAMPLE_EVERY == 0

    def probe(self, envs: int) -> int | None:
        """Stepping ``envs`` envs on threads: counts the step; which env to measure alone first.

        Returns:
            The position of the env in the step's work, or None if this step measures none.
            Each probe takes the next env, so that a block whose envs differ is measured as a
            whole.
        """
        self._steps += 1
        self._since_switch += 1
        if self._steps % PROBE_EVERY:
            return None
        return (self._steps // PROBE_EVERY) % envs

    def record(self, wall_s: float, blocked_s: float, envs: int) -> bool:
        """Adds a measure of ``envs`` env steps; maybe switches.

        Args:
            wall_s: The measured steps' wall time.
            blocked_s: How much of it they were blocked.
            envs: How many env steps were measured.

        Returns:
            Whether :attr:`threads` changed.
        """
        if wall_s <= 0:
            return False
        self._shares.append(blocked_s / wall_s)
        self._per_env.append(blocked_s / envs)
        if len(self._shares) < MIN_SAMPLES or self._since_switch < DWELL_STEPS:
            return False
        share, per_env = _median(self._shares), _median(self._per_env)
        if self.threads == 1:
            switch = share >= THREADS_ABOVE and per_env >= MIN_BLOCKED_S
        else:
            switch = share < SERIAL_BELOW or per_env < MIN_BLOCKED_S / 2
        if not switch:
            return False
        self.threads = self.most if self.threads == 1 else 1
        self._since_switch = 0
        logger.debug("envs blocked %.0f%% of their steps, %.0f us each", 100 * share, 1e6 * per_env)
        return True

    def close(self) -> None:
        """Releases what the measures use."""
        self.timer.close()


def _median(values: deque[float]) -> float:
    """The median (the upper one of an even count), cheaper than ``statistics.median``."""
    return sorted(values)[len(values) // 2]
