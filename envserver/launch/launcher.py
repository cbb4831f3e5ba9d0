"""What a launcher is: it starts hosts, says their endpoints, replaces a lost one, stops them.

It replaces a lost host when recovery asks. Two implementations: the trainer's local hosts
(``envserver.client``'s ``LocalHosts``, forked by its fork server) and hosts on a Ray cluster
(:class:`envserver.launch.ray.RayHosts`). Hosts that something else starts (``envserver serve`` by
hand, Compose, Kubernetes, a Slurm job's step) need no launcher: the trainer finds them from a host
list (endpoints, ``dns://`` and ``slurm://`` specs) and replaces a lost one with another the list
names.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Launcher"]


class Launcher(Protocol):
    """Hosts a trainer started, and owns until it closes them.

    Attributes:
        endpoints: The hosts' endpoints, in host order, each answering once the launcher is made
            (a replaced host's new endpoint takes its place).
    """

    endpoints: list[str]

    def replacements(self, index: int, endpoint: str, fresh: bool) -> list[str]:
        """Where host ``index``, lost at ``endpoint``, may be found again, best first.

        It may start a host (a local process anew, a Ray actor on another node) and wait for
        it, but only for a bounded time: recovery asks again on its next try.

        Args:
            index: The host's place in :attr:`endpoints`.
            endpoint: Where it was lost.
            fresh: Whether this is the first try of this recovery (a host that still runs may
                be frozen: start it anew).
        """
        ...

    def close(self) -> None:
        """Stops every host (idempotent)."""
        ...
