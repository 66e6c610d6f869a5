"""PPO across DDP ranks, shaped like the public multi-GPU PPO scripts (CleanRL's
ppo_atari_multigpu.py): launched by torchrun (``ptdash --nproc-per-node 2``), gloo, each rank
its own environments (seeded by rank) and rollout, the agent wrapped in DDP so that the
minibatch gradients are averaged across ranks, advantages normalized per minibatch, the
clipped surrogate plus a value loss minus an entropy bonus, ``clip_grad_norm_(0.5)``.

The environment is the 1-D balance task of realistic/rl_ppo_like.py: as the policy improves
the returns grow, and with them the value loss; each rollout's first minibatches are new data.
Rank 0 prints ``update N return R loss L``; every rank prints ``rank R done``."""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributions import Categorical
from torch.nn.parallel import DistributedDataParallel as DDP


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

    def forward(self, obs):
        """Both heads, so that DDP averages the actor's and the critic's gradients."""
        return self.actor(obs), self.critic(obs).squeeze(-1)

    def get_value(self, obs):
        return self.critic(obs).squeeze(-1)

    def get_action_and_value(self, obs, action=None):
        dist = Categorical(logits=self.actor(obs))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.get_value(obs)


def main():
    parser = argparse.ArgumentParser(description="PPO over DDP ranks on a 1-D balance task")
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--epochs-per-update", type=int, default=4)
    parser.add_argument("--num-envs", type=int, default=16, help="environments per rank")
    parser.add_argument("--num-steps", type=int, default=64)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--max-episode-steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2.5e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    env = BalanceEnv(args.num_envs, args.max_episode_steps, torch.Generator().manual_seed(args.seed + rank))
    agent = DDP(Agent())
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
        frac = 1.0 - (update - 1.0) / args.updates  # the LR annealed linearly, as CleanRL does
        optimizer.param_groups[0]["lr"] = frac * args.lr
        episode_lengths = []
        for t in range(args.num_steps):
            obs_buf[t] = next_obs
            with torch.no_grad():
                action, logprob, _, value = agent.module.get_action_and_value(next_obs)
            actions[t], logprobs[t], values[t] = action, logprob, value
            next_obs, rewards[t], done, lengths = env.step(action)
            dones[t] = done.float()
            episode_lengths.extend(lengths.tolist())
        with torch.no_grad():
            next_value = agent.module.get_value(next_obs)
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
                logits, newvalue = agent(b_obs[mb])
                probs = Categorical(logits=logits)
                newlogprob, entropy = probs.log_prob(b_actions[mb]), probs.entropy()
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = b_advantages[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = -torch.min(ratio * mb_adv,
                                     torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef) * mb_adv).mean()
                v_loss = 0.5 * (newvalue - b_returns[mb]).pow(2).mean()
                loss = pg_loss + args.vf_coef * v_loss - args.ent_coef * entropy.mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
        if rank == 0:
            mean_return = sum(episode_lengths) / max(1, len(episode_lengths))
            print(f"update {update} return {mean_return:.2f} loss {loss.item():.4f}", flush=True)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
