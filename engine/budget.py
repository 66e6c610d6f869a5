"""ptdash's cost budget: what its own work costs each step, and how sparsely it samples to
stay within ``--overhead-budget`` (a percentage of the step time, default 1%).

**What is measured.** The hooks time their own code on the training thread with
``perf_counter`` (never the torch call they wrap, never a pause, a checkpoint or a
command's work): each main step's ``own`` time, and within it the ``extra`` time of a
sampled step (the per-layer norm pass, the pre-update finite check of the gradients, the
update-ratio copies and the doctor's checks). Each StepRecord carries both; the flusher
hands the records to ``observe`` and asks ``decide`` once a flush. The first step of the
process is left out: its own time is ptdash's start-up (finding the optimizer, the model,
the loaders), tens of milliseconds that a short run's figure would otherwise show as cost.
The flusher's and the server's CPU time (their thread clocks) are measured by ``reading``
once a second.

**The decision.** Over the last STEP_WINDOW main steps (medians, so a preempted step
does not count), a step costs ptdash ``fixed + extra / k`` when one step in ``k`` is
sampled. ``k`` is the smallest power of two that keeps this within the budget's share of
the median step; it is lowered again only when a smaller ``k`` would stay under
LOOSEN of the budget, so it does not flap. Nothing is thinned before LEARN_STEPS steps
of this process have been seen.

**The thinning order** (what a larger ``k`` takes away, first to last):

1. per-layer gradient norms, and with them the total norm and the pre-update finite
   check of the gradients, on one step in ``k`` (unless the script's own clip computes
   them anyway: then they are kept every step, at no cost). Every optimizer follows the
   main one's period, and so do the inferred steps of a script without one (manual.py);
2. update ratios: at the first sampled step at or after each ``--update-ratio-every``;
3. the doctor's training-thread checks and the step-time split (forward timing, data
   waits): one step in ``16 k`` instead of one in 16;
4. the flush: once a second instead of four times (flusher.THINNED_INTERVAL_S), while
   ``k`` is above 1.

**Always kept**, every step: the step count and step time, the loss (a reference, and on
CPU its pre-update finite check), the LRs, ``ptdash.log`` values, the total norm and
per-layer norms when the script's clip (or a ``--clip``/live clip) computes them, and the
commands at the step boundary (a command that comes in during a lean step that runs without
the pre-step hook, prestep.py, is applied at the next step's boundary: a step later at most;
its answer names the step). ``k`` is at most K_MAX.

**The floor.** However short the steps, a sampled step (with it the total gradient norm)
comes at least every FLOOR_S seconds and every ``step / FLOOR_PARTS`` steps (``floor_every``),
so no run loses its norm for a long stretch of its length: a 150-step run whose steps
cost a fraction of the norm pass is sampled every 16-32 steps after its first 64, not once
in 256 (never, in a run that short). It costs the budget early in a long run, for a few
hundred steps, until the period it would choose is allowed.

**What was kept** is counted (``observe``; the flusher's ``kept``) and read with the cost:
the main steps, those with a total norm, those whose per-layer norms and update ratios the
store kept (``ptdash/kept_*``), so the summaries say "per-layer norms at 98 of 768 steps".
"""

from __future__ import annotations

import collections
import statistics
import threading
import time

from .shared import names

K_MAX = 256
"""The sparsest sampling: one step in this many."""
LEARN_STEPS = 64
"""Main steps of this process seen before anything is thinned (the doctor watches all of them)."""
STEP_WINDOW = 64
"""Recent main steps whose medians decide (step time, fixed cost)."""
SAMPLED_WINDOW = 16
"""Recent sampled steps whose median extra cost decides."""
LOOSEN = 0.8
"""Sampling is made denser only when the denser rate costs under this share of the budget."""
FLOOR_S = 5.0
"""A sampled step (the total gradient norm with it) at least this often, in seconds of steps."""
FLOOR_PARTS = 4
"""A sampled step at least every ``step / FLOOR_PARTS`` steps: never a gap of a quarter of the run so far."""


def cost(fixed_s: float, extra_s: float, every: int) -> float:
    """ptdash's mean cost per step when one step in ``every`` is sampled."""
    return fixed_s + extra_s / every


def choose_every(step_s: float, fixed_s: float, extra_s: float, share: float, current: int) -> int:
    """The sampling period (a power of two, 1..K_MAX) for a step of ``step_s`` seconds that
    costs ptdash ``fixed_s`` every step and ``extra_s`` more when sampled, at a budget of
    ``share`` (0.01 for 1%), sampling one step in ``current`` now.

    Sparser as soon as the current period is over the budget; denser only when the denser
    period stays under LOOSEN of it.
    """
    allowed = share * step_s

    def smallest(limit: float) -> int:
        k = 1
        while k < K_MAX and cost(fixed_s, extra_s, k) > limit:
            k *= 2
        return k

    tight = smallest(allowed)
    if tight > current:
        return tight
    loose = smallest(LOOSEN * allowed)
    return loose if loose < current else current


def floor_every(step: int, step_s: float) -> int:
    """The sparsest period the floor allows at ``step`` for steps of ``step_s`` seconds: the
    largest power of two (1..K_MAX) within ``step / FLOOR_PARTS`` steps and FLOOR_S seconds."""
    limit = min(K_MAX, step / FLOOR_PARTS, FLOOR_S / step_s if step_s > 0 else K_MAX)
    k = 1
    while k * 2 <= limit:
        k *= 2
    return k


