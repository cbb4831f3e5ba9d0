r"""TorchRL's ``AsyncEnvPool`` as a peer of ``benchmarks/agent_loops.py`` (local envs only).

The rollouts are the pool's envs: every env is sent its first step, then the loop takes
whatever has answered (``async_step_and_maybe_reset_recv(min_get=1)``: at least one, and
every other result already done), counts those steps and sends each of those envs its next
action at once. The reset of an env whose episode ended is TorchRL's own
``step_and_maybe_reset``, done inside the same call on the env's worker (one round trip
where envserver's rollouts make two). Actions are ``np.random.default_rng(k).integers(2)``
for env ``k``, env ``k`` seeded ``k``; 1 s of warm-up, then ``--seconds`` measured, each
window ending when every step sent before its deadline has answered (as the asyncio
rollouts of ``agent_loops.py`` end).

Layout, against envserver's 4 local host processes (each backend tried on each workload
here, 2 shared cores; the one kept is the default, ``--backend`` picks the other):

- ``wait`` (``bench/Sleep-v0``, 256 envs): backend ``multiprocessing``, 4 worker processes
  of 64 envs (``envs_per_worker``), each env on a thread of its worker, the results back
  through shared memory (``exchange="shm"``): the same 4-process layout as envserver's,
  the trainer not a host. It made 1.5-1.9x the steps/s of the ``threading`` backend (all
  256 envs in this process, a 256-thread ``ThreadPoolExecutor``; about 1,200 steps/s,
  this process's loop the bottleneck). With ``exchange="queue"`` (TorchRL 0.14's default)
  it made only ~200 steps/s.
- ``cpu`` (CartPole-v1, 16 envs): backend ``threading``, the 16 envs in this one process,
  no host process: the least CPU per env step (about 610-870 µs against 810-840 µs for 4
  ``multiprocessing`` workers of 4 envs with ``shm``, which made ~25% more steps/s).

Install and run (from the repository's root)::

    python3 -m venv /tmp/peers/torchrl-venv
    /tmp/peers/torchrl-venv/bin/pip install torch==2.13.0 torchrl tensordict \
        'gymnasium>=1.1,<2' numpy
    .venv/bin/python benchmarks/agent_loops.py --peer \
        "TorchRL AsyncEnvPool=/tmp/peers/torchrl-venv/bin/python \
        benchmarks/agent_loop_peers/torchrl_pool.py"

Alone: ``torchrl_pool.py --seconds 2 --workload wait --envs 256``; one JSON line
``{"steps", "wall_s", "cpu_s"}`` on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.envs import AsyncEnvPool, GymEnv

# agent_loops.py (one folder up) registers bench/Sleep-v0 on import and has tree_cpu_s;
# a spawned worker imports this module again, and so registers it too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agent_loops import ENV_IDS, tree_cpu_s


def make_env(env_id: str, seed: int) -> GymEnv:
    """One env of the pool: actions as integers, seeded ``seed`` (a picklable factory)."""
    env = GymEnv(env_id, categorical_action_encoding=True)
    env.set_seed(seed)
    return env


class Rollouts:
    """The pool's envs stepped each as soon as its previous step answered."""

    def __init__(self, pool: Any, envs: int) -> None:
        self.pool = pool
        self.rngs = [np.random.default_rng(k) for k in range(envs)]
        self.idle = [pool.reset()]  # every env, ready for its next step
        self.steps = 0

    def _send(self, ready: Any) -> None:
        indices = [int(k) for k in ready["env_index"]]
        ready["action"] = torch.tensor([int(self.rngs[k].integers(2)) for k in indices])
        self.pool.async_step_and_maybe_reset_send(ready)

    def window(self, seconds: float) -> int:
        """Steps until ``seconds`` have passed, then waits for the steps in flight."""
        self.steps, in_flight = 0, sum(part.shape[0] for part in self.idle)
        for part in self.idle:
            self._send(part)
        until = time.monotonic() + seconds
        parts = []
        while in_flight:
            # (drains everything done, blocking until at least one is)
            result, ready = self.pool.async_step_and_maybe_reset_recv(min_get=1)
            done = result.shape[0]
            self.steps += done
            if time.monotonic() < until:
                self._send(ready)
            else:
                in_flight -= done
                parts.append(ready)
        self.idle = parts
        return self.steps


def run(workload: str, envs: int, seconds: float, backend: str, exchange: str) -> dict:
    """The measurement: steps, wall and CPU seconds of the measured window."""
    makers = [partial(make_env, ENV_IDS[workload], k) for k in range(envs)]
    kwargs: dict[str, Any] = {"backend": backend}
    if backend == "multiprocessing":
        kwargs.update(envs_per_worker=max(1, envs // 4), exchange=exchange)
    pool = AsyncEnvPool(makers, **kwargs)
    try:
        rollouts = Rollouts(pool, envs)
        rollouts.window(1.0)
        cpu, start = tree_cpu_s(), time.monotonic()
        steps = rollouts.window(seconds)
        wall, cpu = time.monotonic() - start, tree_cpu_s() - cpu
        return {"steps": steps, "wall_s": wall, "cpu_s": cpu}
    finally:
        pool.close()  # the thread pool, or the worker processes (joined, else terminated)


def main() -> None:
    """Parses the options, prints the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workload", choices=sorted(ENV_IDS), required=True)
    parser.add_argument("--envs", type=int, required=True)
    parser.add_argument("--backend", choices=["threading", "multiprocessing"])
    parser.add_argument("--exchange", choices=["queue", "shm", "auto"], default="shm")
    args = parser.parse_args()
    backend = args.backend or {"wait": "multiprocessing", "cpu": "threading"}[args.workload]
    warnings.filterwarnings("ignore", category=FutureWarning)
    result = run(args.workload, args.envs, args.seconds, backend, args.exchange)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
