"""A short soft actor-critic loop shaped like the public ones (CleanRL's sac_continuous_action):
an actor, twin Q critics with target copies, a learned temperature, a replay buffer filled by
a toy environment, three optimizers stepping each update. Its updates are fast against the
norm pass, so the cost budget thins; ``--updates`` (default 150) of them after
``--learning-starts`` environment steps."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--updates", type=int, default=150)
p.add_argument("--learning-starts", type=int, default=64)
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--gamma", type=float, default=0.99)
p.add_argument("--tau", type=float, default=0.005)
p.add_argument("--seed", type=int, default=1)
args = p.parse_args()
torch.manual_seed(args.seed)
OBS, ACT = 6, 2


def mlp(inp, out, width=32):
    return nn.Sequential(nn.Linear(inp, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, out))


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = mlp(OBS, 2 * ACT)

    def forward(self, obs):
        mean, log_std = self.body(obs).chunk(2, -1)
        std = log_std.clamp(-5, 2).exp()
        raw = mean + std * torch.randn_like(mean)
        action = torch.tanh(raw)
        logp = (-0.5 * ((raw - mean) / std) ** 2 - std.log() - 0.9189).sum(-1) - torch.log(1 - action ** 2 + 1e-6).sum(-1)
        return action, logp


actor, q1, q2 = Actor(), mlp(OBS + ACT, 1), mlp(OBS + ACT, 1)
q1_target, q2_target = mlp(OBS + ACT, 1), mlp(OBS + ACT, 1)
q1_target.load_state_dict(q1.state_dict())
q2_target.load_state_dict(q2.state_dict())
q_opt = torch.optim.Adam(list(q1.parameters()) + list(q2.parameters()), lr=1e-3)
actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
log_alpha = torch.zeros(1, requires_grad=True)
alpha_opt = torch.optim.Adam([log_alpha], lr=1e-3)
target_entropy = -float(ACT)

size = args.learning_starts + args.updates
buf_obs, buf_act = torch.zeros(size, OBS), torch.zeros(size, ACT)
buf_rew, buf_next = torch.zeros(size), torch.zeros(size, OBS)
obs = torch.randn(OBS)
for t in range(size):  # the toy environment: a noisy linear system, rewarded near the origin
    with torch.no_grad():
        action = actor(obs.unsqueeze(0))[0][0] if t >= args.learning_starts else torch.rand(ACT) * 2 - 1
    nxt = 0.9 * obs + 0.1 * torch.cat([action, action, action]) + 0.05 * torch.randn(OBS)
    buf_obs[t], buf_act[t], buf_rew[t], buf_next[t] = obs, action, -nxt.pow(2).sum(), nxt
    obs = nxt
    if t < args.learning_starts:
        continue
    idx = torch.randint(0, t + 1, (args.batch_size,))
    o, a, r, n = buf_obs[idx], buf_act[idx], buf_rew[idx], buf_next[idx]
    with torch.no_grad():
        na, nlogp = actor(n)
        alpha = log_alpha.exp()
        target = r + args.gamma * (torch.min(q1_target(torch.cat([n, na], -1)), q2_target(torch.cat([n, na], -1)))
                                   .squeeze(-1) - alpha * nlogp)
    qa = torch.cat([o, a], -1)
    q_loss = F.mse_loss(q1(qa).squeeze(-1), target) + F.mse_loss(q2(qa).squeeze(-1), target)
    q_opt.zero_grad()
    q_loss.backward()
    q_opt.step()
    pa, logp = actor(o)
    pq = torch.min(q1(torch.cat([o, pa], -1)), q2(torch.cat([o, pa], -1))).squeeze(-1)
    actor_loss = (log_alpha.exp().detach() * logp - pq).mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
    alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean()
    alpha_opt.zero_grad()
    alpha_loss.backward()
    alpha_opt.step()
    with torch.no_grad():
        for net, tgt in ((q1, q1_target), (q2, q2_target)):
            for p_, tp in zip(net.parameters(), tgt.parameters()):
                tp.mul_(1 - args.tau).add_(args.tau * p_)
    if (t - args.learning_starts) % 50 == 0:
        print(f"update {t - args.learning_starts} q_loss {q_loss.item():.4f} actor_loss {actor_loss.item():.4f}",
              flush=True)
print("done", flush=True)