class Budget:
    """The running measure and the sampling period the hot path reads (``every``)."""

    def __init__(self, percent: float = 1.0) -> None:
        self.percent = float(percent)
        self.share = self.percent / 100.0
        self.every = 1
        """Per-layer statistics on one main step in ``every`` (read by the hooks each step)."""
        self._steps: collections.deque[tuple[float, float]] = collections.deque(maxlen=STEP_WINDOW)
        """(step time, fixed cost) of recent main steps."""
        self._extra: collections.deque[float] = collections.deque(maxlen=SAMPLED_WINDOW)
        self._seen = 0
        self._first_skipped = False
        self._last_step = 0
        self._own = self._time = 0.0
        """ptdash's training-thread time and the steps' time since the last reading."""
        self._counted = 0
        self._clocks: dict[int, tuple[int, float]] = {}
        """Engine thread ident -> (its CPU clock id, its CPU seconds at the last reading)."""
        self._read_at = time.monotonic()
        self.last: dict[str, float | None] = {}
        """The latest reading (see ``reading``)."""
        self.on_change: list = []
        """Called (flusher thread, no arguments) after ``every`` changed."""
        self.kept_steps = self.kept_norm = self.kept_layers = self.kept_ratios = 0
        """Main steps recorded; of them, with a total norm; with per-layer norms and update
        ratios the store kept (``kept``)."""

    @property
    def doctor_every(self) -> int:
        """The doctor's watched steps (after the first 64): one in this many."""
        return 16 * self.every

    def observe(self, records: list) -> None:
        """The main steps of a flush (flusher thread): their time and ptdash's cost."""
        for r in records:
            if r.opt or r.times is None:
                continue
            self.kept_steps += 1
            self.kept_norm += r.total is not None
            if not self._first_skipped:
                # The process's first step: its own time is ptdash's start-up (finding the
                # optimizer, the model, the loaders; tens of milliseconds), not a step's cost.
                self._first_skipped = True
                continue
            step_s = r.times[3] - r.times[0]
            own, extra = r.own, r.extra
            self._steps.append((step_s, max(0.0, own - extra)))
            if r.layers is not None and extra > 0:
                self._extra.append(extra)
            self._own += own
            self._time += step_s
            self._counted += 1
            self._seen += 1
            self._last_step = r.step

    def decide(self) -> str | None:
        """Re-evaluate the period; a sentence saying what changed, or None."""
        if self._seen < LEARN_STEPS or not self._steps or not self._extra:
            return None
        step_s = statistics.median(s for s, _ in self._steps)
        fixed = statistics.median(f for _, f in self._steps)
        extra = statistics.median(self._extra)
        if step_s <= 0:
            return None
        chosen = choose_every(step_s, fixed, extra, self.share, self.every)
        every = min(chosen, floor_every(self._last_step, step_s))
        if every == self.every:
            return None
        before, self.every = self.every, every
        for listener in self.on_change:
            listener()
        rate = "every step" if every == 1 else f"one step in {every}"
        floor = (f"; what is kept every step costs {fixed * 1e6:.0f} us alone, above the budget"
                 if fixed > self.share * step_s else "")
        return (f"sampling: per-layer gradient norms {rate} from step {self._last_step + 1}, doctor checks one "
                f"step in {self.doctor_every} (was one in {before}): ptdash's own time "
                f"{cost(fixed, extra, before) * 1e6:.0f} us of a {step_s * 1e3:.3g} ms step at the old rate, "
                f"{cost(fixed, extra, every) * 1e6:.0f} us at the new; budget {self.percent:g}%{floor}"
                + (f"; the budget alone would sample one step in {chosen}, the floor keeps a sampled step at "
                   f"least every {FLOOR_S:g} s and every quarter of the steps so far" if chosen > every else ""))

    def kept(self, layers: int, ratios: int) -> None:
        """The flusher stored per-layer records of ``layers`` steps, ``ratios`` of them with update ratios."""
        self.kept_layers += layers
        self.kept_ratios += ratios

    def reading(self) -> dict[str, float | None]:
        """ptdash's cost since the previous reading, as samples (flusher thread, once a second).

        ``ptdash/step_pct``: its training-thread time as a percentage of the steps' time
        (None without a step); ``ptdash/threads_pct``: its threads' CPU (the flusher, the
        server) as a percentage of one core; ``ptdash/layers_every`` and
        ``ptdash/doctor_every``: the sampling periods in force.
        """
        now = time.monotonic()
        elapsed, self._read_at = now - self._read_at, now
        cpu = 0.0
        for thread in threading.enumerate():
            if not thread.name.startswith("ptdash-") or thread.ident is None:
                continue
            clock, before = self._clocks.get(thread.ident, (None, None))
            try:
                if clock is None:
                    clock = time.pthread_getcpuclockid(thread.ident)
                used = time.clock_gettime(clock)
            except (OSError, AttributeError):  # a thread that just ended; a platform without thread clocks
                continue
            if before is not None:
                cpu += used - before
            self._clocks[thread.ident] = (clock, used)
        step_pct = 100.0 * self._own / self._time if self._counted and self._time > 0 else None
        self._own = self._time = 0.0
        self._counted = 0
        self.last = {names.STEP_PCT: step_pct,
                     names.THREADS_PCT: 100.0 * cpu / elapsed if elapsed > 0 else None,
                     names.LAYERS_EVERY: float(self.every), names.DOCTOR_EVERY: float(self.doctor_every),
                     names.BUDGET_PCT: self.percent, names.KEPT_STEPS: float(self.kept_steps),
                     names.KEPT_NORM: float(self.kept_norm), names.KEPT_LAYERS: float(self.kept_layers),
                     names.KEPT_RATIOS: float(self.kept_ratios)}
        return self.last
