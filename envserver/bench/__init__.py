"""``envserver bench``: RemoteVectorEnv against Gymnasium's vector envs, in one interleaved run.

The benchmark as an installed command, contributed to ``envserver`` through the
``envserver.commands`` entry point group, as the client contributes ``rollout``. It writes a
markdown report (``./envserver-bench-YYYYmmdd-HHMMSS.md``, or ``--out``) and, with matplotlib
(``pip install 'envserver[plot]'``), a PNG chart beside it.

Modules: :mod:`~envserver.bench.run` (the command line and the run),
:mod:`~envserver.bench.variants` (variants, workloads, their hosts, the interleaved rounds),
:mod:`~envserver.bench.workloads` (what a run measures), :mod:`~envserver.bench.agents` (the
multi-agent workload, with PettingZoo and SuperSuit), :mod:`~envserver.bench.floors` (the raw
ZeroMQ floors and the latency section), :mod:`~envserver.bench.startup` (start-up times),
:mod:`~envserver.bench.report` (the soak and the targets table), :mod:`~envserver.bench.chart`
(the PNG) and :mod:`~envserver.bench.envs` (the benchmark's own envs, which hosts import by
``envserver.bench.envs:bench/Compute-v0``).

It uses the project's public names only: the client, the wire layer's messages and batching,
:mod:`envserver.testing`, and the CLI's shared options and interrupts; never the host. This
module imports nothing, so that a host importing :mod:`~envserver.bench.envs` loads no client.
"""

from __future__ import annotations

__all__: list[str] = []
