"""Recovery from failed hosts (``on_host_failure="restart"`` or ``"restore"``), by concern.

- :mod:`.policy`: :class:`~.policy.Recovery`, the one policy (resume, else restore, else
  re-create) for lockstep calls and first-ready batches, and the moves of draining hosts.
- :mod:`.ledger`: which envs were lost, until each reports its loss once.
- :mod:`.reconnect`: the one candidate loop (launcher, discovery, spares), backoff, deadline.
- :mod:`.restore`: re-creating a host's envs, and restoring them from their history.
- :mod:`.history`: each env's history (what the trainer gave it; with ``"restore"``, its last
  snapshot and the requests since), for replays, restores and first resets.
"""

from .policy import Recovery

__all__ = ["Recovery"]
