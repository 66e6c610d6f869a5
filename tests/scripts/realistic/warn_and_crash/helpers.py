"""Utilities of the kind every repo grows a utils.py for: an optimizer factory with a
deprecated keyword, and a sanity check the model calls on its activations."""
import warnings

import torch


def build_optimizer(params, lr, momentum=0.0, nesterov_momentum=None):
    """SGD; `nesterov_momentum` is the old spelling of `momentum=..., nesterov=True`."""
    if nesterov_momentum is not None:
        warnings.warn("build_optimizer(nesterov_momentum=...) is deprecated; "
                      "pass momentum=... and nesterov=True", UserWarning, stacklevel=2)
        return torch.optim.SGD(params, lr=lr, momentum=nesterov_momentum, nesterov=True)
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def check_activations(h, step, crash_at):
    """Called from the model's forward; fails at `crash_at`, as a real check would on bad data."""
    if step == crash_at:
        _report_bad_batch(h, step)
    return h


def _report_bad_batch(h, step):
    raise RuntimeError(f"activation check failed at step {step}: mean {h.mean().item():.4f}")
