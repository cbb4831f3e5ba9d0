"""Where a step's microseconds go: CPU per step on the host and on the client, and a profile.

CPU time (not wall time) is measured, so the numbers hold on a busy machine far better than
rates do: each line is a median over rounds of ``process_time`` (or, for a host process, its
``/proc`` CPU ticks) divided by the steps of the round.

- ``host handle``: ``EnvHost.handle`` of a STEP for 8 CartPole envs, in this process, and the
  part of it spent in the envs themselves (``EnvBlock.step``);
- ``host process``: the CPU of a real host process per STEP (socket, loop and all) for 8 envs;
- ``client send``: the client's CPU in ``step_async`` (checks, encoding, sending) and in
  ``step_wait`` (waiting, decoding, merging) for 1 env;
- ``client step``: the client's CPU per ``RemoteVectorEnv.step``, 1 env on 1 host and 16 envs
  on 2 hosts, with its wall round trip.

Usage::

    python benchmarks/profile_hotpath.py                # the table
    python benchmarks/profile_hotpath.py --profile host # cProfile of the host's handle
    python benchmarks/profile_hotpath.py --profile client-1 --steps 20000

Run it against another checkout with ``PYTHONPATH=/that/checkout`` (hosts inherit it). In a
checkout where the client is ``envserver.client`` (the ``client/`` folder), link it into that
checkout's package first, ``ln -s ../client /that/checkout/envserver/client``: otherwise
``envserver.client`` would come from this checkout's install, which the client refuses.
The raw floors are :mod:`envserver.bench.floors`, taken from the checkout on the path: for a
checkout from before that package, run that checkout's own copy of this script.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zmq

from envserver import client
from envserver.bench.floors import RawFloor, echo_server, step_message_sizes
from envserver.host.loop import EnvHost, HostConfig
from envserver.testing import start_host
from envserver.wire.messages import Command, decode_reply, encode_request

#: Linux clock ticks per second, for the host process's CPU time.
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _median_us(rounds: list[float], steps: int) -> float:
    return statistics.median(rounds) / steps * 1e6


def host_handle(
    steps: int, rounds: int, num_envs: int = 8, profile: cProfile.Profile | None = None
) -> list[str]:
    """CPU per STEP of ``EnvHost.handle`` for CartPole envs, and of ``EnvBlock.step`` alone."""
    with tempfile.TemporaryDirectory() as tmp:
        host = EnvHost(HostConfig(bind=f"ipc://{tmp}/h.sock"))
        try:
            ids = iter(range(1, 10**9))
            hello = host.handle(encode_request(next(ids), Command.HELLO, None, {}, allow_pickle=0))
            session = decode_reply(hello, allow_pickle=False).body["session"]
            make = {"env_id": "CartPole-v1", "kwargs": {}, "num_envs": num_envs}
            host.handle(encode_request(next(ids), Command.MAKE, session, make, allow_pickle=0))
            reset = {"seeds": list(range(num_envs)), "options": None}
            host.handle(encode_request(next(ids), Command.RESET, session, reset, allow_pickle=0))
            actions = np.zeros(num_envs, np.int64)
            block = next(iter(host.sessions)).block
            handle_cpu, block_cpu = [], []
            for _ in range(rounds):
                requests = [
                    encode_request(
                        next(ids), Command.STEP, session, {"actions": actions}, allow_pickle=True
                    )
                    for _ in range(steps)
                ]
                if profile is not None:
                    profile.enable()
                start = time.process_time()
                for frames in requests:
                    host.handle(frames)
                handle_cpu.append(time.process_time() - start)
                if profile is not None:
                    profile.disable()
                start = time.process_time()
                for _ in range(steps):
                    block.step(actions)
                block_cpu.append(time.process_time() - start)
        finally:
            host.close()
    handle_us, block_us = _median_us(handle_cpu, steps), _median_us(block_cpu, steps)
    return [
        f"| host handle, STEP {num_envs} envs | {handle_us:.1f} |",
        f"| - of which EnvBlock.step | {block_us:.1f} |",
        f"| - protocol overhead | {handle_us - block_us:.1f} |",
    ]


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def _children() -> list[int]:
    """The pids of this process's children."""
    pid = os.getpid()
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _stepping(
    num_envs: int, num_hosts: int, steps: int, rounds: int, directory: Path
) -> tuple[list[float], list[float], list[float], Callable[[int], None]]:
    """Client CPU, wall and host CPU per round of ``steps`` vector steps, and a step runner."""
    hosts = [start_host(directory) for _ in range(num_hosts)]
    envs = client.RemoteVectorEnv(
        env_id="CartPole-v1", num_envs=num_envs, hosts=[h.endpoint for h in hosts]
    )
    actions = np.zeros(num_envs, np.int64)
    envs.reset(seed=0)

    def run(count: int) -> None:
        for _ in range(count):
            envs.step(actions)

    client_cpu, wall, host_cpu = [], [], []
    try:
        run(steps // 4)  # warm up
        for _ in range(rounds):
            ticks = sum(_ticks(h.process.pid) for h in hosts)
            cpu, start = time.process_time(), time.perf_counter()
            run(steps)
            wall.append(time.perf_counter() - start)
            client_cpu.append(time.process_time() - cpu)
            host_cpu.append((sum(_ticks(h.process.pid) for h in hosts) - ticks) / TICKS_PER_S)
    except BaseException:
        envs.close()
        for host in hosts:
            host.stop()
        raise

    def finish(count: int) -> None:
        try:
            run(count)
        finally:
            envs.close()
            for host in hosts:
                host.stop()

    return client_cpu, wall, host_cpu, finish


def client_send(steps: int, rounds: int, directory: Path) -> list[str]:
    """Client CPU per ``step_async`` (checks, encode, send) and ``step_wait`` of 1 env."""
    host = start_host(directory)
    envs = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=1, hosts=[host.endpoint])
    try:
        envs.reset(seed=0)
        actions = np.zeros(1, np.int64)
        send_cpu, wait_cpu = [], []
        for _ in range(rounds):
            sending = waiting = 0.0
            for _ in range(steps):
                start = time.process_time()
                envs.step_async(actions)
                middle = time.process_time()
                envs.step_wait()
                waiting += time.process_time() - middle
                sending += middle - start
            send_cpu.append(sending)
            wait_cpu.append(waiting)
    finally:
        envs.close()
        host.stop()
    return [
        f"| client step_async CPU, 1 env | {_median_us(send_cpu, steps):.1f} |",
        f"| client step_wait CPU, 1 env | {_median_us(wait_cpu, steps):.1f} |",
    ]


