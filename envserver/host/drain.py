"""A host's stop with a grace period: its sessions are told, and their clients move their envs.

``envserver serve --drain-grace SECONDS``: SIGTERM (Kubernetes' and Compose's stop, Slurm's
``--signal`` before a preemption) starts a drain rather than stopping the host. While it drains,
the host opens no new session (HELLO is refused, so clients pick another host), states the
seconds left in its HEARTBEAT replies (clients move their envs, with their state, at their next
step, and close their sessions), and serves the sessions it has as before. It stops once no
session is left, or when the grace is over. Another request to drain changes nothing: Slurm
signals every process of a job step, so a host forked by ``serve --processes`` is warned twice
(by Slurm and by its parent), and drains once. SIGINT stops a host at once, drain or not.
"""

from __future__ import annotations

import enum
import threading

__all__ = ["Answer", "Drain"]


class Answer(enum.Enum):
    """What a host does when asked to drain (:meth:`Drain.request`)."""

    #: It drains for no time: it is to stop at once.
    STOP = "stop"
    #: Its drain begins.
    DRAIN = "drain"
    #: It drains already: the drain goes on as it was.
    DRAINING = "draining"


class Drain:
    """Whether a host was asked to drain, and until when it does.

    Args:
        grace_s: How long a drain may last (0: a stop request stops the host at once).
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._requested = threading.Event()
        #: When the drain ends (``time.monotonic()``), once it began; None before.
        self.until: float | None = None

    def request(self) -> Answer:
        """Asks for a drain (safe from signal handlers); what the host does now."""
        if self.grace_s <= 0:
            return Answer.STOP
        if self._requested.is_set():
            return Answer.DRAINING
        self._requested.set()
        return Answer.DRAIN

    @property
    def requested(self) -> bool:
        """Whether a drain was asked for."""
        return self._requested.is_set()

    def begin(self, now: float) -> None:
        """Starts the drain's clock."""
        self.until = now + self.grace_s

    def remaining(self, now: float) -> float | None:
        """Seconds left before the host stops (None: it is not draining)."""
        return None if self.until is None else max(0.0, self.until - now)
