"""Multi-agent PPO with parameter sharing on remote PettingZoo envs, in one file (CleanRL's layout).

    python examples/ppo_multiagent.py                       # MPE simple_spread, local hosts
    python examples/ppo_multiagent.py --hosts tcp://sim-a:5555 --num-envs 16

One policy acts for every agent, seeing its observation and a one-hot of which agent it is
(agents must share their spaces). The vector env is ``MultiAgentVectorEnv``: every agent's
values batched over the envs, ``envs.active`` saying which agents act. Envs autoreset in
SAME_STEP mode; an agent whose episode was cut (truncated) is bootstrapped from the value of its
final observation. The last line printed is ``mean_return=<float>``: the mean, over the last 20
finished episodes, of an episode's return per agent.

Needs torch and PettingZoo's MPE (``pip install 'envserver[examples,multiagent]' mpe2``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from torch import nn

from envserver.client import MultiAgentVectorEnv


def parse_args() -> argparse.Namespace:
    """The command line, with the batch sizes it implies."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="mpe2.simple_spread_v3")
    parser.add_argument("--env-kwargs", type=json.loads, default={"N": 3, "max_cycles": 25})
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--total-timesteps", type=int, default=500_000, help="env steps")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts", nargs="*", help="env hosts (default: local hosts)")
    parser.add_argument("--num-local-hosts", type=int, help="local hosts (default: one per core)")
    parser.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout")
    parser.add_argument("--learning-rate", type=float, default=7e-4)
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
    args.batch_steps = args.num_envs * args.num_steps
    args.num_updates = max(1, args.total_timesteps // args.batch_steps)
    return args


def layer(inputs: int, outputs: int, std: float = np.sqrt(2)) -> nn.Linear:
    """A linear layer with orthogonal weights and zero biases."""
    linear = nn.Linear(inputs, outputs)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.zeros_(linear.bias)
    return linear


class Agent(nn.Module):
    """Actor and critic MLPs shared by every agent, over its observation and its one-hot id."""

    def __init__(self, input_size: int, num_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer(input_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0)
        )
        self.actor = nn.Sequential(
            layer(input_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
            layer(64, num_actions, 0.01),
        )  # fmt: skip

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """The critic's value of each input."""
        return self.critic(x).squeeze(-1)

    def act(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Samples (or scores) an action: action, log-probability, entropy, value."""
        policy = torch.distributions.Categorical(logits=self.actor(x))
        if action is None:
            action = policy.sample()
        return action, policy.log_prob(action), policy.entropy(), self.value(x)


class Inputs:
    """The policy's inputs: each agent's observation (flattened) and its one-hot id."""

    def __init__(self, agents: list[str], observation_space: spaces.Space) -> None:
        self.agents = agents
        self.space = observation_space
        self.ids = torch.eye(len(agents))
        self.size = spaces.flatdim(observation_space) + len(agents)

    def __call__(self, per_agent: dict[str, np.ndarray]) -> torch.Tensor:
        """``(num_envs, num_agents, size)`` from each agent's batch of observations."""
        columns = [
            torch.as_tensor(np.asarray(per_agent[a], np.float32).reshape(len(per_agent[a]), -1))
            for a in self.agents
        ]
        obs = torch.stack(columns, dim=1)
        ids = self.ids.expand(obs.shape[0], -1, -1)
        return torch.cat([obs, ids], dim=-1)


class Rollout:
    """One rollout of ``num_steps`` steps, per env and agent."""

    def __init__(self, num_steps: int, num_envs: int, num_agents: int, size: int) -> None:
        shape = (num_steps, num_envs, num_agents)
        self.inputs = torch.zeros((*shape, size))
        self.actions = torch.zeros(shape, dtype=torch.long)
        self.log_probs = torch.zeros(shape)
        self.rewards = torch.zeros(shape)
        self.dones = torch.zeros(shape)  # whether the agent's episode ended at this step
        self.values = torch.zeros(shape)
        self.acted = torch.zeros(shape, dtype=torch.bool)  # the agent was active, so it acted

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


def update(agent, optimizer, rollout, advantages, returns, args) -> float:
    """Clipped-objective PPO epochs over the steps where agents acted; returns the last loss."""
    acted = rollout.acted.flatten()
    inputs = rollout.inputs.flatten(0, 2)[acted]
    actions, old_log_probs = rollout.actions.flatten()[acted], rollout.log_probs.flatten()[acted]
    advantages, returns = advantages.flatten()[acted], returns.flatten()[acted]
    size = len(inputs)
    loss = torch.zeros(())
    for _ in range(args.update_epochs):
        for batch in torch.randperm(size).split(max(1, size // args.num_minibatches)):
            _, log_probs, entropy, values = agent.act(inputs[batch], actions[batch])
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


class Returns:
    """Each env's running return per agent, and the last 20 finished episodes'."""

    def __init__(self, num_envs: int) -> None:
        self.running = np.zeros(num_envs)
        self.finished: deque[float] = deque(maxlen=20)

    def add(self, rewards: np.ndarray, ended: np.ndarray) -> None:
        """Adds a step's rewards ``(num_envs, num_agents)``; closes the envs that ``ended``."""
        self.running += rewards.mean(axis=1)
        self.finished.extend(self.running[ended].tolist())
        self.running[ended] = 0.0


def collect(envs, agent, rollout, x, inputs, args, returns: Returns) -> torch.Tensor:
    """Steps the envs ``num_steps`` times with the current policy; returns the next inputs."""
    agents = envs.possible_agents
    for t in range(args.num_steps):
        acted = torch.as_tensor(np.stack([envs.active[a] for a in agents], axis=1))
        rollout.inputs[t], rollout.acted[t] = x, acted
        with torch.no_grad():
            action, log_prob, _, value = agent.act(x)
        obs, rewards, terminations, truncations, infos = envs.step(
            {a: action[:, j].numpy() for j, a in enumerate(agents)}
        )
        reward = np.stack([rewards[a] for a in agents], axis=1)
        terminated = np.stack([terminations[a] for a in agents], axis=1)
        truncated = np.stack([truncations[a] for a in agents], axis=1)
        ended = infos.get("_final_obs", np.zeros(envs.num_envs, bool))
        returns.add(reward, ended)
        reward = torch.as_tensor(reward, dtype=torch.float32)
        cut = truncated & ~terminated
        if cut.any():  # bootstrap: the agent's episode was cut, not over
            final = inputs(obs)  # an env that goes on: the agent's last observation
            if ended.any():  # an env reset: its agents' last observations are set apart
                where = torch.as_tensor(ended)[:, None, None]
                final = torch.where(where, inputs(infos["final_obs"]), final)
            with torch.no_grad():
                reward += args.gamma * agent.value(final) * torch.as_tensor(cut)
        rollout.actions[t], rollout.log_probs[t], rollout.values[t] = action, log_prob, value
        rollout.rewards[t] = reward * acted
        rollout.dones[t] = torch.as_tensor(terminated | truncated, dtype=torch.float32)
        x = inputs(obs)
    return x


def main() -> None:
    """Trains, logging every ``--log-every`` updates."""
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)
    envs = MultiAgentVectorEnv(
        args.env,
        num_envs=args.num_envs,
        env_kwargs=args.env_kwargs,
        hosts=args.hosts or None,
        num_local_hosts=args.num_local_hosts,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    agents = envs.possible_agents
    space = envs.single_action_space(agents[0])
    assert isinstance(space, spaces.Discrete), "a discrete action space, shared by the agents"
    inputs = Inputs(agents, envs.single_observation_space(agents[0]))
    agent = Agent(inputs.size, int(space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    rollout = Rollout(args.num_steps, args.num_envs, len(agents), inputs.size)
    returns = Returns(args.num_envs)
    started = time.perf_counter()
    try:
        x = inputs(envs.reset(seed=args.seed)[0])
        for update_index in range(1, args.num_updates + 1):
            fraction = 1.0 - (update_index - 1) / args.num_updates  # linear annealing
            optimizer.param_groups[0]["lr"] = fraction * args.learning_rate
            x = collect(envs, agent, rollout, x, inputs, args, returns)
            with torch.no_grad():
                next_value = agent.value(x)
            advantages, targets = rollout.advantages(next_value, args.gamma, args.gae_lambda)
            loss = update(agent, optimizer, rollout, advantages, targets, args)
            if update_index % args.log_every == 0 or update_index == args.num_updates:
                steps = update_index * args.batch_steps
                finished = returns.finished
                mean = np.mean(finished) if finished else float("nan")
                print(
                    f"steps={steps} mean_return_20={mean:.1f} loss={loss:.3f} "
                    f"steps_per_s={steps / (time.perf_counter() - started):.0f}",
                    flush=True,
                )
    finally:
        envs.close()
    finished = returns.finished
    print(f"mean_return={np.mean(finished) if finished else float('nan'):.2f}")


if __name__ == "__main__":
    main()
