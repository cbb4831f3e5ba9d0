r"""RLMesh (a gRPC env server, its core in Rust) as a peer of ``benchmarks/agent_loops.py``.

An RLMesh endpoint (``rlmesh.EnvServer``) serves one env to one client at a time: a second
client is refused (``FailedPrecondition: environment already has an active Join session;
only one client may be connected at a time``), and a list of envs served as the lanes of one
endpoint is stepped by its Python client (``RemoteVectorEnv.step``) all together, in
lockstep. Its clients (``rlmesh.RemoteEnv``, ``rlmesh.numpy.RemoteEnv``) are blocking, with
no asyncio API, and "not thread-safe: dial one client per thread". So here:

- 4 server processes (as envserver's 4 local hosts), each holding ``envs / 4`` endpoints
  (64 for ``wait``, 4 for ``cpu``), one env each, each endpoint on a TCP port of
  127.0.0.1 and served on a thread of its own (``EnvServer.start``): the env's calls run on
  that thread, the gRPC server (tonic) in the native core;
- in this process, a thread per rollout (256 or 16), each with its own ``RemoteEnv``
  client to its own endpoint, stepping as soon as its previous step answered, random
  actions ``np.random.default_rng(k).integers(2)``, env ``k`` reset with seed ``k`` and
  reset again (its own call) when its episode ends. 1 s of warm-up, then ``--seconds``
  measured, each window ending when every rollout's last step has answered.

The CPU counted is this process's and its server processes' (``tree_cpu_s``). Install and
run (from the repository's root)::

    python3 -m venv /tmp/peers/rlmesh-venv
    /tmp/peers/rlmesh-venv/bin/pip install rlmesh 'gymnasium>=1.1,<2' numpy
    .venv/bin/python benchmarks/agent_loops.py --peer \
        "RLMesh=/tmp/peers/rlmesh-venv/bin/python benchmarks/agent_loop_peers/rlmesh_server.py"

Alone: ``rlmesh_server.py --seconds 2 --workload wait --envs 256``; one JSON line
``{"steps", "wall_s", "cpu_s"}`` on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import rlmesh
import rlmesh.numpy

# agent_loops.py (one folder up) registers bench/Sleep-v0 on import and has tree_cpu_s.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agent_loops import ENV_IDS, tree_cpu_s

# (pinned to this build's edition, which is what RLMesh floats to, without its warning)
os.environ.setdefault("RLMESH_WORKFLOW_EDITION", rlmesh.build_info().workflow_edition)

SERVERS = 4


def serve(env_id: str, count: int) -> None:
    """A server process: ``count`` endpoints, their addresses printed, until stdin closes."""
    servers = []
    try:
        for _ in range(count):
            server = rlmesh.EnvServer(gym.make(env_id), "tcp://127.0.0.1:0")
            servers.append(server)
            server.start()
        print(json.dumps([server.address for server in servers]), flush=True)
        sys.stdin.read()  # (the client closes it, or dies)
    finally:
        for server in servers:
            server.shutdown()
        for server in servers:
            server.wait(15)


class Rollouts:
    """A thread per rollout, each its own client, both windows run in step (barriers)."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.counts = [0] * len(addresses)
        self.until = 0.0
        self.errors: list[BaseException] = []
        self.barrier = threading.Barrier(len(addresses) + 1)
        self.threads = [
            threading.Thread(target=self._rollout, args=(k,), daemon=True)
            for k in range(len(addresses))
        ]

    def _rollout(self, k: int) -> None:
        rng = np.random.default_rng(k)
        env = None
        try:
            env = rlmesh.numpy.RemoteEnv(self.addresses[k], connect_timeout_seconds=30)
            env.reset(seed=k)
            self.barrier.wait()  # connected
            for _ in range(2):  # the warm-up, then the measured window
                self.barrier.wait()  # the window's deadline is set
                count = 0
                while time.monotonic() < self.until:
                    _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
                    count += 1
                    if terminated or truncated:
                        env.reset()
                self.counts[k] = count
                self.barrier.wait()  # the window is over
        except BaseException as exc:  # (the main thread raises it)
            self.errors.append(exc)
            self.barrier.abort()
        finally:
            if env is not None:
                env.close()

    def _wait(self) -> None:
        try:
            self.barrier.wait(timeout=120)
        except threading.BrokenBarrierError:
            raise RuntimeError(f"a rollout failed: {self.errors[:1]!r}") from None

    def start(self) -> None:
        """Starts the threads; returns once every client has connected and reset."""
        for thread in self.threads:
            thread.start()
        self._wait()

    def window(self, seconds: float) -> int:
        """Every rollout steps until ``seconds`` have passed: the steps."""
        self.until = time.monotonic() + seconds
        self._wait()
        self._wait()
        return sum(self.counts)

    def join(self) -> None:
        """Waits for the threads (their clients closed)."""
        for thread in self.threads:
            thread.join(timeout=30)


def run(workload: str, envs: int, seconds: float) -> dict[str, Any]:
    """The measurement: steps, wall and CPU seconds of the measured window."""
    per_server = [envs // SERVERS + (i < envs % SERVERS) for i in range(SERVERS)]
    servers = [
        subprocess.Popen(
            [sys.executable, __file__, "--serve", ENV_IDS[workload], str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for count in per_server
        if count
    ]
    try:
        endpoints = []
        for server in servers:
            assert server.stdout is not None
            line = server.stdout.readline()
            if not line:
                raise RuntimeError(f"a server exited ({server.wait()}) before serving")
            endpoints.append(json.loads(line))
        # rollout k on server k % 4, as the other contenders spread them
        addresses = [endpoints[k % len(endpoints)][k // len(endpoints)] for k in range(envs)]
        rollouts = Rollouts(addresses)
        rollouts.start()
        rollouts.window(1.0)
        cpu, start = tree_cpu_s(), time.monotonic()
        steps = rollouts.window(seconds)
        wall, cpu = time.monotonic() - start, tree_cpu_s() - cpu
        rollouts.join()
        return {"steps": steps, "wall_s": wall, "cpu_s": cpu}
    finally:
        for server in servers:
            if server.stdin is not None:
                server.stdin.close()
        for server in servers:
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def main() -> None:
    """Parses the options, prints the JSON line (or serves, ``--serve``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workload", choices=sorted(ENV_IDS))
    parser.add_argument("--envs", type=int)
    parser.add_argument("--serve", nargs=2, metavar=("ENV_ID", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    if args.workload is None or args.envs is None:
        parser.error("--workload and --envs are required")
    print(json.dumps(run(args.workload, args.envs, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
