"""The script's DataLoaders: which one feeds training, how long its batches take, epochs.

Patches on ``DataLoader.__init__`` / ``__iter__`` (once per loader or epoch) remember
where each loader was made and which loader an iterator belongs to. The batch iterator's
``__next__`` notes which loader served the latest batch and, on the steps the hooks time,
how long the batch took and how many samples it held; it is in place only while the hooks
watch the start of steps (``watch_batches``: before step 1, on the doctor's steps, when a
save is due), not on the lean steps. The loader that served the batch
before a training forward (grad enabled, outside an optimizer step) is the training
loader: its waits are the step's "waiting for data", its iterations are the epochs. An
evaluation loader's batches (under ``no_grad``) never make it the training loader.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, NamedTuple

from .doctor.sources import caller
from .invisible import own
from .patching import Patches

_perf_counter = time.perf_counter


class Loaders:
    """What the hooks and the doctor need to know about the script's DataLoaders."""

    def __init__(self) -> None:
        self._sources: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        """Loader -> the user's line that made it."""
        self._info_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        """Batch iterator -> what its loader was when it was made (a ``_Loader``)."""
        self._iterations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        """Loader -> how many times it was iterated (epochs, for the training loader)."""
        self._latest: Any = None
        """The batch iterator that served the latest batch."""
        self._train: _Loader | None = None
        self._epoch: int | None = None
        self.timing = False
        """Whether ``__next__`` times its batches (the hooks turn it on for sampled steps)."""
        self.waits: list[tuple[Any, float, float, int]] = []
        """``(iterator, start, end, samples)`` of the batches fetched while timing."""
        self.began: Any = lambda: None
        """Called at each batch: the first one may be where step 1 begins."""
        self._next: tuple[type, Any, Any] | None = None
        """While attached: the batch iterator class, ptdash's ``__next__`` and torch's."""

    def attach(self, patches: Patches) -> None:
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        loaders = self

        init, iterate, fetch = DataLoader.__init__, DataLoader.__iter__, _BaseDataLoaderIter.__next__

        @own
        def __init__(loader, *args, **kwargs):
            init(loader, *args, **kwargs)
            loaders._sources[loader] = caller()

        @own
        def __iter__(loader):
            it = iterate(loader)
            count = loaders._iterations[loader] = loaders._iterations.get(loader, 0) + 1
            info = _Loader.of(loader, loaders._sources.get(loader), count)
            loaders._info_of[it] = info
            train = loaders._train
            if train is not None and train.ref() is loader:
                loaders._epoch = count
            return it

        @own
        def __next__(it):
            loaders._latest = it
            loaders.began()
            if not loaders.timing:
                return fetch(it)
            t0 = _perf_counter()
            batch = fetch(it)
            loaders.waits.append((it, t0, _perf_counter(), _samples(it, batch)))
            return batch

        for fn, original in ((__init__, init), (__iter__, iterate), (__next__, fetch)):
            fn.__wrapped__ = original
        patches.set(DataLoader, "__init__", __init__)
        patches.set(DataLoader, "__iter__", __iter__)
        patches.set(_BaseDataLoaderIter, "__next__", __next__)
        self._next = (_BaseDataLoaderIter, __next__, fetch)

    def detached(self) -> None:
        """The patches were undone: ``watch_batches`` has nothing to switch."""
        self._next = None

    def watch_batches(self, on: bool) -> None:
        """Fetch batches through ptdash's ``__next__`` (on) or torch's own (off: on the lean
        steps there is nothing to time or note, and a call a batch costs microseconds when
        caches are cold). A loop's iterator looks ``__next__`` up on its class at each batch."""
        if self._next is not None:
            cls, mine, torchs = self._next
            setattr(cls, "__next__", mine if on else torchs)

    # ---------------------------------------------------------- training thread

    def mark_training(self) -> None:
        """A training forward began: the loader of the latest batch is the training loader."""
        info = self._info_of.get(self._latest) if self._latest is not None else None
        if info is not None and info is not self._train:
            # Kept as plain values: a loader made in the `for` statement itself is gone soon.
            self._train, self._epoch = info, info.iteration

    def take_waits(self) -> list[tuple[float, float, int]]:
        """The training loader's batch waits since the last take: ``(start, end, samples)``."""
        waits, self.waits = self.waits, []
        train = self._train
        out = []
        for it, t0, t1, samples in waits:
            info = self._info_of.get(it)
            if train is None or (info is not None and info.ref() is train.ref()):
                out.append((t0, t1, samples))
        return out

    # ------------------------------------------------------------------ reading

    def epoch(self) -> int | None:
        """How many times the training loader has been iterated (the current epoch, from 1)."""
        return self._epoch

    def steps_per_epoch(self) -> int | None:
        """Batches in one epoch of the training loader, when it has a length."""
        return self._train.length if self._train is not None else None

    def describe(self) -> tuple[int, bool, str | None] | None:
        """``(num_workers, pin_memory, source line)`` of the training loader."""
        train = self._train
        return None if train is None else (train.num_workers, train.pin_memory, train.source)


class _Loader(NamedTuple):
    """A DataLoader as it was when one of its iterators was made."""

    ref: weakref.ref
    num_workers: int
    pin_memory: bool
    source: str | None
    length: int | None
    iteration: int

    @classmethod
    def of(cls, loader, source: str | None, iteration: int) -> _Loader:
        try:
            length = len(loader)
        except TypeError:  # an IterableDataset without a length
            length = None
        return cls(weakref.ref(loader), int(loader.num_workers), bool(loader.pin_memory), source, length, iteration)


def _samples(it, batch) -> int:
    """The samples in one batch: the loader's batch size, else the first tensor's length."""
    size = getattr(getattr(it, "_index_sampler", None), "batch_size", None)
    if isinstance(size, int) and size > 0:
        return size
    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 0
