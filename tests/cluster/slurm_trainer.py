"""The trainer tests/cluster/test_slurm.py submits inside a Slurm job (after the sbatch script of
deploy/slurm/ started the hosts and set ENVSERVER_HOSTS): it writes what it saw as JSON.

- ``oracle OUT``: CartPole on the job's hosts and on ``SyncVectorEnv``, same seeds and actions,
  compared step by step; and whether a host answers a client without keys.
- ``chaos OUT MARK``: ``chaos/Counter-v0`` envs (every call counted, tests/harness/chaos_envs.py)
  with recovery; after 20 steps it writes MARK.ready, and goes on stepping until 60 steps after
  the test says a node was killed and Slurm marked it down (MARK.killed): every result is
  checked by the chaos soak's tally.
- ``drain OUT MARK HOSTS``: CartPole on the hosts of another job (HOSTS, a ``slurm://`` spec),
  the hosts of its own job as spares, with ``on_host_failure="restore"``, compared step by step
  with ``SyncVectorEnv`` as ``oracle`` does; after 20 steps it writes MARK.ready, and goes on
  until 30 steps after every env moved off those hosts, which drain (or until a host's envs
  were recovered rather than moved).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from chaos import Tally
from chaos_envs import ENV_ID

from envserver import client
from envserver.cli.ping import ping_all
from envserver.launch.specs import spec_endpoints
from envserver.wire.endpoints import HostSpec

NUM_ENVS = 12
SEED = 7
#: How many steps the drain's trainer takes once every env moved.
AFTER_MOVE = 30


def differences(t: int, ours: tuple, theirs: tuple) -> list[str]:
    """What differs between a step (or reset, ``t`` 0) of the hosts and of ``SyncVectorEnv``."""
    names = ("obs", "reward", "terminated", "truncated")
    return [
        f"step {t}: {name} differs"
        for name, a, b in zip(names, ours, theirs[:-1])
        if not np.array_equal(a, b)
    ]


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
        mismatches += differences(t, ours, theirs)
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


def drain(out: Path, mark: Path, hosts_job: str) -> None:
    # The other job's hosts named one by one (the spec expanded here): under a spec, a move tries
    # its drained hosts first (they have exited), waiting out the whole recovery time on each.
    hosts = spec_endpoints(HostSpec.parse(hosts_job))
    spares = spec_endpoints(HostSpec.parse(os.environ["ENVSERVER_HOSTS"]))  # this job's
    envs = client.make_vec(
        "CartPole-v1",
        NUM_ENVS,
        hosts=hosts,
        vector_kwargs={"on_host_failure": "restore", "spare_hosts": spares},
    )
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * NUM_ENVS)
    rng = np.random.default_rng(SEED)
    mismatches = differences(0, envs.reset(seed=SEED), sync.reset(seed=SEED))
    steps, moved_at, host_failures = 0, None, 0
    deadline = time.monotonic() + 300
    while moved_at is None or steps < moved_at + AFTER_MOVE:
        if time.monotonic() > deadline or envs.host_restarts:  # recovered: the move failed
            break
        actions = rng.integers(0, 2, NUM_ENVS)
        ours = envs.step(actions)
        steps += 1
        mismatches += differences(steps, ours, sync.step(actions))
        host_failures += int(np.count_nonzero(ours[-1].get("_host_failure", False)))
        if steps == 20:
            mark.with_suffix(".ready").write_text(json.dumps(hosts))
        if moved_at is None and envs.envs_moved == NUM_ENVS:
            moved_at = steps
    report = {
        "hosts_before": hosts,
        "spares": spares,
        "hosts_after": list(envs.hosts),
        "steps": steps,
        "moved_at": moved_at,
        "envs_moved": envs.envs_moved,
        "host_restarts": envs.host_restarts,
        "host_failures": host_failures,
        "mismatches": mismatches[:20],
    }
    envs.close()
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1] == "oracle":
        oracle(Path(sys.argv[2]))
    elif sys.argv[1] == "chaos":
        chaos(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        drain(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
