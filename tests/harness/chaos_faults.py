"""The faults of the chaos soak (tests/harness/chaos.py): what they are, how they are planned,
and the injector that applies and undoes them while the trainer steps.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence

from chaos_hosts import ChaosHost, Cluster

POLL_S = 0.05
#: The most faults under way at once (a host down for each).
MAX_ACTIVE_FAULTS = 3

logger = logging.getLogger("chaos")


# --------------------------------------------------------------------- faults


class Kind(str, enum.Enum):
    """What a fault does to a host."""

    KILL = "kill"  # SIGKILL; a new process on the same port a little later
    STOP = "stop"  # SIGSTOP for longer than host_timeout_s, then SIGCONT
    RESTART = "restart"  # SIGKILL and a new process on the same port at once
    CUT = "cut"  # link down for longer than host_timeout_s, then up (namespaced hosts)


@dataclasses.dataclass
class Fault:
    """One fault injected, and what it met.

    Attributes:
        kind: What was done.
        host: The host's name.
        began: When (``time.monotonic()``).
        heal_at: When it is to be undone.
        hit: Whether the host held the trainer's envs then (it was one of ``envs.hosts``).
        overlapped: Whether another fault was still under way when it began.
        during_recovery: Whether the trainer was recovering from a failure when it began.
        healed: When it was undone, or None.
        pid: The process it hit.
    """

    kind: Kind
    host: str
    began: float
    heal_at: float
    hit: bool
    overlapped: bool
    during_recovery: bool
    healed: float | None = None
    pid: int | None = None


class Aim(str, enum.Enum):
    """Which hosts a fault may fall on (when there is none such, any free host)."""

    HIT = "hit"  # one holding the trainer's envs
    IDLE = "idle"  # one holding none
    ANY = "any"


#: How long faults last, in ``host_timeout_s``: a kill until the host is started again, a stop
#: or a cut until it is undone (longer than the liveness timeout).
LASTS = {
    Kind.KILL: (0.3, 1.5),
    Kind.RESTART: (0.0, 0.0),
    Kind.STOP: (1.5, 3.5),
    Kind.CUT: (1.5, 3.5),
}


@dataclasses.dataclass(frozen=True)
class Act:
    """One step of a fault plan.

    Attributes:
        kinds: The faults, each on another host.
        aims: Where each of them falls (default: on hosts holding the trainer's envs).
        gap_s: Seconds to wait before it.
        during_recovery: Begin ``kinds[1:]`` once the trainer is recovering (from the first).
        settle: Before it, wait until every earlier fault was undone and the rollout went on.
        lasts: How long the faults last, in ``host_timeout_s`` (default: :data:`LASTS`).
    """

    kinds: tuple[Kind, ...]
    aims: tuple[Aim, ...] = ()
    gap_s: float = 0.5
    during_recovery: bool = False
    settle: bool = False
    lasts: tuple[float, float] | None = None

    def faults(self) -> list[tuple[Kind, Aim, tuple[float, float]]]:
        """Each fault's kind, aim and span of durations."""
        aims = self.aims or (Aim.HIT,) * len(self.kinds)
        return [(k, a, self.lasts or LASTS[k]) for k, a in zip(self.kinds, aims, strict=True)]


def random_plan(rng: random.Random, kinds: Sequence[Kind]) -> Iterator[Act]:
    """An endless random plan: single faults, two at once, and faults during a recovery."""
    while True:
        roll = rng.random()
        chosen = (rng.choice(kinds), rng.choice(kinds))
        aims = tuple(Aim.HIT if rng.random() < 0.8 else Aim.ANY for _ in chosen)
        gap_s = rng.uniform(0.5, 3.5)
        if roll < 0.6:
            yield Act(chosen[:1], aims[:1], gap_s)
        else:
            yield Act(chosen, aims, gap_s, during_recovery=roll >= 0.8)


class Watch(logging.Handler):
    """Counts the client's recoveries from its log: begun, resumed, re-made (by env range)
    and restored.

    Only while :attr:`listening`: a trainer with a second vector env on the same hosts steps
    it with the watch deaf, so that its recoveries are not counted as the first one's.

    It can also hold the trainer at the start of its next recovery (:meth:`hold_next`), so that
    faults begin during a recovery for certain, however quickly that recovery would end.
    """

    _REMADE = re.compile(r"^re-made envs? (\d+)(?:-(\d+))? on ")
    _RESTORED = re.compile(r"^restored envs? (\d+)(?:-(\d+))? on ")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.begun = 0
        self.resumed = 0
        self.remade: Counter[int] = Counter()  # env index -> times its host was re-made
        self.remakes = 0
        self.restores = 0  # on_host_failure="restore": recoveries that restored the envs
        self.lines: list[str] = []
        self.listening = True
        self.held = threading.Event()  # a recovery is waiting at its start (see hold_next)
        self._release: threading.Event | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.lines.append(f"{record.created:.3f} {'' if self.listening else '(other) '}{message}")
        if not self.listening:
            return
        if "; recovering (" in message:
            self.begun += 1
            release, self._release = self._release, None
            if release is not None:  # in the recovering thread, before the recovery goes on
                self.held.set()
                release.wait(60)
        elif message.startswith("resumed the session on "):
            self.resumed += 1
        elif self._RESTORED.match(message):
            self.restores += 1
        elif found := self._REMADE.match(message):
            first = int(found.group(1))
            last = int(found.group(2) or first)
            self.remakes += 1
            self.remade.update(range(first, last + 1))

    def hold_next(self) -> threading.Event:
        """Makes the next recovery wait at its start until the returned event is set.

        The recovering thread waits at most a minute, in case the holder never sets it.
        """
        self.held.clear()
        self._release = threading.Event()
        return self._release

    def under_way(self) -> bool:
        """Whether a recovery has begun and not yet ended."""
        return self.begun > self.resumed + self.remakes + self.restores


class Injector:
    """Runs a fault plan on a cluster from a thread of its own, and undoes every fault.

    Args:
        cluster: The hosts.
        rng: Where every choice comes from (targets, durations).
        host_timeout_s: The trainer's liveness timeout (stops and cuts last longer).
        watch: The trainer's recoveries (faults during one).
        in_use: The endpoints holding the trainer's envs now.
        progress: When the trainer last completed a vector step (``time.monotonic()``).
    """

    def __init__(
        self,
        cluster: Cluster,
        rng: random.Random,
        host_timeout_s: float,
        watch: Watch,
        in_use: Callable[[], set[str]],
        progress: Callable[[], float],
    ) -> None:
        self.cluster = cluster
        self.faults: list[Fault] = []
        self.skipped = 0  # faults of the plan not injected: no host free for them
        self.error: BaseException | None = None
        self.finished = threading.Event()  # the plan is done (or failed)
        self._rng = rng
        self._host_timeout_s = host_timeout_s
        self._watch = watch
        self._in_use = in_use
        self._progress = progress
        self._active: list[Fault] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, plan: Iterable[Act]) -> None:
        """Starts running ``plan``."""
        self._thread = threading.Thread(
            target=self._run, args=(plan,), name="chaos-injector", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops the plan and undoes every fault still under way (hosts all up after)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(120)
            if self._thread.is_alive():
                raise RuntimeError("the fault injector did not stop")
        for fault in list(self._active):
            self._heal(fault)

    def _run(self, plan: Iterable[Act]) -> None:
        try:
            for act in plan:
                if not self._sleep(act.gap_s) or (act.settle and not self._settle()):
                    break
                self._act(act)
            self._settle()
        except BaseException as exc:
            self.error = exc
            logger.exception("the fault injector failed")
        finally:
            self.finished.set()

    def _act(self, act: Act) -> None:
        """Begins the faults of ``act``."""
        first, *rest = act.faults()
        if not act.during_recovery:
            for fault in (first, *rest):
                self._begin(*fault)
            return
        # The next ones once the trainer is recovering from the first: the watch holds the
        # trainer at the start of that recovery until they have begun (one from a killed host
        # on loopback can end within a millisecond), and the first fault lasts until then.
        release = self._watch.hold_next()
        try:
            leading = self._begin(*first)
            if leading is None:
                return
            heal_at, leading.heal_at = leading.heal_at, math.inf
            deadline = time.monotonic() + 4 * self._host_timeout_s + 10
            while not self._watch.held.is_set() and time.monotonic() < deadline:
                if not self._sleep(0.01):
                    return
            for fault in rest:
                self._begin(*fault)
            leading.heal_at = max(heal_at, time.monotonic() + self._host_timeout_s / 2)
        finally:
            release.set()

    def _sleep(self, seconds: float) -> bool:
        """Waits ``seconds``, undoing faults when due; False if asked to stop meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            for fault in [f for f in self._active if f.heal_at <= now]:
                self._heal(fault)
            if self._stopping.is_set():
                return False
            if now >= deadline:
                return True
            due = min([f.heal_at for f in self._active] + [deadline])
            self._stopping.wait(max(0.0, min(due, deadline) - now))

    def _settle(self, timeout_s: float = 60.0) -> bool:
        """Waits until no fault is under way, no recovery either, and the rollout went on."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            healed = max((f.healed or 0.0 for f in self.faults), default=0.0)
            if not self._active and not self._watch.under_way() and self._progress() > healed:
                return True
            if not self._sleep(POLL_S):
                return False
        return not self._stopping.is_set()

    def _target(self, kind: Kind, aim: Aim) -> ChaosHost | None:
        """A free host for a fault of ``kind``, as ``aim`` says if there is such a host."""
        if len(self._active) >= MAX_ACTIVE_FAULTS:
            return None
        busy = {fault.host for fault in self._active}
        free = [
            h
            for h in self.cluster.hosts
            if h.name not in busy and (kind != Kind.CUT or h.namespace is not None)
        ]
        in_use = self._in_use()
        aimed = {
            Aim.HIT: [h for h in free if h.endpoint in in_use],
            Aim.IDLE: [h for h in free if h.endpoint not in in_use],
            Aim.ANY: free,
        }[aim]
        choices = aimed or free
        return self._rng.choice(choices) if choices else None

    def _begin(self, kind: Kind, aim: Aim, lasts: tuple[float, float]) -> Fault | None:
        """Injects one fault of ``kind`` on a host ``aim`` says, for a time within ``lasts``.

        Returns:
            The fault, or None if no host could take it.
        """
        host = self._target(kind, aim)
        if host is None:
            self.skipped += 1
            return None
        lasts_s = self._host_timeout_s * self._rng.uniform(*lasts)
        now = time.monotonic()
        fault = Fault(
            kind,
            host.name,
            began=now,
            heal_at=now + lasts_s,
            hit=host.endpoint in self._in_use(),
            overlapped=bool(self._active),
            during_recovery=self._watch.under_way(),
            pid=host.pid,
        )
        self.faults.append(fault)
        self._active.append(fault)
        logger.info("fault: %s %s (pid %s)", kind.value, host.name, host.pid)
        if kind in (Kind.KILL, Kind.RESTART):
            self.cluster.killed_pids.add(host.kill())
            if kind == Kind.RESTART:
                self._heal(fault)
        elif kind == Kind.STOP:
            host.freeze(True)
        else:
            host.unplug(True)
        return fault

    def _heal(self, fault: Fault) -> None:
        """Undoes ``fault``: the host runs and is reachable again."""
        host = next(h for h in self.cluster.hosts if h.name == fault.host)
        if fault.kind in (Kind.KILL, Kind.RESTART):
            host.start()
        elif fault.kind == Kind.STOP:
            host.freeze(False)
        else:
            host.unplug(False)
        fault.healed = time.monotonic()
        self._active.remove(fault)
