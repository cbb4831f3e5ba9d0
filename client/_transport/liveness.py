"""Whether a host still deserves a wait: its link's reach, its process, the request deadline.

A connection asks its :class:`Liveness` on every round of a wait while it has requests under
way; the answer is None (keep waiting) or the :class:`~.requests.Failure` that ends the wait.
A host is given up on when its connection dropped while a request was under way (it died, froze
or became unreachable), nothing listens at its endpoint any more (it was reached once, then its
connection was refused: it is gone, whenever it went), it stayed unreachable past
``host_timeout_s`` (``connect_timeout_s`` if it was never reached), its local process exited, or
it is alive but has not answered within ``request_timeout_s``; a host a recovery tries
(``refused_fails``) as soon as nothing listens at its endpoint. A remote host not reached yet
is warned about after :data:`PROGRESS_FIRST_S`, then at twice the wait each time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from envserver.errors import HostUnavailableError, RequestTimeoutError
from envserver.wire.reach import Reachability

from .requests import Failure
from .settings import ConnectionSettings

__all__ = ["PROCESS_CHECK_INTERVAL_S", "PROGRESS_FIRST_S", "Liveness"]

logger = logging.getLogger(__name__)

#: How often a wait looks whether a local host's process exited (it also fails the socket).
PROCESS_CHECK_INTERVAL_S = 0.1
#: After how many seconds without reaching a host a first warning says so (then at 2x, 4x...).
PROGRESS_FIRST_S = 5.0


class Liveness:
    """The liveness verdicts on one host (see the module docstring).

    Args:
        endpoint: The host's endpoint, for the log.
        who: How failures name the host and its envs (``host X (envs 0-3)``).
        envs: The envs it holds, for a message that names its process (``envs 0-3``).
        settings: The bounds (``host_timeout_s``, ``connect_timeout_s``, ``request_timeout_s``).
        process: For a local host, a callable that raises ``HostUnavailableError`` (with the
            exit status and log) once its process exited, given a grace period in seconds;
            None for a remote host.
        refused_fails: Whether a connection refused (nothing listens at the endpoint) fails
            it at once, rather than being waited on as a host still starting.
    """

    def __init__(
        self,
        endpoint: str,
        who: str,
        envs: str,
        settings: ConnectionSettings,
        process: Callable[[float], None] | None,
        refused_fails: bool = False,
    ) -> None:
        self._endpoint = endpoint
        self._who = who
        self._envs = envs
        self._settings = settings
        self._process = process
        self._refused_fails = refused_fails
        self._process_check_due = 0.0
        self._next_progress_s = PROGRESS_FIRST_S  # when to say again that it is not reached

    def reached(self) -> None:
        """Notes that the host answered the link: says so if it was warned about."""
        if self._next_progress_s > PROGRESS_FIRST_S:
            logger.info("host %s answered", self._endpoint)

    def verdict(self, reach: Reachability, oldest: float | None) -> Failure | None:
        """Whether to give up on the host now.

        Args:
            reach: Its link's reachability, diagnosed.
            oldest: ``time.monotonic()`` of the send of its oldest request under way (None:
                none is, and only a refusal, or a host reached once whose endpoint now refuses
                connections, fails it).

        Returns:
            The failure, or None to keep waiting.
        """
        if reach.refusal is not None:
            return self.lost(reach.refusal)
        if reach.refused and reach.ever_up:  # it was there, and nothing listens there now
            return self.lost(f"is gone: {reach.why_silent()}")
        if oldest is None:
            return None
        now = time.monotonic()
        if now >= self._process_check_due:  # a system call: not on every poll of a busy wait
            self._process_check_due = now + PROCESS_CHECK_INTERVAL_S
            exited = self._exited(0.0)
            if exited is not None:
                return exited
        if reach.lost_at is not None and reach.lost_at >= oldest:
            return self.lost(
                "lost its connection while a request was under way (it died, froze or became "
                "unreachable)"
            )
        settings = self._settings
        if self._refused_fails and reach.refused:
            return self.lost(f"could not be reached: {reach.why_silent()}")
        if not reach.up and reach.down_since is not None:
            bound = settings.host_timeout_s if reach.ever_up else settings.connect_timeout_s
            waited = now - reach.down_since
            if waited > bound:
                what = "unreachable" if reach.ever_up else "could not be reached"
                return self.lost(f"{what} for {bound:g} s: {reach.why_silent()}")
            # Remote hosts only: a local one is starting, and its process is watched.
            if not reach.ever_up and waited > self._next_progress_s and self._process is None:
                self._next_progress_s *= 2
                logger.warning(
                    "host %s not reached after %.0f s: %s; still trying for up to %g s "
                    "(connect_timeout_s: shorter to hear of a typo sooner, longer for hosts "
                    "still starting; make_vec(..., vector_kwargs={'connect_timeout_s': 10}), "
                    "RemoteVectorEnv(..., connect_timeout_s=10), aio.EnvPool(..., "
                    "connect_timeout_s=10), or envserver rollout "
                    "--connect-timeout 10)",
                    self._endpoint,
                    waited,
                    reach.why_silent(),
                    bound,
                )
        timeout = settings.request_timeout_s
        if timeout is not None and now - oldest > timeout:
            return Failure(
                RequestTimeoutError,
                f"{self._who} is alive but has not answered for {timeout:g} s: an env may hang "
                "in step or reset",
            )
        return None

    def lost(self, reason: str) -> Failure:
        """The failure of a host whose connection was lost for ``reason``.

        A local host whose process exited says so instead, with its exit status and log.
        """
        exited = self._exited(1.0)
        return exited or Failure(HostUnavailableError, f"{self._who} {reason}")

    def _exited(self, grace_s: float) -> Failure | None:
        """The failure of a local host whose process exited (within ``grace_s``), or None."""
        if self._process is None:
            return None
        try:
            self._process(grace_s)
        except HostUnavailableError as exc:
            return Failure(HostUnavailableError, f"{exc}\n(that host held {self._envs})")
        return None
