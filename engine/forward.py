"""The model's forward pre-hook: when a step's compute starts, its batch size, and the save
point at its start.

It is on for the steps the doctor watches and whenever a checkpoint or a stop is due
(the step's end decides, stepend.py), on the first model discovery knows; off, the lean
steps fetch their batches through torch's own DataLoader ``__next__`` (loaders.py).
"""

from __future__ import annotations

import time

import torch

from .invisible import own

_perf_counter = time.perf_counter


class ForwardHook:
    """The forward pre-hook on the first model: it writes the step's ``t_forward`` and
    ``samples`` into the shared per-step ``state`` (stepstate.py), marks the training
    loader in ``loaders``, and serves the ``controls``' save point at a step's start."""

    def __init__(self, state, loaders, discovery, controls) -> None:
        self._state, self._loaders, self._discovery, self._controls = state, loaders, discovery, controls
        self.on = True
        """Whether the hook is wanted (it is installed once a model is known)."""
        self.fn = own(self._on_forward)
        """The hook as registered (module pickling leaves it out by identity, invisible.py)."""
        self._handle = None

    def set(self, on: bool) -> None:
        """Want the hook (install it, once a model is known) or not (remove it)."""
        self.on = on
        self._loaders.watch_batches(on)  # the hook reads which loader served the batch
        models = self._discovery.models
        if on and self._handle is None and models:
            # First of its hooks: a save point at the step's start sees the model as the step
            # left it, before FSDP2's pre-forward hook gathers the shards into whole parameters.
            self._handle = models[0].register_forward_pre_hook(self.fn, prepend=True)
        elif not on and self._handle is not None:
            self._handle.remove()
            self._handle = None

    def models_changed(self, models: list[torch.nn.Module]) -> None:
        """The models changed: the hook goes on the new first one."""
        on = self.on
        self.set(False)
        self.set(on)

    def remove(self) -> None:
        """Take the hook off the model (detach); ``on`` is kept for the next ``set(on)``."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _on_forward(self, module, args) -> None:
        state = self._state
        if state.in_step or not torch.is_grad_enabled():
            return  # a closure's forward, or an evaluation pass
        t_in = _perf_counter()
        if state.t_forward is None:
            state.began()
            state.t_forward = t_in
            self._loaders.mark_training()
        if args and isinstance(args[0], torch.Tensor):
            shape = args[0].shape
            if shape:
                state.samples += shape[0]
        state.own += _perf_counter() - t_in
        controls = self._controls
        if controls.has_work(state.step):
            controls.at_save_point(state.step)
