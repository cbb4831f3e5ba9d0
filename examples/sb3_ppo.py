"""Stable-Baselines3 PPO over env hosts: ``SubprocVecEnv`` swapped for ``RemoteVecEnv``.

    python examples/sb3_ppo.py                                   # embedded local env hosts
    python examples/sb3_ppo.py --hosts dns://envhost:5555 --num-envs 16

The last line printed is ``mean_return=<float>`` (the last 20 finished episodes).
Needs ``pip install 'envserver[sb3]'``.

Torch gets one thread (``--torch-threads``): by default it starts one per core, and those
threads fight the local hosts for the cores whenever the machine is busy, which can make
training several times slower (docs/guides/trainers.md).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecMonitor

from envserver.client.sb3 import RemoteVecEnv


def main() -> None:
    """Trains PPO and prints the mean return of the last episodes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--total-timesteps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hosts", nargs="*", help="env hosts (default: embedded local hosts)")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch's threads (default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)  # before the env is made (see above)

    if args.hosts:  # by env id: the hosts make the envs, no code travels; VecMonitor counts
        env = VecMonitor(RemoteVecEnv(env_id=args.env_id, num_envs=args.num_envs, hosts=args.hosts))
    else:  # factories, as for SubprocVecEnv (each env Monitor-wrapped on its host)
        env = make_vec_env(args.env_id, n_envs=args.num_envs, vec_env_cls=RemoteVecEnv)
    try:
        model = PPO(
            "MlpPolicy",
            env,
            # Settings known to suit CartPole (those of the RL Baselines3 Zoo).
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=1e-3,
            seed=args.seed,
            device="cpu",
            verbose=1,
        )
        model.learn(total_timesteps=args.total_timesteps)
        returns = [episode["r"] for episode in model.ep_info_buffer][-20:]
    finally:
        env.close()
    print(f"mean_return={np.mean(returns) if returns else float('nan'):.2f}")


if __name__ == "__main__":
    main()
