"""Agent loops: the asyncio pool against an HTTP/WebSocket env server, and the vector env.

Three workloads, each measurement in a fresh process, rounds interleaved (a round runs every
contender once, starting one further each round); medians (min-max) over rounds:

- ``wait``: an env whose step waits 50 ms (``time.sleep``, the GIL released), 256 rollouts
  as coroutines, each stepping its own env as fast as it answers, over 4 local hosts. The
  ideal is 256 / 0.05 = 5,120 steps/s.
- ``cpu``: CartPole, 16 rollouts stepping as fast as they go over 4 local hosts; the CPU of
  the trainer and of every process under it (the hosts, the servers) per env step. Beside
  it, the vector env (``make_vec``, 16 envs on 4 local hosts, lockstep) on the same env.
- ``fork``: ``env.fork(1)`` mid-episode, CartPole, MuJoCo's Hopper and an env whose state is
  100 KB; milliseconds per fork (the new env's close not counted).

The HTTP/WebSocket peer is the shape OpenEnv serves an env in (``openenv-core``'s
``/ws``: one WebSocket session per env, JSON messages ``{"type": "reset"}`` and ``{"type":
"step", "data": ...}``, the env's calls run on a thread pool of the server): FastAPI and
uvicorn, 4 server processes, 64 threads each, the client ``websockets``' asyncio connection
per rollout. It runs in a venv of its own (``--http-python``)::

    python3 -m venv /tmp/http-venv
    /tmp/http-venv/bin/pip install fastapi uvicorn websockets 'gymnasium>=1.1,<2' numpy
    .venv/bin/python benchmarks/agent_loops.py --http-python /tmp/http-venv/bin/python

Other peers run by their own scripts (``--peer NAME=COMMAND``, the command printing one JSON
line with ``steps``, ``wall_s`` and ``cpu_s`` for a ``--workload``, ``--envs`` and
``--seconds`` appended to it): RLMesh's and TorchRL's ``AsyncEnvPool``'s are in
``agent_loop_peers/``, each with how to install its venv. Options: ``--rounds`` (3),
``--seconds`` per measurement (8).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

WAIT_S = 0.05
EPISODE = 100


class SleepEnv(gym.Env):
    """Each step waits ``wait_s`` (a tool call, a simulator); episodes of 100 steps."""

    observation_space = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.wait_s, self._t = wait_s, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # noqa: D102
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: int):  # noqa: D102
        time.sleep(self.wait_s)
        self._t += 1
        return np.full(4, self._t / EPISODE, np.float32), 1.0, False, self._t >= EPISODE, {}


class BigStateEnv(gym.Env):
    """CartPole-like dynamics over a 100 KB state (its ``get_state``/``set_state`` hooks)."""

    observation_space = spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # noqa: D102
        super().reset(seed=seed)
        self._blob = self.np_random.random(100_000 // 8)  # 100 KB of float64
        self._t = 0
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return self._blob[self._t : self._t + 4].astype(np.float32)

    def step(self, action: int):  # noqa: D102
        self._blob[self._t] += action
        self._t = (self._t + 1) % (len(self._blob) - 4)
        return self._obs(), 1.0, False, False, {}

    def get_state(self) -> dict[str, Any]:
        """The blob and the step."""
        return {"blob": self._blob.copy(), "t": self._t}

    def set_state(self, state: dict[str, Any]) -> None:
        """Takes what :meth:`get_state` gave."""
        self._blob, self._t = np.array(state["blob"]), int(state["t"])


gym.register("bench/Sleep-v0", entry_point=SleepEnv)
gym.register("bench/BigState-v0", entry_point=BigStateEnv)
ENV_IDS = {"wait": "bench/Sleep-v0", "cpu": "CartPole-v1"}


# ----------------------------------------------------------------- CPU of a process tree


def tree_cpu_s() -> float:
    """CPU seconds of this process and every live process under it (from ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    mine, changed = {os.getpid()}, True
    while changed:  # (pids are not in the order of their parents: to a fixed point)
        grown = mine | {pid for pid, parent in parents.items() if parent in mine}
        changed, mine = grown != mine, grown
    return sum(times[pid] for pid in mine if pid in times)


# ----------------------------------------------------------------- envserver's side


async def run_pool(workload: str, envs: int, seconds: float) -> dict[str, Any]:
    """``envs`` rollouts of the workload's env through an ``aio.EnvPool`` on 4 local hosts."""
    from envserver.client import aio

    async with aio.EnvPool(ENV_IDS[workload], num_local_hosts=4) as pool:
        rollouts = await asyncio.gather(*(pool.make() for _ in range(envs)))
        await asyncio.gather(*(env.reset(seed=k) for k, env in enumerate(rollouts)))
        counts = [0] * envs

        async def rollout(k: int, env: Any, until: float) -> None:
            rng = np.random.default_rng(k)
            while time.monotonic() < until:
                _, _, terminated, truncated, _ = await env.step(int(rng.integers(2)))
                counts[k] += 1
                if terminated or truncated:
                    await env.reset()

        await asyncio.gather(
            *(rollout(k, e, time.monotonic() + 1.0) for k, e in enumerate(rollouts))
        )
        counts = [0] * envs
        cpu, start = tree_cpu_s(), time.monotonic()
        await asyncio.gather(*(rollout(k, e, start + seconds) for k, e in enumerate(rollouts)))
        wall, cpu = time.monotonic() - start, tree_cpu_s() - cpu
        return {"steps": sum(counts), "wall_s": wall, "cpu_s": cpu}


def run_vector(workload: str, envs: int, seconds: float) -> dict[str, Any]:
    """The vector env, lockstep, ``envs`` envs on 4 local hosts."""
    from envserver.client import make_vec

    vec = make_vec(ENV_IDS[workload], num_envs=envs, vector_kwargs={"num_local_hosts": 4})
    try:
        vec.reset(seed=0)
        actions = np.zeros(envs, np.int64)
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            vec.step(actions)
        steps, cpu, start = 0, tree_cpu_s(), time.monotonic()
        while time.monotonic() < start + seconds:
            vec.step(actions)
            steps += envs
        wall, cpu = time.monotonic() - start, tree_cpu_s() - cpu
        return {"steps": steps, "wall_s": wall, "cpu_s": cpu}
    finally:
        vec.close()


async def run_forks(count: int) -> dict[str, Any]:
    """The median of ``count`` forks of one env mid-episode, for each env, in ms."""
    from envserver.client import aio

    found = {}
    for name, env_id in (
        ("CartPole", "CartPole-v1"),
        ("Hopper", "Hopper-v5"),
        ("100 KB state", "bench/BigState-v0"),
    ):
        async with aio.EnvPool(env_id, num_local_hosts=2) as pool:
            env = await pool.make()
            env.action_space.seed(0)
            await env.reset(seed=0)
            for _ in range(5):
                await env.step(env.action_space.sample())
            times = []
            for _ in range(count + 2):
                start = time.perf_counter()
                (child,) = await env.fork(1)
                times.append(time.perf_counter() - start)
                await child.close()
            found[name] = statistics.median(times[2:]) * 1e3
    return {"fork_ms": found}


# ----------------------------------------------------------------- the HTTP/WebSocket peer


def serve_http(port: int, threads: int) -> None:
    """One server as OpenEnv's ``/ws``: an env per WebSocket session, calls on a thread pool."""
    import concurrent.futures

    import uvicorn
    from fastapi import FastAPI, WebSocket, WebSocketDisconnect

    app = FastAPI()
    pool = concurrent.futures.ThreadPoolExecutor(threads)

    async def session(socket: WebSocket) -> None:
        await socket.accept()
        loop = asyncio.get_running_loop()
        env = None
        try:
            while True:
                message = json.loads(await socket.receive_text())
                if message["type"] == "make":
                    env = await loop.run_in_executor(pool, gym.make, message["env_id"])
                    reply: dict[str, Any] = {}
                elif message["type"] == "reset":
                    obs, info = await loop.run_in_executor(pool, _reset, env, message.get("seed"))
                    reply = {"observation": obs.tolist(), "info": info}
                else:
                    obs, reward, terminated, truncated, info = await loop.run_in_executor(
                        pool, env.step, message["data"]["action"]
                    )
                    reply = {
                        "observation": obs.tolist(),
                        "reward": float(reward),
                        "done": bool(terminated),
                        "truncated": bool(truncated),
                        "info": info,
                    }
                await socket.send_text(json.dumps(reply))
        except WebSocketDisconnect:
            pass
        finally:
            if env is not None:
                env.close()

    # (the annotations are strings here, and WebSocket is not a global: FastAPI is told)
    session.__annotations__ = {"socket": WebSocket, "return": None}
    app.add_api_websocket_route("/ws", session)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws="websockets")


