"""The flusher thread: moves step records to the host a few times a second, judges them,
and hands them to the store and the dashboards (or, on ranks other than 0, to rank 0).

Each flush drains the recorder (one batched copy per device), lets the doctor and the
anomaly checks look at the host values, names the per-parameter record, writes one
store transaction and publishes the live messages. System readings (host, allocator,
NVML) are sampled by time, once a second, whatever the step time, and stored by time. The training thread
never waits for any of it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .discovery import Discovery, param_names
from .printed import merge
from .recorder import Recorder, _to_host
from .sharded import is_sharded, local
from .shared import events, packed
from .shared.protocol import LayerNames, Layers, Message, Metrics, Samples
from .shared.wire import to_dict

log = logging.getLogger("ptdash.flusher")

INTERVAL_S = 0.25
"""The flush interval of fast steps, unless the cost budget thins or the user set one."""

THINNED_INTERVAL_S = 1.0
"""The flush interval while the cost budget thins the sampling (steps fast against ptdash's
cost). A flush has a fixed cost, whatever the steps it holds (a store transaction, the live
messages, cold caches: about a millisecond of CPU on a 2-core machine, much of it holding
the GIL), so four flushes a second cost the run about 0.3% of its time; one costs a quarter
of that, and the dashboard's charts move once a second, as its step counter does."""

LAYER_RECORD_S = (1.0, 10.0)
"""Per-layer history is stored once a second for the first ten minutes, then every ten
seconds: a 500-parameter model then costs the store about 2 MB an hour, not 70."""


class LayerNaming:
    """Names and shapes of the parameters a per-layer record describes, cached while the
    parameter list keeps its shape; ``names`` is the current LayerNames message."""

    def __init__(self, discovery: Discovery) -> None:
        self._discovery = discovery
        self._key: tuple = ()
        self.names: LayerNames | None = None

    def name(self, params: list, step: int) -> tuple[LayerNames, bool]:
        """The LayerNames for ``params``, and whether it is new (a changed parameter list)."""
        models = self._discovery.models
        key = (len(params), id(params[0]) if params else 0, id(params[-1]) if params else 0,
               tuple(id(m) for m in models))
        if key == self._key and self.names is not None:
            return self.names, False
        self._key = key
        names = param_names(models, params)
        fresh = self.names is None or names != self.names.names
        if fresh:
            self.names = LayerNames(step=step, names=names, shapes=[list(p.shape) for p in params])
        return self.names, fresh


