"""A torch.profiler window over a few optimizer steps: a Chrome trace plus a top-ops table.

The engine opens a window at a step boundary (post-step hook of step A-1), counts the
steps it covers with ``on_step()``, and closes it with ``finish()`` (or ``stop()`` then
``report()``) at the post-step hook of step B. ``start``, ``on_step`` and ``stop`` run on
the training thread: the profiler records the thread that starts it. A failure (a profiler already running, an export error) comes back as an
``"error"`` in the summary, never as an exception into training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from .shared import events, perms

TOP_LIMIT = 20
"""Rows kept in a summary's ``"top"`` table."""


def _first(row: Any, names: tuple[str, ...]) -> float:
    # torch renamed the cuda_* columns to device_* (2.4); read whichever this torch has.
    for name in names:
        value = getattr(row, name, None)
        if value is not None:
            return float(value)
    return 0.0


def summarize(rows: Iterable[Any], device: str, limit: int = TOP_LIMIT) -> list[dict[str, Any]]:
    """The ``limit`` most expensive ops of ``prof.key_averages()``-like rows, as plain dicts.

    Sorted by self device time when ``device == "cuda"``, else by self CPU time. Times are
    milliseconds (the profiler reports microseconds); memory columns are what each op
    allocated itself ("self"), so nested ops are not counted twice.
    """
    table = [
        {
            "name": str(row.key),
            "calls": int(row.count),
            "self_ms": _first(row, ("self_cpu_time_total",)) / 1000.0,
            "total_ms": _first(row, ("cpu_time_total",)) / 1000.0,
            "self_device_ms": _first(row, ("self_device_time_total", "self_cuda_time_total")) / 1000.0,
            "total_device_ms": _first(row, ("device_time_total", "cuda_time_total")) / 1000.0,
            "cpu_mem_bytes": int(_first(row, ("self_cpu_memory_usage",))),
            "device_mem_bytes": int(_first(row, ("self_device_memory_usage", "self_cuda_memory_usage"))),
        }
        for row in rows
    ]
    if device == "cuda":
        table.sort(key=lambda r: (r["self_device_ms"], r["self_ms"]), reverse=True)
    else:
        table.sort(key=lambda r: r["self_ms"], reverse=True)
    return table[:limit]


def _profiler_active(torch: Any) -> bool:
    # The module flag is set by every torch.profiler/autograd profiler, from any thread;
    # the C query only sees the calling thread. Starting a second profiler would silently
    # end the script's own session, so either one counts.
    try:
        return bool(torch.autograd.profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled())
    except Exception:
        return False


class ProfileWindow:
    """Profiles ``steps`` optimizer steps starting at step ``step_index``; see the module docstring."""

    def __init__(self, steps: int, out_dir: Path, step_index: int) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if step_index < 0:
            raise ValueError(f"step_index must be >= 0, got {step_index}")
        self.steps = steps
        self.out_dir = Path(out_dir)
        self.step_index = step_index
        self._done = 0
        self._prof: Any = None
        self._stopped: Any = None
        self._device = "cpu"
        self._error: str | None = None

    def start(self) -> None:
        """Start profiling CPU ops, and CUDA kernels when CUDA is available."""
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile

            if _profiler_active(torch):
                raise RuntimeError("another profiler is already running (the script's own?)")
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
                self._device = "cuda"
            prof = profile(activities=activities, record_shapes=True, profile_memory=True, with_stack=False)
            prof.start()
            self._prof = prof
        except Exception as exc:
            self._error = f"profiler did not start: {type(exc).__name__}: {exc}"

    @property
    def error(self) -> str | None:
        """Why the window failed, None while all is well."""
        return self._error

    @property
    def done(self) -> int:
        """The steps recorded so far."""
        return self._done

    def on_step(self) -> bool:
        """Count one finished optimizer step; True when the window is complete (or failed)."""
        self._done += 1
        return self._done >= self.steps or self._prof is None

    def stop(self) -> None:
        """Stop recording; call on the training thread at the step boundary (~0.2 s here).

        Building the summary is the slow part (about 1 s for five small AdamW steps on
        this 2-core box), so callers that can should ``stop()`` here and ``report()``
        from another thread.
        """
        prof, self._prof = self._prof, None
        if prof is None:
            self._error = self._error or "profiler was not started"
            return
        try:
            prof.stop()
            self._stopped = prof
        except Exception as exc:
            self._error = f"profiler did not stop: {type(exc).__name__}: {exc}"

    def report(self) -> dict[str, Any]:
        """Write ``profile-step{A}-{B}.json`` and return the JSON-ready summary; any thread.

        Keys: ``steps`` ([A, B], inclusive), ``trace`` (path or None), ``device``
        ("cpu"/"cuda"), ``top`` (see ``summarize``), and ``error`` only on failure.
        """
        last = self.step_index + max(self._done, 1) - 1
        summary: dict[str, Any] = {"steps": [self.step_index, last], "trace": None, "device": self._device, "top": []}
        prof, self._stopped = self._stopped, None  # the recorded events can be large: let them go
        if prof is None:
            summary["error"] = self._error or "nothing to report: stop() was not called, or report() was"
            return summary
        try:
            path = self.out_dir / f"profile-step{self.step_index}-{last}.json"
            perms.make_dir(self.out_dir)
            prof.export_chrome_trace(str(path))
            perms.secure(path)
            summary["trace"] = str(path)
            summary["top"] = summarize(prof.key_averages(), self._device)
        except Exception as exc:
            summary["error"] = f"{type(exc).__name__}: {exc}"
        return summary

    def finish(self) -> dict[str, Any]:
        """``stop()`` then ``report()``: the whole close on the calling (training) thread."""
        self.stop()
        return self.report()


