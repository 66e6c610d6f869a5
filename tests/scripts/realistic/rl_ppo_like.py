"""A toy PPO loop, shaped like the single-file RL scripts (CleanRL's ppo.py and friends):
collect a rollout from a batch of environments, compute GAE advantages, then run a few
epochs of minibatch updates on the clipped surrogate ``-min(ratio * adv, clip(ratio) * adv)``
plus a value loss minus an entropy bonus.

The environment is an unstable 1-D balance task simulated with tensors: the pole drifts
away from 0 and the agent pushes left or right; +1 reward per step until ``|x| > 1`` or
the step limit. Returns are in steps survived, so as the policy improves the returns,
and with them the value loss, grow: the reported loss RISES while the agent gets better.
"""
import argparse

import torch
import torch.nn as nn
from torch.distributions import Categorical


class BalanceEnv:
    """`num_envs` copies of x' = 1.1 x + 0.1 a + noise, reset on failure or after `max_steps`."""

    def __init__(self, num_envs, max_steps, generator):
        self.num_envs, self.max_steps, self.g = num_envs, max_steps, generator
        self.x = self._reset_x(num_envs)
        self.t = torch.zeros(num_envs, dtype=torch.long)

    def _reset_x(self, n):
        return (torch.rand(n, generator=self.g) - 0.5) * 0.2

    def obs(self):
        return torch.stack([self.x, self.t / self.max_steps], dim=1)

    def step(self, action):
        push = action.float() * 2 - 1
        self.x = 1.1 * self.x + 0.1 * push + 0.05 * torch.randn(self.num_envs, generator=self.g)
        self.t += 1
        done = (self.x.abs() > 1) | (self.t >= self.max_steps)
        reward = torch.ones(self.num_envs)
        lengths = self.t[done].clone()
        self.x[done] = self._reset_x(int(done.sum()))
        self.t[done] = 0
        return self.obs(), reward, done, lengths


class Agent(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 2))
        self.critic = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def get_value(self, obs):
        return self.critic(obs).squeeze(-1)

    def get_action_and_value(self, obs, action=None):
        dist = Categorical(logits=self.actor(obs))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.get_value(obs)


def main():
    parser = argparse.ArgumentParser(description="Toy PPO on a 1-D balance task")
    parser.add_argument("--updates", type=int, default=25, help="number of rollout+update cycles (default: 25)")
    parser.add_argument("--epochs-per-update", type=int, default=4, help="optimization epochs per rollout")
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--num-steps", type=int, default=64, help="rollout length per environment")
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--max-episode-steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    env = BalanceEnv(args.num_envs, args.max_episode_steps, torch.Generator().manual_seed(args.seed))
    agent = Agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches

    obs_buf = torch.zeros(args.num_steps, args.num_envs, 2)
    actions = torch.zeros(args.num_steps, args.num_envs, dtype=torch.long)
    logprobs = torch.zeros(args.num_steps, args.num_envs)
    rewards = torch.zeros(args.num_steps, args.num_envs)
    dones = torch.zeros(args.num_steps, args.num_envs)
    values = torch.zeros(args.num_steps, args.num_envs)

    next_obs = env.obs()
    for update in range(1, args.updates + 1):
        episode_lengths = []
        for t in range(args.num_steps):
            obs_buf[t] = next_obs
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            actions[t], logprobs[t], values[t] = action, logprob, value
            next_obs, rewards[t], done, lengths = env.step(action)
            dones[t] = done.float()
            episode_lengths.extend(lengths.tolist())

        # Generalized advantage estimation, bootstrapping from the value of the last observation.
        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                nextnonterminal = 1.0 - dones[t]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values

        b_obs, b_actions, b_logprobs = obs_buf.reshape(-1, 2), actions.reshape(-1), logprobs.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)

        for _ in range(args.epochs_per_update):
            perm = torch.randperm(batch_size)
            for start in range(0, batch_size, minibatch_size):
                mb = perm[start:start + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = b_advantages[mb]
                pg_loss = -torch.min(ratio * mb_adv,
                                     torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef) * mb_adv).mean()
                v_loss = 0.5 * (newvalue - b_returns[mb]).pow(2).mean()
                loss = pg_loss + args.vf_coef * v_loss - args.ent_coef * entropy.mean()

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()

        mean_return = sum(episode_lengths) / len(episode_lengths)
        print(f"update {update} return {mean_return:.2f} loss {loss.item():.4f}")
    print("done")


if __name__ == "__main__":
    main()