class Flusher:
    """Runs the flush loop on its own thread; ``flush()`` can also be called directly.

    ``publish`` sends to the dashboards (rank 0) and ``store`` writes (rank 0); ``push``
    hands a flush to rank 0 (other ranks); ``printed`` (printed.PrintedMetrics) holds the
    metrics the script printed, written with the rows of their steps; ``ranks`` collects the other ranks (rank 0
    of a multi-rank run); ``schedule`` (preview.SchedulePreview, rank 0) is shown each
    flush's rows and says what to send about the LR schedule ahead. ``interval``: the
    seconds between flushes, or None for INTERVAL_S (THINNED_INTERVAL_S while ``budget``
    thins the sampling).
    """

    def __init__(self, recorder: Recorder, journal, doctor, anomalies, naming: LayerNaming, sampler,
                 publish: Callable[[Message], None], store=None, push: Callable[[dict], None] | None = None,
                 ranks=None, interval: float | None = None, step_seconds: Callable[[], float] = lambda: 0.0,
                 schedule=None, budget=None, printed=None, stepped=None) -> None:
        self._recorder, self._journal, self._doctor, self._anomalies = recorder, journal, doctor, anomalies
        self._naming, self._sampler, self._publish, self._store = naming, sampler, publish, store
        self._push, self._ranks, self._interval, self._step_seconds = push, ranks, interval, step_seconds
        self._schedule, self._budget = schedule, budget
        self._printed = printed
        self._stepped = stepped
        """What gives the ``ptdash.log`` values given a step of their own (UserValues.drain_at)."""
        """The metrics the script printed (printed.PrintedMetrics), stored with the steps' rows."""
        self._earlier: list = []
        """The previous flush's rows: the wall times of the steps a printed value may come late for."""
        self.push_layers = False
        self.floor = 0.0
        """Seconds between flushes at least: a rank in another process than the hub of a large
        job flushes less often, so that the hub keeps up (ranks.push_interval)."""
        """Rank 0 in another process than the hub: its layer records and schedule go with its flushes."""
        self._stop = threading.Event()
        self._soon = threading.Event()
        self._count = threading.Condition()
        self._begun = self._ended = 0
        """Flushes of the loop begun and ended (``flush_now`` waits for one begun after its call)."""
        self._thread: threading.Thread | None = None
        self._failed = False
        self._dropped_said = False
        self._started = self._last_layer_record = time.monotonic()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ptdash-flush", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Flush soon (a pause or a stop should reach the store and the dashboards at once)."""
        self._soon.set()

    def flush_now(self, timeout: float = 5.0) -> bool:
        """Wake the loop and wait until a flush begun after this call has ended (benchmarks
        and tests that must know the records so far are stored); False on a timeout."""
        with self._count:
            target = self._begun + 1
            self._soon.set()
            return self._count.wait_for(lambda: self._ended >= target, timeout)

    def wait_s(self) -> float:
        """How long the loop waits between flushes: slow steps are flushed a few at a time
        (each flush has a fixed cost: a store transaction, a per-layer record, messages),
        fast ones a few times a second, or once a second while the budget thins (unless
        the user set the interval)."""
        interval = self._interval
        if interval is None:
            interval = THINNED_INTERVAL_S if self._budget is not None and self._budget.every > 1 else INTERVAL_S
        return max(self.floor, min(1.0, max(interval, 4 * self._step_seconds())))

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop (after the flush it may be in); the caller flushes what is left."""
        self._stop.set()
        self._soon.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        last_status = last_system = 0.0
        while not self._stop.is_set():
            self._soon.wait(self.wait_s())
            self._soon.clear()
            if self._stop.is_set():
                break
            with self._count:
                self._begun += 1
            try:
                # Once a second; the slack keeps a flush once a second (thinned) from
                # sampling every other one when it wakes a hair early.
                now = time.monotonic()
                sample = now - last_system >= 0.95
                if sample:
                    last_system = now
                self.flush(sample)
                if now - last_status >= 0.95:
                    self._publish(self._journal.status())
                    last_status = now
            except Exception as exc:  # keep flushing; never take training down
                log.exception("flush failed")
                if not self._failed:  # the run's events say it once; engine.log every time
                    self._failed = True
                    first = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                    self._journal.event("warning", f"a flush failed ({first}); later ones are only logged "
                                        "in engine.log")
            with self._count:
                self._ended = self._begun
                self._count.notify_all()

    def sample(self) -> list:
        """One ``[wall, {name: value}]`` reading of the host and the GPUs."""
        values = self._sampler.sample()
        if self._budget is not None:
            values.update(self._budget.reading())
        return [time.time(), {k: v for k, v in values.items() if v is not None}]

    def flush(self, sample: bool = False) -> None:
        """Move everything recorded to the store and the dashboards. With ``sample``, also a
        reading of the host, the GPUs and ptdash's own cost, taken after the drain so that it
        counts the steps just drained (a run's last flush holds its last steps)."""
        rows, layer_rows = self._recorder.drain()
        if self._recorder.dropped is not None and not self._dropped_said:
            self._dropped_said = True
            self._journal.event("warning", f"{self._recorder.dropped}; kept the others' rows (engine.log has each)")
        self._rebudget()
        schedules = self._schedule_ahead(rows)
        self._doctor.on_flush(rows, layer_rows, _to_host)
        self._anomalies.check_rows(rows)
        stored, live = self._layers(layer_rows)
        if self._printed is not None or self._stepped is not None:
            # After the judging (a printed value is the script's, not a step's record), before
            # the journal's drain: a first value's event goes with the value or before it.
            found = self._printed.drain(rows, self._earlier) if self._printed is not None else []
            found += self._stepped() if self._stepped is not None else []
            rows, self._earlier = merge(rows, found, self._earlier), rows or self._earlier
        events = self._journal.drain()
        samples = [self.sample()] if sample else []
        if self._push is not None:
            layers = [to_dict(m) for m in stored + schedules] if self.push_layers else []
            if rows or events or samples or layers:
                payload = {"events": [to_dict(e) for e in events], "samples": samples, "layers": layers}
                packed.put(payload, rows)  # binary numbers, not float text (packed.py)
                self._push(payload)
            for msg in live + schedules:  # rank 0 in another process: to the dashboards through the hub
                self._publish(msg)
            return
        if self._store is not None and (rows or events or stored or samples or schedules or self._store.pending):
            # Never raises: what the store cannot take now it keeps and retries, and says so.
            self._store.write(rows=rows, events=events, layers=stored + schedules, samples=samples)
            for note in self._store.take_notes():
                self._journal.event("store", note)
        if rows:
            self._publish(Metrics(rows=rows))
        if samples:
            self._publish(Samples(rows=samples))
        for msg in live + schedules:
            self._publish(msg)
        if self._ranks is not None:
            self._ranks.collect(rows)

    def _rebudget(self) -> None:
        """Re-evaluate the sampling period from the steps just drained; journal a change."""
        if self._budget is None:
            return
        change = self._budget.decide()
        if change is not None:
            self._doctor.spacing = self._budget.every
            self._journal.event(events.Sampling(every=self._budget.every, doctor_every=self._budget.doctor_every,
                                                budget_pct=self._budget.percent), change)

    def _schedule_ahead(self, rows: list) -> list:
        """What to send about the LR schedule ahead; a failure there must not lose the rows.

        A preview that failed once is off for the rest of the run (logged once, not per flush).
        """
        if self._schedule is None:
            return []
        try:
            return self._schedule.observe(rows)
        except Exception:
            log.exception("schedule preview failed; it is off for the rest of the run")
            self._schedule = None
            return []

    def _layers(self, layer_rows: list) -> tuple[list, list]:
        """The flush's per-layer messages to store and to send: new names, then the newest
        record (sent every flush, stored when due)."""
        if not layer_rows:
            return [], []
        last = layer_rows[-1]
        names, fresh = self._naming.name(last.params, last.step)
        flags, findings = self._anomalies.check_layers(last.step, names.names, last.grad_norms, _held(last.params))
        for row in layer_rows[:-1]:
            if None in row.grad_norms:  # a non-finite step inside the flush: name it
                own, _ = self._naming.name(row.params, row.step)
                findings += self._anomalies.check_layers(row.step, own.names, row.grad_norms)[1]
        for what, message in findings:
            self._journal.event(what, message)
        ratios = next((r.update_ratios for r in reversed(layer_rows) if r.update_ratios is not None), None)
        record = Layers(step=last.step, grad_norms=last.grad_norms, update_ratios=ratios, flags=flags)
        new: list[Layers | LayerNames] = [names] if fresh else []
        due = fresh or self._layer_record_due()
        # Every step with update ratios is stored (one in --update-ratio-every: few, and each is the
        # only record of its ratios); the per-layer norms of the others once a second (LAYER_RECORD_S).
        kept = [Layers(step=r.step, grad_norms=r.grad_norms, update_ratios=r.update_ratios)
                for r in layer_rows[:-1] if r.update_ratios is not None and len(r.grad_norms) == len(names.names)]
        if due or last.update_ratios is not None:
            kept.append(record if last.update_ratios is not None or ratios is None else
                        Layers(step=last.step, grad_norms=last.grad_norms, flags=flags))
        if self._budget is not None:
            self._budget.kept(len(kept), sum(k.update_ratios is not None for k in kept))
        return new + kept, new + [record]

    def _layer_record_due(self) -> bool:
        now = time.monotonic()
        interval = LAYER_RECORD_S[0] if now - self._started < 600 else LAYER_RECORD_S[1]
        if now - self._last_layer_record >= interval:
            self._last_layer_record = now
            return True
        return False


def _held(params: list) -> list[bool] | None:
    """Of shards (FSDP), whether this rank's shard of each parameter holds data; None when
    the parameters are whole (an empty shard's zero norm is no vanishing gradient)."""
    if not params or not is_sharded(params):
        return None
    return [t.numel() > 0 for t in local(params)]
