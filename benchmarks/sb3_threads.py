"""SB3 PPO on local hosts against ``SubprocVecEnv``, on a quiet machine and beside a busy one.

Each run is a fresh process that trains ``PPO("MlpPolicy", env, n_steps=128, n_epochs=1)``
for 8192 steps on 4 CartPoles and reports the wall time of ``learn`` (the envs and the model
are made before the clock starts). The runs alternate, ``RemoteVecEnv`` then
``SubprocVecEnv``, round after round, so that a machine whose load drifts weighs on both
alike; the table has each one's median and their ratio. The conditions:

- ``quiet``: torch's default threads, nothing else started;
- ``busy``: torch's default threads, beside one busy process (``while True: pass``) that the
  script starts before the condition's runs and kills after them;
- ``busy, 1 thread``: the same, with ``torch.set_num_threads(1)`` in the trainer.

Then ``idle``: the CPU the trainer and a host spend while an env's step sleeps for a second
(a wait that spins would spend the second).

Usage::

    python benchmarks/sb3_threads.py               # 3 rounds per condition
    python benchmarks/sb3_threads.py --rounds 5

Needs ``pip install 'envserver[sb3]'``. The numbers are those of the machine it runs on, and
of whatever else runs there: read the ratios, which come from the same rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import gymnasium as gym

#: The variants, in the order each round runs them.
VARIANTS = ("RemoteVecEnv", "SubprocVecEnv")
#: The conditions: their name, whether a busy process runs beside, the trainer's torch threads.
CONDITIONS = (("quiet", False, None), ("busy", True, None), ("busy, 1 thread", True, 1))
#: The run: envs, PPO's settings, steps.
NUM_ENVS, N_STEPS, TOTAL_STEPS = 4, 128, 8192


def run(variant: str, threads: int | None) -> dict[str, float]:
    """One run in this process: the seconds of ``learn``, and torch's threads."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from envserver.client.sb3 import RemoteVecEnv

    if threads is not None:
        torch.set_num_threads(threads)
    vec_env_cls = RemoteVecEnv if variant == "RemoteVecEnv" else SubprocVecEnv
    env = make_vec_env("CartPole-v1", n_envs=NUM_ENVS, vec_env_cls=vec_env_cls, seed=0)
    try:
        model = PPO("MlpPolicy", env, n_steps=N_STEPS, n_epochs=1, seed=0, device="cpu")
        started = time.perf_counter()
        model.learn(TOTAL_STEPS)
        seconds = time.perf_counter() - started
    finally:
        env.close()
    return {"learn_s": seconds, "torch_threads": torch.get_num_threads()}


class SleepyStep(gym.Wrapper):
    """An env whose step sleeps ``delay_s`` first, and says the CPU its process spent meanwhile."""

    def __init__(self, env: gym.Env, delay_s: float) -> None:
        super().__init__(env)
        self.delay_s = delay_s

    def step(self, action: object) -> tuple:
        """Sleeps, then steps; ``info["host_cpu_s"]``: this process's CPU seconds in the step."""
        cpu = time.process_time()
        time.sleep(self.delay_s)
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs, reward, terminated, truncated, {"host_cpu_s": time.process_time() - cpu}


def idle(delay_s: float = 1.0) -> dict[str, float]:
    """The CPU seconds of the trainer and of the host over steps that sleep ``delay_s``."""
    import numpy as np

    from envserver import client

    envs = client.RemoteVectorEnv(
        [lambda: SleepyStep(gym.make("CartPole-v1"), delay_s)], info_format="list"
    )
    try:
        envs.reset(seed=0)
        trainer, host = [], []
        for _ in range(3):
            cpu = time.process_time()
            _, _, _, _, infos = envs.step(np.zeros(1, dtype=np.int64))
            trainer.append(time.process_time() - cpu)
            host.append(infos[0]["host_cpu_s"])
    finally:
        envs.close()
    return {"trainer_cpu_s": max(trainer), "host_cpu_s": max(host), "step_s": delay_s}


def child(*args: str) -> dict[str, float]:
    """What this script prints when run with ``args``, in a fresh process."""
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"{args} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Runs the rounds and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--idle", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run(args.run, args.threads)))
        return
    if args.idle:
        print(json.dumps(idle()))
        return

    rows = []
    for name, busy, threads in CONDITIONS:
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    extra = ["--threads", str(threads)] if threads else []
                    result = child("--run", variant, *extra)
                    times[variant].append(result["learn_s"])
                    print(f"{name:>15} {variant:>14}: {result['learn_s']:6.2f} s", flush=True)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
        medians = {variant: statistics.median(times[variant]) for variant in VARIANTS}
        rows.append((name, medians, times))

    print(
        f"\nPPO(n_steps={N_STEPS}, n_epochs=1).learn({TOTAL_STEPS}), {NUM_ENVS} CartPoles, "
        f"median of {args.rounds} fresh processes each (learn only):\n"
    )
    print("| condition | RemoteVecEnv, local hosts | SubprocVecEnv | Remote / Subproc |")
    print("|---|---|---|---|")
    for name, medians, _ in rows:
        remote, subproc = medians["RemoteVecEnv"], medians["SubprocVecEnv"]
        print(f"| {name} | {remote:.2f} s | {subproc:.2f} s | {remote / subproc:.2f} |")
    spent = child("--idle")
    print(
        f"\nidle: a step that sleeps {spent['step_s']:.1f} s costs the trainer "
        f"{spent['trainer_cpu_s'] * 1000:.1f} ms of CPU and its host "
        f"{spent['host_cpu_s'] * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
