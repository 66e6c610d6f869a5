"""The per-step state the parts of the step boundary share: one object, handed to each.

The parts (hooks.py builds them) are the optimizer pre-step hook (prestep.py), the end of a
step and its record (stepend.py), the inferred steps of a script with no optimizer
(manual.py), the wrapped torch functions (wrappers.py) and the model's forward hook
(hooks.py). What only one of them uses it keeps itself; what several read or write is
here, and each field says who writes it.

Slots, not a dict: a field costs what an instance attribute costs on the hot path (one
load each, read into a local once per call), and a misspelt field raises instead of
creating a new one.
"""

from __future__ import annotations

import time

from .tracked import ClipNotes

_perf_counter = time.perf_counter


class StepState:
    """What the step boundary's parts share about the step under way and the next one."""

    __slots__ = {
        "step": "Completed steps of the main optimizer (or inferred steps, with no optimizer): "
                "written at a main step's end (stepend.py); the engine sets the first one (a "
                "resumed run starts at N).",
        "losses": "This step's losses: detached references kept at each backward (wrappers.py), "
                  "or on the lean path a CPU loss read there already, as a float; taken by the "
                  "step's record (stepend.py).",
        "ended_losses": "The losses of the step that ended last (stepend.py), for its end's "
                        "readers (rollback.py, warming its spike limit up).",
        "unscaled": "id(scaled loss) -> (a weak reference to it, the loss before scaling): "
                    "GradScaler-scaled losses waiting for their backward (wrappers.py).",
        "clip_notes": "The script's clip calls of this step (wrappers.py), taken by the "
                      "optimizer whose parameters they clipped (prestep.py).",
        "in_step": "Inside the main step, from its pre-step hook to its end: a forward then is "
                   "a closure's (hooks.py), a zero_grad is the step's own (wrappers.py).",
        "at_boundary": "Whether this step's commands have been applied (at the main "
                       "optimizer's clip or step, prestep.py); reset at its end.",
        "t_post": "When the step began: the previous step's end, or the first activity of "
                  "step 1 (``began``).",
        "t_forward": "The step's first training forward (hooks.py), or None.",
        "t_pre": "When the main optimizer's step began (prestep.py), or None.",
        "inner": "Time inside the step's closure (its forward and backward, wrappers.py).",
        "samples": "The batch sizes the model's forward saw this step (hooks.py).",
        "own": "ptdash's own time on the training thread since the last main record "
               "(budget.py); every part adds its own, the record takes it.",
        "extra": "The part of ``own`` spent sampling this step (norms, checks, ratios, doctor).",
        "ratio_owed": "An update ratio fell due on a step that was not sampled: the next "
                      "sampled one takes it (prestep.py).",
        "before": "The parameters' snapshot before this step's update, when its update "
                  "ratios are taken (prestep.py; the step's end compares), or None.",
        "before_params": "The parameters ``before`` is of.",
        "lean": "id(optimizer) -> its Tracked, for the optimizers whose next step may take "
                "the lean path: decided at each main step's end (stepend.py) for the steps "
                "until the next; emptied whenever something may have changed the decision.",
        "in_lean": "The Tracked of the optimizer whose step under way took the lean path.",
        "pre_off": "Whether the pre-step hook is off (prestep.py, ``PreStep.take_off``).",
        "skipping": "Since the pre-step hook went off: the optimizers whose steps are lean "
                    "without it, until the next main step's end; None once a pre-step hook ran.",
        "ends_wanted": "Whether a lean step's end calls the engine's ``step_end`` (the full "
                       "path always does): the engine says after each call whether it has "
                       "work at the next ones.",
        "last_step_s": "Recent step duration (a moving average), for spacing the rank exchanges.",
        "loss_max": "The rollback's spike limit of a CPU loss (rollback.py, from the flusher; inf "
                    "without one): a loss above it sends its step down the full path (wrappers.py), "
                    "where it is judged before the update (prestep.py).",
        "out_dirty": "Whether the script printed (outmarks.py's wrapper) or the output relay read "
                     "something since the last step boundary: the boundary then marks the output.",
        "out_mark": "Marks the script's output at the boundary where a step begins (outmarks.py, "
                    "``Marks.boundary``), before the counter moves; called only when ``out_dirty``.",
        "update_ratio_every": "Update ratios are taken every this many steps (0: never); the "
                              "engine sets it from the run's config.",
    }

    def __init__(self) -> None:
        self.step = 0
        self.losses: list = []
        self.ended_losses: list = []
        self.unscaled: dict = {}
        self.clip_notes = ClipNotes()
        self.in_step = self.at_boundary = False
        self.t_post = self.t_forward = self.t_pre = None
        self.inner = 0.0
        self.samples = 0
        self.own = self.extra = 0.0
        self.ratio_owed = False
        self.before = self.before_params = None
        self.lean: dict = {}
        self.in_lean = None
        self.pre_off = False
        self.skipping = None
        self.ends_wanted = True
        self.last_step_s = 0.0
        self.update_ratio_every = 100
        self.loss_max = float("inf")
        self.out_dirty = False
        self.out_mark = _no_mark

    def began(self) -> None:
        """A batch, a forward or a backward: step 1 starts at the first of them."""
        if self.t_post is None:
            self.t_post = _perf_counter()

    def unmetered(self, fn, *args) -> None:
        """Call ``fn`` (which may pause) without counting its time as ptdash's own."""
        t0 = _perf_counter()
        fn(*args)
        self.own -= _perf_counter() - t0


def _no_mark(step: int) -> None:
    """``out_mark`` while the output is not marked."""