async def run_http(workload: str, envs: int, seconds: float) -> dict[str, Any]:
    """``envs`` rollouts over 4 servers of :func:`serve_http`, a WebSocket each."""
    import socket as sockets

    import websockets

    ports = []
    for _ in range(4):
        with sockets.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    servers = [subprocess.Popen([sys.executable, __file__, "--serve-http", str(p)]) for p in ports]
    try:
        connections = []
        for k in range(envs):
            url = f"ws://127.0.0.1:{ports[k % 4]}/ws"
            for _ in range(200):  # the servers starting
                try:
                    connections.append(await websockets.connect(url, max_size=None))
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"no server at {url}")

        async def ask(ws: Any, message: dict[str, Any]) -> dict[str, Any]:
            await ws.send(json.dumps(message))
            return json.loads(await ws.recv())

        await asyncio.gather(
            *(ask(ws, {"type": "make", "env_id": ENV_IDS[workload]}) for ws in connections)
        )
        await asyncio.gather(
            *(ask(ws, {"type": "reset", "seed": k}) for k, ws in enumerate(connections))
        )
        counts = [0] * envs

        async def rollout(k: int, ws: Any, until: float) -> None:
            rng = np.random.default_rng(k)
            while time.monotonic() < until:
                step = {"type": "step", "data": {"action": int(rng.integers(2))}}
                reply = await ask(ws, step)
                counts[k] += 1
                if reply["done"] or reply["truncated"]:
                    await ask(ws, {"type": "reset"})

        await asyncio.gather(
            *(rollout(k, ws, time.monotonic() + 1.0) for k, ws in enumerate(connections))
        )
        counts = [0] * envs
        cpu, start = tree_cpu_s(), time.monotonic()
        await asyncio.gather(*(rollout(k, ws, start + seconds) for k, ws in enumerate(connections)))
        wall, cpu = time.monotonic() - start, tree_cpu_s() - cpu
        await asyncio.gather(*(ws.close() for ws in connections))
        return {"steps": sum(counts), "wall_s": wall, "cpu_s": cpu}
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)


