"""SchedulePreview: what the flusher sends about the schedule ahead, from a real loop's records.

A small real loop (model, optimizer, scheduler) makes the step rows the hooks would (the
LR each step used, times the live LR factor), and the preview observes them flush by
flush. ``wait()`` lets the preview's thread finish before the next flush, so nothing here
depends on timing.
"""

from __future__ import annotations

import pytest
import torch
from torch.optim import lr_scheduler as L

from ptdash.preview import BY_HAND, SchedulePreview, decimate


class Discovery:
    def __init__(self):
        self.schedulers = []

    def top_schedulers(self):
        return self.schedulers


LOOPS: list = []
"""Every Loop a test made: its preview's thread is stopped after the test (``closed``)."""


@pytest.fixture(autouse=True)
def closed():
    yield
    while LOOPS:
        LOOPS.pop().preview.close()


class Loop:
    """A training loop as a script writes it, recording rows as ptdash's hooks do."""

    def __init__(self, make=None, sched_every: int = 1, total: int | None = None, scale: float = 1.0,
                 groups: int = 2):
        torch.manual_seed(0)
        self.params = [torch.nn.Parameter(torch.ones(2)) for _ in range(groups)]
        self.opt = torch.optim.SGD([{"params": [p], "lr": 0.1 / 10 ** i} for i, p in enumerate(self.params)], lr=0.1)
        self.discovery = Discovery()
        self.sched = make(self.opt) if make else None
        if self.sched is not None:
            self.discovery.schedulers.append(self.sched)
        self.sched_every, self.scale, self.step_no = sched_every, scale, 0
        self.used: dict[int, list[float]] = {}
        self.ends: list[int] = []
        self.preview = SchedulePreview(self.discovery, lambda: self.opt, lambda: self.step_no, lambda: self.scale,
                                       lambda: total, on_end=self.ends.append)
        LOOPS.append(self)
        self.by_hand = None

    def steps(self, n: int) -> list:
        rows = []
        for _ in range(n):
            self.step_no += 1
            if self.by_hand is not None:
                for group in self.opt.param_groups:
                    group["lr"] = self.by_hand(self.step_no)
            lrs = [g["lr"] for g in self.opt.param_groups]
            self.used[self.step_no] = lrs
            self.opt.zero_grad()
            sum(p.pow(2).sum() for p in self.params).backward()
            self.opt.step()
            rows.append([self.step_no, 0.0, {f"opt/lr/group{i}": lr * self.scale for i, lr in enumerate(lrs)}])
            if self.sched is not None and self.step_no % self.sched_every == 0:
                self.sched.step(*([1.0] if isinstance(self.sched, L.ReduceLROnPlateau) else []))
        return rows

    def flushes(self, count: int, per_flush: int, behind: int = 0) -> list:
        """``count`` flushes of ``per_flush`` steps each; every Schedule message sent.

        With ``behind``, the training thread takes that many more steps between the flush's
        drain and its look at the scheduler (their rows come with the next flush).
        """
        sent, late = [], []
        for _ in range(count):
            rows = late + self.steps(per_flush)
            late = self.steps(behind)
            sent += self.preview.observe(rows)
            assert self.preview.wait()
        return sent

    def future(self, until: int) -> dict[int, list[float]]:
        """Run the loop on to ``until`` and return the LRs every step used."""
        self.steps(until - self.step_no)
        return self.used


def check(msg, used: dict[int, list[float]]) -> int:
    """Every previewed point is exactly the LR the loop then used at that step; how many were checked."""
    checked = 0
    for i, step in enumerate(msg.steps):
        if step in used:
            assert [msg.lrs[g][i] for g in range(len(msg.lrs))] == used[step], step
            checked += 1
    return checked


def test_a_per_step_cosine_is_previewed_to_its_end():
    loop = Loop(lambda o: L.CosineAnnealingLR(o, T_max=400))
    sent = [m for m in loop.flushes(4, 10) if m.steps]
    assert len(sent) == 1
    msg = sent[0]
    assert not msg.note and msg.end == 400 and loop.ends == [400]
    assert msg.steps[0] <= 41 and msg.steps[-1] >= 400 and len(msg.steps) <= 480
    assert check(msg, loop.future(400)) > 300
    assert loop.preview.latest is msg


