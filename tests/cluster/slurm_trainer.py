"""The trainer tests/cluster/test_slurm.py submits inside a Slurm job (after the sbatch script of
deploy/slurm/ started the hosts and set ENVSERVER_HOSTS): it writes what it saw as JSON.

- ``oracle OUT``: CartPole on the job's hosts and on ``SyncVectorEnv``, same seeds and actions,
  compared step by step; and whether a host answers a client without keys.
- ``chaos OUT MARK``: ``chaos/Counter-v0`` envs (every call counted, tests/harness/chaos_envs.py)
  with recovery; after 20 steps it writes MARK.ready, and goes on stepping until 60 steps after
  the test says a node was killed and Slurm marked it down (MARK.killed): every result is
  checked by the chaos soak's tally.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from chaos import Tally
from chaos_envs import ENV_ID

from envserver import client
from envserver.cli.ping import ping_all

NUM_ENVS = 12
SEED = 7


def oracle(out: Path) -> None:
    envs = client.make_vec("CartPole-v1", NUM_ENVS)  # hosts: ENVSERVER_HOSTS
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * NUM_ENVS)
    rng = np.random.default_rng(SEED)
    mismatches = []
    pairs = [(envs.reset(seed=SEED), sync.reset(seed=SEED))]
    for _ in range(300):
        actions = rng.integers(0, 2, NUM_ENVS)
        pairs.append((envs.step(actions), sync.step(actions)))
    for t, (ours, theirs) in enumerate(pairs):
        for name, a, b in zip(("obs", "reward", "terminated", "truncated"), ours, theirs[:-1]):
            if not np.array_equal(a, b):
                mismatches.append(f"step {t}: {name} differs")
    report = {
        "hosts": list(envs.hosts),
        "envs_per_host": list(envs.envs_per_host),
        "keyless_answered": ping_all(envs.hosts[:1], None, 2.0)[0].info is not None,
    }
    envs.close()
    out.write_text(json.dumps({**report, "mismatches": mismatches[:20], "steps": len(pairs)}))


def chaos(out: Path, mark: Path) -> None:
    envs = client.make_vec(
        ENV_ID,
        NUM_ENVS,
        vector_kwargs={"on_host_failure": "restart", "host_timeout_s": 2.0},
    )
    tally = Tally(NUM_ENVS)
    _, infos = envs.reset(seed=SEED)
    tally.batch(range(NUM_ENVS), infos)
    hosts = list(envs.hosts)
    steps, after_kill, slowest = 0, 0, 0.0
    deadline = time.monotonic() + 300
    while after_kill < 60 and time.monotonic() < deadline:
        began = time.monotonic()
        *_, infos = envs.step(np.ones(NUM_ENVS, dtype=np.int64))
        slowest = max(slowest, time.monotonic() - began)
        tally.batch(range(NUM_ENVS), infos)
        steps += 1
        if steps == 20:
            mark.with_suffix(".ready").write_text(json.dumps(hosts))
        if mark.with_suffix(".killed").exists():
            after_kill += 1
    report = {
        "hosts_before": hosts,
        "hosts_after": list(envs.hosts),
        "envs_per_host": list(envs.envs_per_host),
        "steps": steps,
        "after_kill": after_kill,
        "host_restarts": envs.host_restarts,
        "slowest_step_s": round(slowest, 2),  # the step that recovered the node's hosts
        "reports": tally.reports.tolist(),
        "results": tally.results,
        "problems": tally.problems,
    }
    envs.close()
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1] == "oracle":
        oracle(Path(sys.argv[2]))
    else:
        chaos(Path(sys.argv[2]), Path(sys.argv[3]))
