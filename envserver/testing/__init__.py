"""Small envs for tests, examples and benchmarks, and host processes to serve them.

The envs (:mod:`envserver.testing.envs`) are registered with Gymnasium on import: they
exercise what real envs do to a vector env: structured observation and action spaces, episodes
that end by termination and by truncation, infos with nested dicts, strings, arrays and keys that
only some steps carry, and exceptions raised from ``step`` and ``reset``. Hosts load them by id,
e.g. ``gymnasium.make("envserver.testing:envserver/Episodic-v0")``. :mod:`envserver.testing.agents`
has a PettingZoo-style Parallel env whose agents leave and join (``envserver.testing.agents``
for a multi-agent vector env). :mod:`envserver.testing.hosts`
starts ``envserver serve`` processes and makes network namespaces for tests.
"""

from envserver.testing.agents import ScriptedAgents
from envserver.testing.envs import (
    ChattyEnv,
    DictTupleEnv,
    EpisodicEnv,
    FailingEnv,
    JitterEnv,
    PixelEnv,
    RingEnv,
    RingSpace,
    SimulatorCrash,
    busy_wait,
)
from envserver.testing.hosts import (
    HostProcess,
    Namespace,
    ip,
    namespaces,
    netns_unavailable,
    start_host,
)

__all__ = [
    "ChattyEnv",
    "DictTupleEnv",
    "EpisodicEnv",
    "FailingEnv",
    "HostProcess",
    "JitterEnv",
    "Namespace",
    "PixelEnv",
    "RingEnv",
    "RingSpace",
    "ScriptedAgents",
    "SimulatorCrash",
    "busy_wait",
    "ip",
    "namespaces",
    "netns_unavailable",
    "start_host",
]
