"""Which host a connection reaches and which envs it holds there: how messages name both.

A :class:`HostBlock` is fixed for the life of its connection (the connection that replaces a
failed one has a block of its own, for the same envs). The parts of a connection (its health,
its requests) read it; nothing changes it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HostBlock"]


@dataclass(frozen=True, slots=True)
class HostBlock:
    """A host, and the block of the vector env's envs that a connection holds on it.

    Attributes:
        name: How messages name the host (``host ENDPOINT`` by default).
        endpoint: The host's endpoint.
        start: The global index of the block's first env.
        stop: One past the global index of its last env.
    """

    name: str
    endpoint: str
    start: int
    stop: int

    @property
    def count(self) -> int:
        """The number of envs in the block."""
        return self.stop - self.start

    @property
    def envs(self) -> str:
        """The block's env indices, for messages: ``envs 0-3`` (``env 4`` for one)."""
        last = self.stop - 1
        return f"env {self.start}" if last == self.start else f"envs {self.start}-{last}"

    @property
    def who(self) -> str:
        """The host and its envs, as failures name them: ``host X (envs 0-3)``, or ``host X``."""
        return f"{self.name} ({self.envs})" if self.count else self.name
