"""A session on a host as the client holds it: its id, what HELLO said, how its steps travel.

The session is the host's, not the socket's: a connection that replaces a failed one to the same
host resumes it (``Recovery``) by holding the very same :class:`HostSession`, its step layout and
observation slab included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envserver.wire.raw import StepLayout

__all__ = ["HostSession"]


@dataclass(eq=False)
class HostSession:
    """One session on a host.

    Attributes:
        id: The session id the host gave at HELLO; every request carries it.
        info: The HELLO reply (the host's version, bounds and lease).
        step_layout: How STEP requests go raw to this session (None: as STEP), set from its
            MAKE reply (``HostConnection.use_layout``); with the slab its observations come
            in, if the host took one.
    """

    id: bytes
    info: dict[str, Any] = field(default_factory=dict)
    step_layout: StepLayout | None = None

    @property
    def max_message_bytes(self) -> int | None:
        """The host's bound on a request's size, as its HELLO reply said (None: not said)."""
        bound = self.info.get("max_message_bytes")
        return bound if isinstance(bound, int) else None