def stepping_rows(num_envs: int, num_hosts: int, steps: int, rounds: int, directory: Path) -> list:
    """Client CPU, host CPU and wall time per vector step."""
    client_cpu, wall, host_cpu, finish = _stepping(num_envs, num_hosts, steps, rounds, directory)
    finish(0)
    label = f"{num_envs} env{'s' if num_envs > 1 else ''} / {num_hosts} host"
    return [
        f"| client CPU per step, {label} | {_median_us(client_cpu, steps):.1f} |",
        f"| host CPU per step (all hosts), {label} | {_median_us(host_cpu, steps):.1f} |",
        f"| wall per step, {label} | {_median_us(wall, steps):.1f} |",
    ]


def floor_rows(steps: int, rounds: int, directory: Path) -> list[str]:
    """The raw ZeroMQ echo of a 1-env STEP's sizes, and the protocol-free 16-env floor."""
    request, reply_sizes = step_message_sizes()
    context = zmq.Context()
    cpu, wall, server_cpu = [], [], []
    with echo_server(f"ipc://{directory}/echo.sock", reply_sizes) as endpoint:
        server = max(_children())  # the echo server just started
        dealer = context.socket(zmq.DEALER)
        dealer.connect(endpoint)
        for _ in range(rounds):
            ticks = _ticks(server)
            start_cpu, start = time.process_time(), time.perf_counter()
            for _ in range(steps):
                dealer.send_multipart(request)
                dealer.recv_multipart()
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            server_cpu.append((_ticks(server) - ticks) / TICKS_PER_S)
        dealer.send_multipart([b"quit"])
        dealer.close(linger=0)
    context.term()
    floor = RawFloor("CartPole-v1", 16, 2, directory / "raw")
    floor_cpu, floor_wall = [], []
    try:
        floor.reset(0)
        actions = np.zeros(16, np.int64)
        for _ in range(rounds):
            start_cpu, start = time.process_time(), time.perf_counter()
            for _ in range(steps):
                floor.step(actions)
            floor_wall.append(time.perf_counter() - start)
            floor_cpu.append(time.process_time() - start_cpu)
    finally:
        floor.close()
    return [
        f"| floor: echo client CPU per round trip | {_median_us(cpu, steps):.1f} |",
        f"| floor: echo server CPU per round trip | {_median_us(server_cpu, steps):.1f} |",
        f"| floor: echo wall per round trip | {_median_us(wall, steps):.1f} |",
        f"| floor: raw client CPU per step, 16 envs / 2 host | {_median_us(floor_cpu, steps):.1f}"
        " |",
        f"| floor: raw wall per step, 16 envs / 2 host | {_median_us(floor_wall, steps):.1f} |",
    ]


def main() -> None:
    """Prints the table, or one cProfile."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", choices=["host", "client-1", "client-16"])
    parser.add_argument(
        "--only",
        action="append",
        choices=["floor", "host", "send", "step1", "step16"],
        help="only these sections (repeatable; default all)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envserver-profile-") as tmp:
        directory = Path(tmp)
        if args.profile == "host":
            profile = cProfile.Profile(time.process_time)
            host_handle(args.steps, 1, 1, profile)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            return
        if args.profile is not None:
            num_envs, num_hosts = (1, 1) if args.profile == "client-1" else (16, 2)
            *_, finish = _stepping(num_envs, num_hosts, 100, 1, directory)
            profile = cProfile.Profile(time.process_time)
            profile.runcall(finish, args.steps)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            return
        sections = {
            "floor": lambda: floor_rows(args.steps, args.rounds, directory),
            "host": lambda: (
                host_handle(args.steps, args.rounds, 1) + host_handle(args.steps, args.rounds, 8)
            ),
            "send": lambda: client_send(args.steps, args.rounds, directory),
            "step1": lambda: stepping_rows(1, 1, args.steps, args.rounds, directory),
            "step16": lambda: stepping_rows(16, 2, args.steps, args.rounds, directory),
        }
        rows = ["| what (CartPole) | us per step (median) |", "|---|---:|"]
        for name in args.only or list(sections):
            rows += sections[name]()
        print("\n".join(rows))


if __name__ == "__main__":
    main()
