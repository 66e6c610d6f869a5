"""A soft actor-critic loop shaped like the single-file SAC scripts (CleanRL's sac_continuous_action.py):
a replay buffer, an actor, twin Q critics with Polyak-averaged targets, an automatically tuned
entropy temperature, three Adam optimizers stepping every iteration (critics, actor, alpha).

The environment is a tensor-simulated 1-D point that should be pushed to 0 (reward ``-x^2 -
0.1 a^2``), reset every ``--episode`` steps. Its critic loss is noisy by nature: the targets
move with the policy and the temperature, and a few batches in a hundred are several times the
median. Prints ``update N q_loss L`` every 100 updates and ``done``."""
import argparse

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--updates", type=int, default=1300)
p.add_argument("--learning-starts", type=int, default=100)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--episode", type=int, default=50)
p.add_argument("--gamma", type=float, default=0.99)
p.add_argument("--tau", type=float, default=0.005)
p.add_argument("--q-lr", type=float, default=1e-3)
p.add_argument("--policy-lr", type=float, default=3e-4)
p.add_argument("--seed", type=int, default=1)
args = p.parse_args()


class QNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, obs, act):
        return self.net(torch.cat([obs, act], 1))


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.mean = nn.Linear(32, 1)
        self.log_std = nn.Linear(32, 1)

    def get_action(self, obs):
        h = self.body(obs)
        mean, log_std = self.mean(h), torch.clamp(self.log_std(h), -5, 2)
        normal = torch.distributions.Normal(mean, log_std.exp())
        x = normal.rsample()
        action = torch.tanh(x)
        log_prob = normal.log_prob(x) - torch.log(1 - action.pow(2) + 1e-6)
        return action, log_prob.sum(1, keepdim=True)


def main():
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    actor, qf1, qf2 = Actor(), QNetwork(), QNetwork()
    qf1_target, qf2_target = QNetwork(), QNetwork()
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.q_lr)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr)
    log_alpha = torch.zeros(1, requires_grad=True)
    a_optimizer = torch.optim.Adam([log_alpha], lr=args.q_lr)
    target_entropy = -1.0
    size = args.updates + args.learning_starts
    obs_buf, act_buf = torch.zeros(size, 1), torch.zeros(size, 1)
    rew_buf, next_buf, done_buf = torch.zeros(size, 1), torch.zeros(size, 1), torch.zeros(size, 1)
    x = torch.rand(1, 1, generator=g) * 2 - 1
    for t in range(size):
        if t < args.learning_starts:
            action = torch.rand(1, 1, generator=g) * 2 - 1
        else:
            with torch.no_grad():
                action, _ = actor.get_action(x)
        nxt = x + 0.3 * action + 0.02 * torch.randn(1, 1, generator=g)
        done = float((t + 1) % args.episode == 0)
        obs_buf[t], act_buf[t], next_buf[t], done_buf[t] = x, action, nxt, done
        rew_buf[t] = -(nxt ** 2) - 0.1 * action ** 2
        x = torch.rand(1, 1, generator=g) * 2 - 1 if done else nxt
        if t < args.learning_starts:
            continue
        idx = torch.randint(0, t + 1, (args.batch_size,), generator=g)
        obs, act, rew, nobs, dn = obs_buf[idx], act_buf[idx], rew_buf[idx], next_buf[idx], done_buf[idx]
        alpha = log_alpha.exp().item()
        with torch.no_grad():
            next_act, next_logp = actor.get_action(nobs)
            target_q = torch.min(qf1_target(nobs, next_act), qf2_target(nobs, next_act)) - alpha * next_logp
            target = rew + (1 - dn) * args.gamma * target_q
        qf_loss = nn.functional.mse_loss(qf1(obs, act), target) + nn.functional.mse_loss(qf2(obs, act), target)
        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        pi, logp = actor.get_action(obs)
        actor_loss = (alpha * logp - torch.min(qf1(obs, pi), qf2(obs, pi))).mean()
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        with torch.no_grad():
            _, logp = actor.get_action(obs)
        alpha_loss = (-log_alpha.exp() * (logp + target_entropy)).mean()
        a_optimizer.zero_grad()
        alpha_loss.backward()
        a_optimizer.step()
        with torch.no_grad():
            for net, tgt in ((qf1, qf1_target), (qf2, qf2_target)):
                for param, target_param in zip(net.parameters(), tgt.parameters()):
                    target_param.mul_(1 - args.tau).add_(param, alpha=args.tau)
        update = t - args.learning_starts
        if update % 100 == 0:
            print(f"update {update} q_loss {qf_loss.item():.4g} alpha {alpha:.3f}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
