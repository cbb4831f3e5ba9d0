"""The raw ZeroMQ floors under any inter-process design, and the one-env latency section.

:class:`RawFloor` steps the same envs as the others with no protocol at all; the echo server
answers a STEP's message sizes with nothing behind them.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import zmq

from envserver import client
from envserver.bench.variants import PUFFERLIB, Hosts, PufferPeer, even_split, per_round_ratio
from envserver.wire.messages import Command, Status, encode_reply, encode_request

__all__ = [
    "LOCAL_HOST",
    "LOCAL_PUFFER",
    "LOCAL_SYNC",
    "RawFloor",
    "echo_server",
    "latency_section",
    "local_latency_section",
    "step_message_sizes",
]


RAW_HOST = """
import json, sys, gymnasium as gym, numpy as np, zmq
envs = [gym.make(sys.argv[2], **json.loads(sys.argv[4])) for _ in range(int(sys.argv[3]))]
socket = zmq.Context().socket(zmq.ROUTER)
socket.bind(sys.argv[1])
print(socket.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
while True:
    identity, request = socket.recv_multipart()
    if request == b"quit":
        break
    if request.startswith(b"reset "):
        seed = int(request.split()[1])
        obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
        socket.send_multipart([identity, np.stack(obs).tobytes()])
        continue
    obs, rewards, flags = [], np.zeros(len(envs)), np.zeros((2, len(envs)), bool)
    for i, (env, action) in enumerate(zip(envs, np.frombuffer(request, np.int64))):
        o, rewards[i], flags[0, i], flags[1, i], _ = env.step(action)
        if flags[0, i] or flags[1, i]:
            o, _ = env.reset()
        obs.append(o)
    socket.send_multipart([identity, np.stack(obs).tobytes(), rewards.tobytes(), flags.tobytes()])
"""


#: The one-env round trips on one machine: in process, on one local host, PufferLib's worker.
LOCAL_SYNC = "SyncVectorEnv (in process)"
LOCAL_HOST = "make_vec, one local host"
LOCAL_PUFFER = "PufferLib Multiprocessing, 1 worker x 1"


class RawFloor:
    """The floor under any inter-process design in Python over ZeroMQ, for reference.

    Host processes step the same envs with the same actions, but with no protocol, no checks,
    no infos, no sessions and no failure handling: raw bytes of Discrete actions out, of Box
    observations, rewards and flags back. What envserver adds is the gap between it and this.
    Host ``i`` binds ``binds[i]`` (default: an ipc socket in ``directory``), started behind the
    command ``prefixes[i]`` if given (``ip netns exec NS``).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        num_hosts: int,
        directory: Path,
        kwargs: dict[str, Any] | None = None,
        binds: Sequence[str] | None = None,
        prefixes: Sequence[Sequence[str]] | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        kwargs = kwargs or {}
        space = gym.make(env_id, **kwargs).observation_space
        self.obs_dtype, self.obs_shape = space.dtype, space.shape
        counts = even_split(num_envs, num_hosts)  # the envs laid out as RemoteVectorEnv does
        self.slices = [slice(sum(counts[:i]), sum(counts[: i + 1])) for i in range(num_hosts)]
        self.context = zmq.Context()
        self.processes: list[subprocess.Popen] = []
        self.sockets: list[zmq.Socket] = []
        try:
            for i, count in enumerate(counts):
                bind = f"ipc://{directory}/raw{i}.sock" if binds is None else binds[i]
                self.processes.append(
                    subprocess.Popen(
                        [
                            *(prefixes[i] if prefixes is not None else ()),
                            sys.executable,
                            "-c",
                            RAW_HOST,
                            bind,
                            env_id,
                            str(count),
                            json.dumps(kwargs),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
                endpoint = self.processes[-1].stdout.readline().strip()
                if not endpoint:
                    raise RuntimeError(f"raw host {i} did not start")
                self.sockets.append(self.context.socket(zmq.DEALER))
                self.sockets[-1].setsockopt(zmq.LINGER, 0)
                self.sockets[-1].connect(endpoint)
        except BaseException:
            self.close()
            raise

    def _obs(self, frame: bytes) -> np.ndarray:
        return np.frombuffer(frame, self.obs_dtype).reshape(-1, *self.obs_shape)

    def reset(self, seed: int = 0) -> tuple[np.ndarray, dict]:
        """Resets env ``i`` with ``seed + i``."""
        for socket, part in zip(self.sockets, self.slices):
            socket.send(f"reset {seed + part.start}".encode())
        return np.concatenate([self._obs(s.recv()) for s in self.sockets]), {}

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        """Steps every env; one that ends is reset at once (no final observation kept)."""
        actions = np.asarray(actions, dtype=np.int64)
        for socket, part in zip(self.sockets, self.slices):
            socket.send(actions[part].tobytes())
        replies = [s.recv_multipart() for s in self.sockets]
        obs = np.concatenate([self._obs(r[0]) for r in replies])
        rewards = np.concatenate([np.frombuffer(r[1]) for r in replies])
        flags = np.concatenate([np.frombuffer(r[2], bool).reshape(2, -1) for r in replies], axis=1)
        return obs, rewards, flags[0], flags[1], {}

    def close(self) -> None:
        """Stops the host processes."""
        for socket in self.sockets:
            socket.send(b"quit")
            socket.close()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.context.term()


# ---------------------------------------------------------------- latency


ECHO_SERVER = """
import sys, zmq
sizes = [int(s) for s in sys.argv[2:]]
reply = [b"\\0" * s for s in sizes]
socket = zmq.Context().socket(zmq.ROUTER)
socket.bind(sys.argv[1])
print(socket.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
while True:
    frames = socket.recv_multipart()
    if frames[1] == b"quit":
        break
    socket.send_multipart([frames[0], *reply])
"""


@contextlib.contextmanager
def echo_server(bind: str, reply_sizes: list[int]) -> Iterator[str]:
    """A ROUTER process answering every message with frames of ``reply_sizes``."""
    process = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, bind, *map(str, reply_sizes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    endpoint = process.stdout.readline().strip()
    try:
        yield endpoint
    finally:
        process.kill()
        process.wait()


def step_message_sizes() -> tuple[list[bytes], list[int]]:
    """The frames of a 1-env CartPole STEP request, and the sizes of its reply's frames."""
    request = encode_request(
        1, Command.STEP, b"s" * 16, {"actions": np.zeros(1, np.int64)}, allow_pickle=True
    )
    reply = encode_reply(
        1,
        Status.OK,
        {
            "obs": np.zeros((1, 4), np.float32),
            "rewards": [0.0],  # a host sends up to 64 values as a plain list
            "terminations": [False],
            "truncations": [False],
            "infos": [],
        },
    )
    return [bytes(memoryview(f)) for f in request], [memoryview(f).nbytes for f in reply]


def latency_section(directory: Path, rounds: int, iterations: int) -> tuple[str, dict]:
    """One-env step round trip against the raw DEALER/ROUTER echo of the same sizes."""
    request, reply_sizes = step_message_sizes()
    hosts = Hosts(directory / "latency")
    results: dict[str, dict[str, list[float]]] = {}
    context = zmq.Context()
    try:
        for transport in ("ipc", "tcp"):
            bind = f"ipc://{directory}/echo.sock" if transport == "ipc" else "tcp://127.0.0.1:*"
            envs = client.RemoteVectorEnv(
                env_id="CartPole-v1", num_envs=1, hosts=hosts.endpoints(1, transport)
            )
            with echo_server(bind, reply_sizes) as endpoint:
                dealer = context.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.connect(endpoint)
                action = np.zeros(1, dtype=np.int64)
                envs.reset(seed=0)
                echo: list[float] = []
                step: list[float] = []
                for _ in range(rounds + 1):  # the first round warms up
                    start = time.perf_counter()
                    for _ in range(iterations):
                        dealer.send_multipart(request)
                        dealer.recv_multipart()
                    echo.append((time.perf_counter() - start) / iterations * 1e6)
                    start = time.perf_counter()
                    for _ in range(iterations):
                        envs.step(action)
                    step.append((time.perf_counter() - start) / iterations * 1e6)
                dealer.send_multipart([b"quit"])
                dealer.close()
            envs.close()
            results[transport] = {"echo": echo[1:], "step": step[1:]}
    finally:
        hosts.stop()
        context.term()
    lines = [
        "### One env: step round trip against the raw ZeroMQ echo floor",
        "",
        "| transport | echo floor (us) | RemoteVectorEnv.step (us) | ratio (median per round) |",
        "|---|---:|---:|---:|",
    ]
    for transport, r in results.items():
        per_round = per_round_ratio(r["step"], r["echo"])
        lines.append(
            f"| {transport} | {statistics.median(r['echo']):.0f} | "
            f"{statistics.median(r['step']):.0f} | {per_round:.2f}x |"
        )
    lines.append("")
    return "\n".join(lines), results


def local_latency_section(rounds: int, iterations: int) -> tuple[str, dict[str, list[float]]]:
    """One CartPole's step round trip on this machine: in process, on one local host, on PufferLib.

    Each measurement makes its vector env anew and closes it after: PufferLib's worker spins for
    half a second after its last step, so one left open would take a core from the next
    measurement. Rounds interleave (each starts one variant further); a measurement is the
    mean of ``iterations`` steps after as many untimed ones.

    Returns:
        The section, and each variant's µs per round trip, one value per round (PufferLib's
        only where it is installed).
    """
    makers: dict[str, Any] = {
        LOCAL_SYNC: lambda: gym.make_vec("CartPole-v1", num_envs=1, vectorization_mode="sync"),
        LOCAL_HOST: lambda: client.make_vec(
            "CartPole-v1", num_envs=1, vector_kwargs={"num_local_hosts": 1}
        ),
    }
    skipped = PUFFERLIB.missing()
    if skipped is None:
        makers[LOCAL_PUFFER] = lambda: PufferPeer(lambda: gym.make("CartPole-v1"), 1, 1)
    times: dict[str, list[float]] = {name: [] for name in makers}
    names = list(makers)
    action = np.zeros(1, dtype=np.int64)
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            envs = makers[name]()
            try:
                envs.reset(seed=0)
                for _ in range(iterations):
                    envs.step(action)
                start = time.perf_counter()
                for _ in range(iterations):
                    envs.step(action)
                times[name].append((time.perf_counter() - start) / iterations * 1e6)
            finally:
                envs.close()
    sync = times[LOCAL_SYNC]
    lines = [
        "### One env on this machine: step round trip",
        "",
        "| variant | round trip (us) | ratio to SyncVectorEnv (median per round) |",
        "|---|---:|---:|",
    ]
    for name, values in times.items():
        per_round = per_round_ratio(values, sync)
        lines.append(f"| {name} | {statistics.median(values):.0f} | {per_round:.2f}x |")
    if skipped is not None:
        lines += ["", f"Skipped: {LOCAL_PUFFER} ({skipped})."]
    lines.append("")
    return "\n".join(lines), times
