"""The one candidate loop: where a host's envs may go, tried in turn within a deadline.

A failed host's envs go back to its endpoint (a respawned process for a local host) or, for a
host of the host list, to the next candidate, with backoff between rounds of every candidate,
until ``restart_timeout_s``; a draining host's envs go to one of the other candidates, in one
round. Either way only a connection whose attempt succeeded takes the host's place.
"""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

from envserver.errors import EnvServerError, HostUnavailableError, WaitTimeoutError
from envserver.launch.launcher import Launcher

from .._options import VectorOptions
from .._transport.block import HostBlock
from .._transport.connection import HostConnection
from .._transport.discovery import Discovery
from .._transport.pool import HostPool
from .._transport.requests import Failure

__all__ = ["Reconnector"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Brings a host's envs up on a connection before the deadline, or raises ``EnvServerError``.
Attempt = Callable[[HostConnection, float], _T]


class Reconnector:
    """Tries the candidates for a host's envs until an attempt on one succeeds.

    Args:
        pool: The hosts.
        options: The vector env's options (``restart_timeout_s``, timeouts, spares).
        launcher: What started the hosts (local hosts, Ray actors): it replaces a lost one; or
            None.
        discovery: How the host list's specs resolve (replacements for a lost host), or None.
    """

    def __init__(
        self,
        pool: HostPool,
        options: VectorOptions,
        launcher: Launcher | None = None,
        discovery: Discovery | None = None,
    ) -> None:
        self._pool = pool
        self._options = options
        self._launcher = launcher
        self._discovery = discovery
        # Where an attempt found nothing: addresses where no connection came up (a lost node's
        # other hosts are not worth a wait each) and endpoints where nothing listens. Tried
        # after the others, until an attempt there succeeds.
        self._unreachable: set[str] = set()

    def replace(
        self, failed: HostConnection, what: str, attempt: Attempt[_T]
    ) -> tuple[HostConnection, _T]:
        """Retries ``attempt`` on new connections for a failed host until it succeeds.

        An interrupted recovery (Ctrl-C) leaves the failed host as it was, to be recovered
        again by the next wait; an attempt that raises what is not a host's failure (the envs'
        spaces changed, say) gives the host up.

        Returns:
            The new connection, in the failed one's place, and what ``attempt`` returned.

        Raises:
            HostUnavailableError: If nothing worked in time.
        """
        logger.warning("%s; recovering (%s)", failed.health.failure.message, what)
        deadline = time.monotonic() + self._options.restart_timeout_s
        found = self.run(failed, attempt, deadline, leaving=False)
        assert found is not None  # a failed host's search ends in a host or raises
        return found

    def run(
        self, source: HostConnection, attempt: Attempt[_T], deadline: float, leaving: bool
    ) -> tuple[HostConnection, _T] | None:
        """The candidate loop: ``source``'s envs tried on each candidate until one takes them.

        Args:
            source: The connection whose envs go (failed, or ``leaving``: it drains).
            attempt: Brings the envs up on a connection before a deadline.
            deadline: When to stop trying.
            leaving: The host still runs (it drains): one round of the other candidates, no
                backoff, and None if none took the envs.

        Returns:
            The new connection, in ``source``'s place (which is dropped), and what ``attempt``
            returned; None if no candidate took the envs of a host ``leaving``.
        """
        pool = self._pool
        index = pool.connections.index(source)
        block = source.block
        attempt_s = self._attempt_s()
        delay, tries = 0.1, 0
        tried: set[str] = set()
        told: dict[str, str] = {}  # each endpoint's last failure warned about (once per reason)
        while True:
            endpoints = self._candidates(source, index, fresh=tries == 0)
            if leaving:
                endpoints = [e for e in endpoints if e != block.endpoint]
            untried = [e for e in endpoints if e not in tried]
            if leaving and (not untried or time.monotonic() >= deadline):
                return None  # one round of the others, within the deadline
            if not endpoints:  # its launcher has no host for it yet (a Ray actor restarting)
                tries += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._unrecovered(source, ": what started it gave no host")
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 2.0)
                continue
            if not untried:  # every candidate failed once: go round again
                tried.clear()
                untried = endpoints
            endpoint = untried[0]
            tried.add(endpoint)
            tries += 1
            connection = None
            try:
                connection = self._open(index, endpoint, block)
                result = attempt(connection, min(deadline, time.monotonic() + attempt_s))
            except EnvServerError as exc:
                reason = _attempt_failure(connection, exc)
                self._drop_attempt(endpoint, connection)
                if leaving:
                    logger.info(
                        "%s did not take the envs of draining %s: %s", endpoint, block.name, reason
                    )
                else:
                    where = block.name if endpoint == block.endpoint else f"host {endpoint}"
                    level = logging.INFO if told.get(endpoint) == reason else logging.WARNING
                    told[endpoint] = reason
                    logger.log(level, "recovery attempt %d on %s failed: %s", tries, where, reason)
                remaining = deadline - time.monotonic()
                if remaining > 0 and not leaving and tried.issuperset(endpoints):  # back off
                    time.sleep(min(delay, remaining))
                    delay = min(delay * 2, 2.0)
                if leaving or time.monotonic() < deadline:
                    continue
                last = f"; last error: {_unnamed(reason, block.name)}"
                raise self._unrecovered(source, last) from exc
            except BaseException as exc:  # interrupted, or not a host failure
                if connection is not None:
                    pool.drop(connection)
                if isinstance(exc, Exception) and not leaving:  # its envs cannot come back
                    source.health.failure = None
                    source.health.fail(f"could not be made anew: {exc!r}")
                raise
            self._unreachable.difference_update((endpoint, _address(endpoint)))  # found
            pool.drop(pool.install(index, connection))
            return connection, result

    def _candidates(self, source: HostConnection, index: int, fresh: bool) -> list[str]:
        """Where a host's envs may go, best first (looked up anew on every try).

        A launched host: where its launcher starts it again (a local host is respawned in
        place; see ``Launcher.replacements``). A host of the host list: its endpoint (or, for
        an address of a ``dns://`` or ``slurm://`` spec, what the spec names now: see
        ``Discovery.replacements``), then the other candidates, fewest envs of this vector env
        first (an idle spare before one in use), ties in that order; endpoints where an
        attempt found nothing (nothing listens there, or no connection came up at their
        address) come after the others.
        """
        block = source.block
        if self._launcher is not None:
            return self._launcher.replacements(index, block.endpoint, fresh)
        if self._discovery is None:
            return [block.endpoint]
        others = [c for c in self._pool.connections if c is not source]
        candidates = self._discovery.replacements(
            block.endpoint, {c.block.endpoint for c in others}, self._options.spare_hosts
        )
        load = collections.Counter[str]()
        for connection in others:
            load[connection.block.endpoint] += connection.block.count
        same = candidates[:1] if candidates[:1] == [block.endpoint] else []  # resumes first
        candidates = same + sorted(candidates[len(same) :], key=lambda e: load[e])
        unreachable = self._unreachable
        return sorted(candidates, key=lambda e: e in unreachable or _address(e) in unreachable)

    def _open(self, index: int, endpoint: str, block: HostBlock) -> HostConnection:
        """A connection to ``endpoint`` to try for host ``index``, with the envs of ``block``.

        Nothing listening there fails it at once (the next candidate is tried), but for a
        launched host, which may still be starting.
        """
        return self._pool.open(
            index, endpoint, block.start, block.count, refused_fails=self._launcher is None
        )

    def _drop_attempt(self, endpoint: str, connection: HostConnection | None) -> None:
        """Drops the connection of an attempt at ``endpoint`` that failed, noting what it found.

        Where nothing was found is tried last: the endpoint where nothing listens (the address
        answered), the address where no connection came up.
        """
        if connection is not None and connection.link.reach.refused:
            self._unreachable.add(endpoint)
        elif connection is None or not connection.link.reach.ever_up:
            self._unreachable.add(_address(endpoint))
        if connection is not None:
            self._pool.drop(connection)

    def _attempt_s(self) -> float:
        """How long one attempt on one endpoint may take (room left for the other candidates).

        A launched host's: the time it needs to start.
        """
        options = self._options
        if self._launcher is not None:
            return options.connect_timeout_s
        return max(2.0, 2 * options.host_timeout_s)

    def _unrecovered(self, failed: HostConnection, why: str) -> EnvServerError:
        """Marks ``failed`` as not recovered within ``restart_timeout_s``; the error to raise.

        Args:
            failed: The failed connection.
            why: What ends the message (``"; last error: ..."``).
        """
        failed.health.failure = Failure(
            HostUnavailableError,
            f"{failed.block.who} failed and could not be recovered within "
            f"{self._options.restart_timeout_s:g} s{why}",
        )
        return failed.failure_error()


def _unnamed(reason: str, name: str) -> str:
    """``reason`` without its leading ``name`` (and envs), for a message that names the host."""
    if not reason.startswith(name):
        return reason
    return re.sub(r"^\s*(\(envs? [\d-]+\))?[\s:]*", "", reason[len(name) :])


def _address(endpoint: str) -> str:
    """An endpoint without its port (``tcp://node3:5556`` -> ``tcp://node3``)."""
    return endpoint.rpartition(":")[0] if endpoint.startswith("tcp://") else endpoint


def _attempt_failure(connection: HostConnection | None, exc: BaseException) -> str:
    """Why an attempt failed: a wait that ran out says what the address did."""
    if (
        isinstance(exc, WaitTimeoutError)
        and connection is not None
        and not connection.health.failed
    ):
        connection.requests.read_events()
        return f"{connection.block.name}: {connection.link.reach.why_silent()}"
    return str(exc)