class Profiler:
    """The engine's profile windows: on request (the ``p`` key, ``ptdash ctl profile``) or
    over ``--profile-steps``. Rank 0 profiles; other ranks keep their pace.

    ``start`` and ``on_step_end`` run on the training thread at step boundaries; the
    report (about a second to build) is made on a thread of its own.
    """

    def __init__(self, out_dir: Path | None, journal, window: tuple[int, int] | None = None) -> None:
        self._out_dir, self._journal, self._window = out_dir, journal, window
        self._current: ProfileWindow | None = None

    @property
    def wanted(self) -> bool:
        """Whether step ends must call ``on_step_end`` (a window is open or configured)."""
        return self._current is not None or self._window is not None

    def start(self, cmd, step: int, steps: int | None = None) -> None:
        """Profile the ``steps`` (default: the command's value) steps after ``step``."""
        steps = int(steps if steps is not None else cmd.value)
        if self._out_dir is None:
            return
        if self._current is not None:
            if cmd is not None:
                self._journal.ack(cmd, False, step, "a profile is already being recorded")
            return
        window = ProfileWindow(steps, self._out_dir, step + 1)
        window.start()
        if window.error:
            if cmd is not None:
                self._journal.ack(cmd, False, step, window.error)
            return
        self._current = window
        if cmd is not None:
            self._journal.ack(cmd, True, step, f"profiling steps {step + 1}-{step + steps}")

    def on_step_end(self, step: int) -> None:
        window = self._current
        if window is not None and window.on_step():
            self._current = None
            window.stop()
            import threading

            threading.Thread(target=self._report, args=(window,), name="ptdash-profile", daemon=True).start()
        if self._window and step + 1 == self._window[0]:
            (first, last), self._window = self._window, None
            self.start(None, step, last - first + 1)

    def close(self, step: int) -> None:
        """The run ends at ``step`` (training thread): a window still open is closed and reported
        now, over the steps it recorded (a profiler left running at the interpreter's exit
        killed the process with SIGSEGV, and the profile answered for was never written)."""
        window, self._current, self._window = self._current, None, None
        if window is None:
            return
        window.stop()
        wanted = f"{window.step_index}-{window.step_index + window.steps - 1}"
        if not window.done:
            window.report()  # lets the recorded events go
            self._journal.event("warning", f"profile of steps {wanted} not written: the run ended at step {step}, "
                                "before its first step")
            return
        self._report(window, f" (of {wanted}: the run ended at step {step})")

    def _report(self, window: ProfileWindow, note: str = "") -> None:
        report = window.report()
        a, b = report.get("steps", ["?", "?"])
        if report.get("error"):
            self._journal.event(events.Profile.from_data(report), f"profile of steps {a}-{b} failed: {report['error']}")
            return
        top = report["top"][0]["name"] if report.get("top") else "nothing"
        self._journal.event(events.Profile.from_data(report),
                            f"profiled steps {a}-{b}{note}: top op {top}; trace {report['trace']}")
