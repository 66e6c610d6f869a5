"""The doctor's catalogue: every rule's severity, why it matters and the fix, in one place.

A finding's event carries these (``severity``, ``why``, ``fix``), so the dashboard and
``ptdash doctor`` show the catalogue's words without a copy of it.
"""

from __future__ import annotations

from typing import NamedTuple


class Rule(NamedTuple):
    """One entry of the doctor's catalogue."""

    severity: str
    """``error`` (the run is wrong), ``warning`` (slow or fragile) or ``info`` (worth a look)."""
    why: str
    """Why the finding matters."""
    fix: str
    """What to do about it."""


RULES: dict[str, Rule] = {
    "grads-never-cleared": Rule("error",
        "backward() adds to .grad instead of replacing it, so each update uses the sum of all gradients "
        "since the start: the steps grow every iteration and training diverges or stalls",
        "call optimizer.zero_grad() once per optimizer step, before backward() or right after step(); for "
        "gradient accumulation, zero once every N micro-batches, right after step()"),
    "zero-grad-before-step": Rule("error",
        "the gradients of this step are thrown away before the update, so the optimizer changes nothing (or "
        "only applies weight decay and momentum) and the model does not learn",
        "clear gradients before backward(), never between backward() and step(): zero_grad() -> forward -> "
        "backward() -> step() (or backward() -> step() -> zero_grad())"),
    "train-in-eval-mode": Rule("error",
        "in eval mode Dropout does nothing and BatchNorm normalises with its running statistics instead of "
        "the batch's and stops updating them: training loses its regularisation and BatchNorm never adapts",
        "call model.train() before the training loop and again after every evaluation (model.eval() and "
        "torch.no_grad() to evaluate, then model.train())"),
    "never-learns": Rule("error",
        "they take no part in computing the loss (a layer defined but never called, a branch never taken, an "
        "output that is .detach()ed), so they never change; under DistributedDataParallel they raise "
        "'Expected to have finished reduction in the prior iteration' unless find_unused_parameters=True",
        "remove the unused layers or use them in forward(); if they are used only on some steps under DDP, "
        "pass find_unused_parameters=True"),
    "never-learns/frozen": Rule("info",
        "frozen parameters never get a gradient, so the optimizer never updates them: if they were meant to "
        "train, they stay at their initial values; if they were meant to be frozen, the optimizer holds "
        "them for nothing",
        "to train them, set requires_grad=True before training; to freeze them, build the optimizer from "
        "[p for p in model.parameters() if p.requires_grad] (ignore this if you unfreeze them later on purpose)"),
    "inplace-autograd": Rule("error",
        "autograd keeps some forward tensors to compute gradients; an in-place op (x += y, x.relu_(), "
        "x[i] = v, x.mul_(), an inplace=True activation) overwrote one of them before backward() used it",
        "use the out-of-place form on that tensor (x = x + y, F.relu(x), inplace=False) or .clone() it before "
        "modifying it"),
    "host-syncs": Rule("warning",
        "each sync makes the CPU wait until the GPU has finished all queued work, so the CPU cannot queue the "
        "next kernels ahead and the GPU idles between steps",
        "keep values on the GPU and call .item()/.cpu() only on logging steps; do not print tensors or branch "
        "on their values every step; copy batches with pin_memory=True and .to(device, non_blocking=True)"),
    "sampler-no-set-epoch": Rule("warning",
        "the sampler seeds its shuffle with seed + epoch, so without set_epoch() every epoch visits the data "
        "in exactly the same order on every rank",
        "call sampler.set_epoch(epoch) at the start of each epoch, before iterating the DataLoader"),
    "dataparallel": Rule("warning",
        "DataParallel is one process with a thread per GPU: it copies the model to every GPU on each forward, "
        "gathers outputs and gradients on GPU 0 (which runs out of memory first) and is bound by the GIL; "
        "DistributedDataParallel is faster even on one machine",
        "use DistributedDataParallel, one process per GPU: init_process_group, DDP(model, "
        "device_ids=[local_rank]), a DistributedSampler, and launch with torchrun --nproc-per-node N train.py"),
    "input-bound": Rule("warning",
        "the training loop itself loads and collates every batch while the model waits",
        "; if that is not enough, make __getitem__ cheaper (decode or preprocess once, cache)"),
    "lr-zero": Rule("error",
        "with a learning rate of 0 the update is zero, so those parameters do not learn; usually a scheduler "
        "whose factor is 0 (a warmup that never rises, a decay that already ended) or lr=0 in a param group",
        "check optimizer.param_groups[i]['lr'] after building the scheduler, and the scheduler's lambda or "
        "warmup length"),
    "no-step": Rule("warning",
        "ptdash counts a step at each optimizer step, or infers one where a script that updates its parameters "
        "itself clears their gradients between backward() calls; with neither, pause, stop, checkpoints, the "
        "clip override and the charts have no step to work at",
        "if the script updates its parameters itself, clear the gradients once per step (model.zero_grad() or "
        "p.grad = None after the update); or use a torch.optim optimizer"),
    "loss-plateau": Rule("info",
        "the model has stopped learning: the learning rate may be too low (or so high that it oscillates) or "
        "decayed to ~0, the model may be too small, or the labels may not match the inputs",
        "try other learning rates (the dashboard's LR factor key 'l' changes it live), check the schedule and "
        "that labels match inputs; if it has converged, stop early and save the compute"),
    "stalled": Rule("error",
        "no rank made a step for the stall timeout: the ranks that wait (in a collective, in backward's "
        "gradient all-reduce, at ptdash's step boundary) wait for the one that is elsewhere; a rank that skips "
        "a collective the others make, or waits for data or a lock, hangs the whole job",
        "look at the named line of the rank the others wait for (`ptdash stacks RUN` shows every rank's "
        "stacks now); make every rank call the same collectives in the same order (no collective inside "
        "`if rank == 0:`), and give DataLoader workers and locks a timeout"),
}
"""Rule id (or ``id/case``) -> its severity, why it matters and the fix: the doctor's one catalogue."""
