r"""A conformance suite for the envserver wire protocol, runnable against any endpoint.

It checks a host (this project's or another implementation's) against ``docs/protocol.md``
by speaking the wire directly: a DEALER socket, the documented frames, msgpack. It never goes
through the reference client. Run it from an installed envserver (pytest needed)::

    python -m envserver.conformance tcp://127.0.0.1:5555
    python -m envserver.conformance tcp://sim-a:5555 \
        --curve-server-key host.key --curve-client-key client.key_secret -- -k STEP -x

Without an endpoint it starts a local ``envserver serve`` and tests that. The host under test
must serve ``CartPole-v1`` (Gymnasium's) and allow a few sessions of up to 3 envs each.

Modules: :mod:`~envserver.conformance.wire` (the bare connection), ``conftest`` (options and
fixtures), ``test_*`` (the suite, one module per part of the protocol) and
:mod:`~envserver.conformance.examples` (the example messages of ``docs/protocol.md``).
"""

from __future__ import annotations

from envserver.conformance.runner import main, run

__all__ = ["main", "run"]
