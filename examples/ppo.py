"""PPO on remote envs, in one file (the CleanRL layout: arguments, agent, rollout, GAE, update).

    python examples/ppo.py                                  # embedded local env hosts
    python examples/ppo.py --hosts tcp://sim-a:5555 dns://envhost:5555 --num-envs 16

The vector env is ``client.make_vec``: swap it for ``gymnasium.make_vec`` (or a
``SyncVectorEnv``) and nothing else changes. Envs autoreset in SAME_STEP mode; a truncated
episode is bootstrapped from the value of its final observation. The last line printed is
``mean_return=<float>``: the mean return of the last 20 finished episodes.

Needs torch (``pip install 'envserver[examples]'``).
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from torch import nn

from envserver import client


def parse_args() -> argparse.Namespace:
    """The command line, with the batch sizes it implies."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--total-timesteps", type=int, default=60_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts", nargs="*", help="env hosts (default: embedded local hosts)")
    parser.add_argument(
        "--vector",
        choices=("remote", "sync"),
        default="remote",
        help="the vector env: client.make_vec, or gymnasium's SyncVectorEnv (to compare)",
    )
    parser.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--max-grad-norm", type=float, default=0.5)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=10, help="updates between log lines")
    args = parser.parse_args()
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_updates = max(1, args.total_timesteps // args.batch_size)
    return args


def make_envs(args: argparse.Namespace) -> gym.vector.VectorEnv:
    """The vector env, recording episode statistics."""
    mode = AutoresetMode.SAME_STEP
    if args.vector == "sync":
        envs = gym.make_vec(
            args.env_id, args.num_envs, vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": mode},
        )  # fmt: skip
    else:
        envs = client.make_vec(
            args.env_id, args.num_envs, hosts=args.hosts or None,
            vector_kwargs={"autoreset_mode": mode},
        )  # fmt: skip
    return RecordEpisodeStatistics(envs)


def layer(inputs: int, outputs: int, std: float = np.sqrt(2)) -> nn.Linear:
    """A linear layer with orthogonal weights and zero biases."""
    linear = nn.Linear(inputs, outputs)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.zeros_(linear.bias)
    return linear


class Agent(nn.Module):
    """Separate actor and critic MLPs over flat observations, for a discrete action space."""

    def __init__(self, observation_size: int, num_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer(observation_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0)
        )
        self.actor = nn.Sequential(
            layer(observation_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
            layer(64, num_actions, 0.01),
        )  # fmt: skip

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """The critic's value of each observation."""
        return self.critic(obs).squeeze(-1)

    def act(
        self, obs: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Samples (or scores) an action: action, log-probability, entropy, value."""
        policy = torch.distributions.Categorical(logits=self.actor(obs))
        if action is None:
            action = policy.sample()
        return action, policy.log_prob(action), policy.entropy(), self.value(obs)


class Rollout:
    """Storage for one rollout of ``num_steps`` vector steps."""

    def __init__(self, num_steps: int, num_envs: int, observation_size: int) -> None:
        shape = (num_steps, num_envs)
        self.obs = torch.zeros((*shape, observation_size))
        self.actions = torch.zeros(shape, dtype=torch.long)
        self.log_probs = torch.zeros(shape)
        self.rewards = torch.zeros(shape)
        self.dones = torch.zeros(shape)  # whether the episode ended at this step
        self.values = torch.zeros(shape)

    def advantages(
        self, next_value: torch.Tensor, gamma: float, gae_lambda: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Generalized advantage estimates, and the returns they imply."""
        advantages = torch.zeros_like(self.rewards)
        running = torch.zeros_like(next_value)
        for t in reversed(range(len(self.rewards))):
            following = next_value if t == len(self.rewards) - 1 else self.values[t + 1]
            alive = 1.0 - self.dones[t]
            delta = self.rewards[t] + gamma * following * alive - self.values[t]
            running = delta + gamma * gae_lambda * alive * running
            advantages[t] = running
        return advantages, advantages + self.values


def update(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    args: argparse.Namespace,
) -> float:
    """Clipped-objective PPO epochs over shuffled minibatches; returns the last loss."""
    obs = rollout.obs.flatten(0, 1)
    actions, old_log_probs = rollout.actions.flatten(), rollout.log_probs.flatten()
    advantages, returns = advantages.flatten(), returns.flatten()
    loss = torch.zeros(())
    for _ in range(args.update_epochs):
        for batch in torch.randperm(args.batch_size).split(args.minibatch_size):
            _, log_probs, entropy, values = agent.act(obs[batch], actions[batch])
            ratio = (log_probs - old_log_probs[batch]).exp()
            advantage = advantages[batch]
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
            clipped = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
            policy_loss = -torch.min(ratio * advantage, clipped * advantage).mean()
            value_loss = 0.5 * (values - returns[batch]).pow(2).mean()
            loss = policy_loss + args.vf_coef * value_loss - args.ent_coef * entropy.mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
    return loss.item()


def collect(envs, agent, rollout, obs, args, finished: deque) -> torch.Tensor:
    """Steps the envs ``num_steps`` times with the current policy; returns the next obs."""
    for t in range(args.num_steps):
        rollout.obs[t] = obs
        with torch.no_grad():
            action, log_prob, _, value = agent.act(obs)
        next_obs, rewards, terminations, truncations, infos = envs.step(action.numpy())
        rewards = torch.as_tensor(rewards, dtype=torch.float32)
        truncated = np.flatnonzero(truncations & ~terminations)
        if truncated.size:  # bootstrap: the episode was cut, not over
            final = torch.as_tensor(np.stack(infos["final_obs"][truncated]), dtype=torch.float32)
            with torch.no_grad():
                rewards[truncated] += args.gamma * agent.value(final)
        rollout.actions[t], rollout.log_probs[t], rollout.values[t] = action, log_prob, value
        rollout.rewards[t] = rewards
        rollout.dones[t] = torch.as_tensor(terminations | truncations, dtype=torch.float32)
        if "episode" in infos:
            finished.extend(infos["episode"]["r"][infos["_episode"]].tolist())
        obs = torch.as_tensor(next_obs, dtype=torch.float32)
    return obs


def main() -> None:
    """Trains, logging every ``--log-every`` updates."""
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)
    envs = make_envs(args)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "a discrete action space"
    observation_size = int(np.prod(envs.single_observation_space.shape))
    agent = Agent(observation_size, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    rollout = Rollout(args.num_steps, args.num_envs, observation_size)
    finished: deque[float] = deque(maxlen=20)
    started = time.perf_counter()
    try:
        obs = torch.as_tensor(envs.reset(seed=args.seed)[0], dtype=torch.float32)
        for update_index in range(1, args.num_updates + 1):
            fraction = 1.0 - (update_index - 1) / args.num_updates  # linear annealing
            optimizer.param_groups[0]["lr"] = fraction * args.learning_rate
            obs = collect(envs, agent, rollout, obs, args, finished)
            with torch.no_grad():
                next_value = agent.value(obs)
            advantages, returns = rollout.advantages(next_value, args.gamma, args.gae_lambda)
            loss = update(agent, optimizer, rollout, advantages, returns, args)
            if update_index % args.log_every == 0 or update_index == args.num_updates:
                steps = update_index * args.batch_size
                mean = np.mean(finished) if finished else float("nan")
                print(
                    f"steps={steps} mean_return_20={mean:.1f} loss={loss:.3f} "
                    f"steps_per_s={steps / (time.perf_counter() - started):.0f}",
                    flush=True,
                )
    finally:
        envs.close()
    print(f"mean_return={np.mean(finished) if finished else float('nan'):.2f}")


if __name__ == "__main__":
    main()