def test_many_param_groups_keep_their_order():
    loop = Loop(lambda o: L.CosineAnnealingLR(o, T_max=200), groups=12)  # group10 sorts before group2 as text
    sent = loop.flushes(6, 5)
    assert [m.note for m in sent] == [""] and len(sent[0].lrs) == 12
    assert check(sent[0], loop.future(200)) > 100


def test_a_flusher_behind_the_training_thread_is_not_by_hand():
    loop = Loop(lambda o: L.OneCycleLR(o, max_lr=0.1, total_steps=2000))
    sent = loop.flushes(30, 20, behind=4)
    assert [m.note for m in sent] == [""]  # one preview, never a note
    assert check(sent[0], loop.future(2000)) > 300


def test_one_cycle_with_an_lr_factor():
    loop = Loop(lambda o: L.OneCycleLR(o, max_lr=[0.1, 0.01], total_steps=300), scale=0.5)
    msg = next(m for m in loop.flushes(3, 7) if m.steps)
    assert msg.end == 300
    assert check(msg, loop.future(300)) > 250  # the scheduled LRs, before the factor


def test_a_known_run_end_sets_the_horizon():
    loop = Loop(lambda o: L.StepLR(o, step_size=50, gamma=0.5), total=1000)
    msg = next(m for m in loop.flushes(3, 10) if m.steps)
    assert msg.end is None and msg.steps[-1] >= 1000
    assert check(msg, loop.future(1000)) > 20
    changes = [i for i in range(1, len(msg.steps)) if msg.lrs[0][i] != msg.lrs[0][i - 1]]
    assert all(msg.steps[i] - msg.steps[i - 1] == 1 for i in changes)  # square steps survive decimation


def test_an_epoch_stepped_scheduler_is_placed_on_optimizer_steps():
    loop = Loop(lambda o: L.CosineAnnealingLR(o, T_max=8), sched_every=20)
    sent = [m for m in loop.flushes(10, 5) if m.steps]  # two epochs seen: 20 steps per scheduler step
    msg = sent[-1]
    assert msg.end == pytest.approx(160, abs=5)
    used = loop.future(160)
    assert check(msg, used) >= 8


def test_no_scheduler_and_a_changing_lr_is_by_hand():
    loop = Loop()
    loop.by_hand = lambda step: 0.1 / step
    sent = loop.flushes(3, 5)
    assert [m.note for m in sent] == [BY_HAND]
    assert loop.preview.latest.steps == []


def test_a_constant_lr_without_a_scheduler_says_nothing():
    assert Loop().flushes(3, 5) == []


def test_lr_set_by_hand_over_a_scheduler_is_by_hand():
    loop = Loop(lambda o: L.OneCycleLR(o, max_lr=0.1, total_steps=500))
    loop.by_hand = lambda step: 0.05 * (1 - step / 1000)
    sent = loop.flushes(12, 5)
    assert sent[-1].note == BY_HAND
    assert loop.flushes(3, 5) == []  # said once


def test_a_factor_change_is_not_a_schedule_change():
    loop = Loop(lambda o: L.CosineAnnealingLR(o, T_max=300))
    loop.flushes(4, 5)
    loop.scale = 3.0
    assert all(not m.note for m in loop.flushes(6, 5))


def test_a_schedule_changed_by_the_script_is_simulated_again():
    loop = Loop(lambda o: L.CosineAnnealingLR(o, T_max=300))
    first = [m for m in loop.flushes(4, 5) if m.steps]
    loop.sched.last_epoch = 150  # as a resume into a fresh scheduler would
    again = [m for m in loop.flushes(4, 5) if m.steps]
    assert len(first) == 1 and len(again) == 1 and not again[0].note
    assert check(again[0], loop.future(300)) > 100


def test_unsupported_schedulers_are_said_once():
    loop = Loop(lambda o: L.ReduceLROnPlateau(o))
    sent = loop.flushes(3, 5)
    assert len(sent) == 1 and "ReduceLROnPlateau" in sent[0].note and sent[0].steps == []


def test_decimate_keeps_corners_or_spreads_evenly():
    stairs = [[1.0]] * 300 + [[0.5]] * 300 + [[0.25]] * 300
    assert decimate(stairs, 20) == [0, 299, 300, 599, 600, 899]
    smooth = [[float(i)] for i in range(1000)]
    keep = decimate(smooth, 50)
    assert keep[0] == 0 and keep[-1] == 999 and len(keep) == 50
