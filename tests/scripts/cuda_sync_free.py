"""A CUDA training loop that never synchronises: any device-to-host sync raises.

AdamW + OneCycleLR + clip_grad_norm_ on a small MLP, data made on the device. Under ptdash
the hooks, per-layer statistics and the flusher must not add a single synchronisation.
"""
import torch

device = "cuda"
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(6)],
                            torch.nn.Linear(256, 1)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = 300
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=steps)
x = torch.randn(512, 256, device=device)
y = torch.randn(512, 1, device=device)
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
for step in range(steps):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
torch.cuda.set_sync_debug_mode(0)
print("SYNC-FREE OK", float(loss))
