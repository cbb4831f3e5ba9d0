"""A host's stop with a grace period: its sessions are told, and their clients move their envs.

``envserver serve --drain-grace SECONDS``: the first SIGTERM (Kubernetes' and Compose's stop,
Slurm's ``--signal`` before a preemption) starts a drain rather than stopping the host. While it
drains, the host opens no new session (HELLO is refused, so clients pick another host), states
the seconds left in its HEARTBEAT replies (clients move their envs, with their state, at their
next step, and close their sessions), and serves the sessions it has as before. It stops once
no session is left, or when the grace is over; a second signal stops it at once.
"""

from __future__ import annotations

import threading

__all__ = ["Drain"]


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

    def request(self) -> bool:
        """Asks for a drain (safe from signal handlers).

        Returns:
            Whether a drain is what the host does now: False if it drains for no time, or was
            asked already (then it is to stop at once).
        """
        if self.grace_s <= 0 or self._requested.is_set():
            return False
        self._requested.set()
        return True

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