def _reset(env: gym.Env, seed: int | None) -> tuple[Any, dict[str, Any]]:
    return env.reset(seed=seed)


# ----------------------------------------------------------------- the rounds


def measure(command: list[str]) -> dict[str, Any]:
    """Runs one measurement in a fresh process: its JSON line."""
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def spread(values: list[float], digits: int = 0) -> str:
    """``median (min-max)``."""
    middle, low, high = statistics.median(values), min(values), max(values)
    middle, low, high = (f"{v:,.{digits}f}" for v in (middle, low, high))
    return f"{middle} ({low}-{high})"


def main() -> None:
    """The rounds, then the tables (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--http-python", help="the python of a venv with fastapi, uvicorn, websockets"
    )
    parser.add_argument("--peer", action="append", default=[], help="NAME=COMMAND")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--envs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-http", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_http:
        serve_http(args.serve_http, threads=64)
        return
    if args.run:
        if args.run == "pool":
            result = asyncio.run(run_pool(args.workload, args.envs, args.seconds))
        elif args.run == "vector":
            result = run_vector(args.workload, args.envs, args.seconds)
        elif args.run == "http":
            result = asyncio.run(run_http(args.workload, args.envs, args.seconds))
        else:
            result = asyncio.run(run_forks(20))
        print(json.dumps(result))
        return

    me = [sys.executable, __file__, "--seconds", str(args.seconds)]
    contenders: dict[str, dict[str, list[str]]] = {
        "envserver aio pool": {w: [*me, "--run", "pool"] for w in ("wait", "cpu")},
        "envserver vector env (lockstep)": {"cpu": [*me, "--run", "vector"]},
    }
    if args.http_python:
        http = [args.http_python, __file__, "--seconds", str(args.seconds), "--run", "http"]
        contenders["HTTP/WebSocket server (OpenEnv's shape)"] = {w: http for w in ("wait", "cpu")}
    for peer in args.peer:
        name, _, command = peer.partition("=")
        contenders[name] = {
            w: [*shlex.split(command), "--seconds", str(args.seconds)] for w in ("wait", "cpu")
        }
    envs = {"wait": 256, "cpu": 16}
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    forks: list[dict[str, float]] = []
    jobs = [(n, w) for n, ws in contenders.items() for w in ws]
    for r in range(args.rounds):
        for name, workload in jobs[r % len(jobs) :] + jobs[: r % len(jobs)]:
            command = [
                *contenders[name][workload],
                "--workload",
                workload,
                "--envs",
                str(envs[workload]),
            ]
            try:
                results.setdefault((name, workload), []).append(measure(command))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"{name} {workload}: {exc}", file=sys.stderr)
        forks.append(measure([*me, "--run", "forks"])["fork_ms"])

    ideal = 256 / WAIT_S
    print(f"## Agent loops ({args.rounds} rounds of {args.seconds:g} s, {os.cpu_count()} cores)\n")
    print("| 256 rollouts, step waits 50 ms, 4 hosts | steps/s | of the ideal (5,120) |")
    print("|---|---:|---:|")
    rates = {}
    for name in contenders:
        runs = results.get((name, "wait"))
        if runs:
            rates[name] = [run["steps"] / run["wall_s"] for run in runs]
            print(
                f"| {name} | {spread(rates[name])} | {statistics.median(rates[name]) / ideal:.2f} |"
            )
    print("\n| CartPole, 16 rollouts, 4 hosts | CPU µs per env step (all processes) | steps/s |")
    print("|---|---:|---:|")
    for name in contenders:
        runs = results.get((name, "cpu"))
        if runs:
            cpu = [run["cpu_s"] / run["steps"] * 1e6 for run in runs]
            rate = [run["steps"] / run["wall_s"] for run in runs]
            print(f"| {name} | {spread(cpu)} | {spread(rate)} |")
    print("\n| fork(1), mid-episode | ms |")
    print("|---|---:|")
    for name in forks[0]:
        print(f"| {name} | {spread([f[name] for f in forks], 2)} |")


if __name__ == "__main__":
    main()
