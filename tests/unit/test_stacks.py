"""What ranks' stacks say (shared/stacks.py) and how one process takes its own (engine/stacks.py)."""

from __future__ import annotations

import json
import linecache
import os
import sys
import sysconfig
import threading
import types
from pathlib import Path

import ptdash
from ptdash.shared import events
from ptdash.shared.stacks import (
    Frame,
    RankStacks,
    Thread,
    culprits,
    doing,
    fit,
    fold,
    mismatch,
    process_state,
    read,
    render,
    short,
    summary,
    where,
)
from ptdash.stacks import Collectives, StackTaker

SITE = "/venv/lib/python3.11/site-packages/"
MAIN = [Frame(file="/home/u/train.py", line=40, func="<module>", code="main()", own=True),
        Frame(file="/home/u/train.py", line=30, func="main", code="step(model)", own=True)]


def _rank(rank: int, *inner: Frame, step: int = 29, **kw) -> RankStacks:
    threads = (Thread(name="MainThread", training=True, frames=tuple(MAIN + list(inner))),
               Thread(name="ptdash-flush", ptdash=True, frames=(Frame(file="/x/threading.py", line=3, func="wait",
                                                                      lib="threading"),)))
    return RankStacks(rank=rank, pid=100 + rank, step=step, threads=threads, **kw)


BACKWARD = [Frame(file="/home/u/train.py", line=15, func="step", code="loss.backward()", own=True),
            Frame(file=SITE + "torch/_tensor.py", line=623, func="backward", lib="torch"),
            Frame(file=SITE + "torch/autograd/graph.py", line=979, func="_engine_run_backward", lib="torch")]
SPIN = [Frame(file="/home/u/train.py", line=17, func="step", code="wait_for_lost_shard()", own=True),
        Frame(file="/home/u/train.py", line=12, func="wait_for_lost_shard", code="while True:", own=True)]


def test_a_rank_spinning_in_python_is_the_one_the_others_wait_for():
    ranks = [_rank(0, *BACKWARD), _rank(1, *SPIN)]
    assert doing(ranks[0])[0] == "backward" and doing(ranks[1])[0] == "python"
    assert culprits(ranks) == [1]
    assert where(ranks[1]) == "`wait_for_lost_shard` (train.py:12)"
    assert where(ranks[0]) == "`loss.backward()` (train.py:15)"
    assert summary(ranks, 40) == ("rank 1 was in `wait_for_lost_shard` (train.py:12) for 40 s; "
                                  "rank 0 waited in `loss.backward()` (train.py:15)")


def test_the_fold_keeps_the_common_frames_once_and_marks_where_ranks_differ():
    ranks = [_rank(0, *BACKWARD), _rank(1, *SPIN), _rank(2, *BACKWARD)]
    common, groups = fold(ranks)
    assert common == MAIN
    assert [numbers for numbers, _ in groups] == [[0, 2], [1]]
    assert groups[1][1][0].code == "wait_for_lost_shard()"
    text = "\n".join(render(ranks, width=100))
    assert "common to all ranks (2 frames)" in text and "ranks differ here:" in text
    assert text.count("▶") == 2 and "ranks 0, 2, step 29" in text and "rank 1, step 29" in text
    assert "rank 0: other threads" in text and "ptdash-flush (ptdash)" in text


def test_a_skipped_all_reduce_is_named_by_the_counts():
    reduce = Frame(file=SITE + "torch/distributed/distributed_c10d.py", line=3252, func="all_reduce", lib="torch")
    barrier = Frame(file=SITE + "torch/distributed/distributed_c10d.py", line=5356, func="barrier", lib="torch")
    ranks = [_rank(0, Frame(file="/home/u/train.py", line=67, func="step", code="dist.all_reduce(m)", own=True),
                   reduce, collectives={"all_reduce": 20}, last_collective={"all_reduce": 20}),
             _rank(1, Frame(file="/home/u/train.py", line=65, func="step", code="dist.barrier()  # why", own=True),
                   barrier, collectives={"all_reduce": 19, "barrier": 1},
                   last_collective={"all_reduce": 19, "barrier": 20})]
    assert [doing(r) for r in ranks] == [("collective", "in all_reduce"), ("collective", "in barrier")]
    assert culprits(ranks) == []  # both wait: the counts say who skipped
    assert "rank 1 made 1 fewer all_reduce than rank 0 since step 19 (20 made)" in mismatch(ranks)
    assert "rank 1 waited in `dist.barrier()` (train.py:65)" in summary(ranks)


def test_a_rank_that_did_not_answer_is_named_with_its_state():
    ranks = [_rank(0, *BACKWARD), RankStacks(rank=1, pid=7, step=57, answered=False, state="T (stopped)",
                                             wchan="do_signal_stop", note="no answer: its process is stopped")]
    assert doing(ranks[1])[0] == "stopped" and culprits(ranks) == [1]  # rank 0 waits for it
    assert "rank 1: its process is stopped (SIGSTOP or a debugger) (last reported step 57)" in summary(ranks)
    lines = render(ranks)
    assert any("rank 1 (pid 7, last reported step 57): no answer" in line and "do_signal_stop" in line for line in lines)
    assert "rank 0, step 29: in backward (DDP's gradient all-reduce waits there); training thread:" in lines
    assert not any("common to" in line for line in lines)  # one rank answered: nothing is common to several


def test_stacks_travel_in_a_stall_event_and_read_back():
    ranks = (_rank(0, *BACKWARD), _rank(1, *SPIN, collectives={"all_reduce": 3}))
    stall = events.Stall(step=29, ranks=(1,), where="x", stacks=ranks)
    back = events.Stall.from_data(stall.to_data())
    assert back == stall and back.stacks[1].training.frames[-1].func == "wait_for_lost_shard"
    assert read([r.to_data() for r in reversed(ranks)]) == list(ranks)


def test_short_paths():
    assert short(SITE + "torch/_tensor.py") == "torch/_tensor.py"
    assert short("/usr/lib/python3.11/threading.py") == "threading.py"
    assert short("/home/u/proj/train.py") == "train.py"


def test_this_process_takes_its_stacks_from_another_thread_training_thread_first():
    started, release = threading.Event(), threading.Event()

    def blocked_in_c():
        started.set()
        release.wait(30)  # a lock wait: C, the GIL released

    worker = threading.Thread(target=blocked_in_c, name="trainer")
    worker.start()
    started.wait(30)
    try:
        taker = StackTaker(lambda: 3, lambda: 12)
        taker.training = worker.ident
        taken = RankStacks.from_data(taker.take())
    finally:
        release.set()
        worker.join(30)
    assert taken.rank == 3 and taken.step == 12 and taken.pid == os.getpid()
    first = taken.threads[0]
    assert first.training and first.name == "trainer"
    assert [f.func for f in first.frames if f.own][-1] == "blocked_in_c"
    assert first.frames[-1].func == "wait" and first.frames[-1].lib == "threading"


def _take_inside(filename: str, main_file: str, spec_name: str | None) -> RankStacks:
    """This process's stacks while a thread runs code compiled as ``filename``, with
    ``__main__`` as a script at ``main_file`` (``spec_name``: as ``python -m`` runs it)."""
    started, release = threading.Event(), threading.Event()
    space: dict = {"started": started, "release": release}
    exec(compile("def train_step():\n    started.set()\n    release.wait(30)\n", filename, "exec"), space)
    main = types.ModuleType("__main__")
    main.__file__, main.__spec__ = main_file, (types.SimpleNamespace(name=spec_name) if spec_name else None)
    worker = threading.Thread(target=space["train_step"], name="trainer")
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = main
    worker.start()
    started.wait(30)
    try:
        taker = StackTaker(lambda: 0, lambda: 5)
        taker.training = worker.ident
        return RankStacks.from_data(taker.take())
    finally:
        sys.modules["__main__"] = saved
        release.set()
        worker.join(30)


def test_a_script_that_lies_among_ptdash_s_or_a_package_s_files_is_still_the_script():
    # The demo lives in ptdash's package, and `-m pkg.train` of an installed package in
    # site-packages: their frames are the script's, so the sentence names their lines.
    demo = str(Path(ptdash.__file__).parent / "demo")
    taken = _take_inside(f"{demo}/model.py", f"{demo}/train.py", None)
    inner = next(f for f in taken.training.frames if f.func == "train_step")
    assert inner.own and not inner.lib, inner
    assert where(taken) == "`train_step` (model.py:3)"  # (no source line: the file is not on disk)
    site = sysconfig.get_paths()["purelib"]
    taken = _take_inside(f"{site}/mypkg/layers/attn.py", f"{site}/mypkg/train.py", "mypkg.train")
    assert next(f for f in taken.training.frames if f.func == "train_step").own
    # A top-level module of site-packages makes only its own file the script's, not its neighbours'.
    taken = _take_inside(f"{site}/other.py", f"{site}/single.py", "single")
    inner = next(f for f in taken.training.frames if f.func == "train_step")
    assert not inner.own and inner.lib == "other", inner


SPINNER = """
def outer(stop):
    while not stop.is_set():
        middle()
        other()

def middle():
    inner()

def inner():
    sum(range(2000))

def other():
    sum(range(2000))
"""


def test_a_take_is_one_moment_of_the_training_thread_not_frames_it_has_left(tmp_path):
    # The training thread runs on between threads' walks (reading a source file releases the
    # GIL): every thread's frames are walked before any line is read, so a stack never holds
    # a frame that has returned (read at its return line) under a caller that has moved on.
    source = tmp_path / "spinner.py"
    source.write_text(SPINNER)
    space: dict = {}
    exec(compile(SPINNER, str(source), "exec"), space)
    stop = threading.Event()
    worker = threading.Thread(target=space["outer"], args=(stop,), name="trainer")
    worker.start()
    sleepers = [threading.Thread(target=stop.wait, name=f"sleeper{i}") for i in range(4)]
    for t in sleepers:
        t.start()  # walked before the trainer (newest first), their files read first
    calls = {4: "middle", 5: "other", 8: "inner"}
    try:
        taker = StackTaker(lambda: 0, lambda: 1)
        taker.training = worker.ident
        for _ in range(300):
            linecache.clearcache()  # every take reads its files again, as the first one does
            frames = [f for f in RankStacks.from_data(taker.take()).training.frames if f.file == str(source)]
            for caller, callee in zip(frames, frames[1:]):
                assert calls.get(caller.line) == callee.func, frames
    finally:
        stop.set()
        for t in [worker, *sleepers]:
            t.join(30)


def test_a_file_and_function_of_other_characters_than_ascii_read_as_they_are(tmp_path):
    source = tmp_path / "données" / "entraîner.py"
    source.parent.mkdir()
    source.write_text("def attendre_ü(started, release):\n    started.set()\n    release.wait(30)\n")
    space: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), space)
    started, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=space["attendre_ü"], args=(started, release), name="trainer")
    worker.start()
    started.wait(30)
    try:
        taker = StackTaker(lambda: 0, lambda: 1)
        taker.training = worker.ident
        frame = next(f for f in RankStacks.from_data(taker.take()).training.frames if f.own)
    finally:
        release.set()
        worker.join(30)
    assert (frame.file, frame.func, frame.line, frame.code) == (str(source), "attendre_ü", 3, "release.wait(30)")


def test_in_a_process_of_more_threads_than_faulthandler_dumps_every_thread_is_taken():
    # faulthandler dumps 100 threads, the newest first: the training thread, often the
    # oldest, is among the others, taken all the same.
    started, release = threading.Event(), threading.Event()

    def blocked_in_c():
        started.set()
        release.wait(30)

    trainer = threading.Thread(target=blocked_in_c, name="trainer")
    trainer.start()
    started.wait(30)
    pool = [threading.Thread(target=release.wait, args=(30,), name=f"io-{i}") for i in range(110)]
    for t in pool:
        t.start()
    try:
        taker = StackTaker(lambda: 0, lambda: 3)
        taker.training = trainer.ident
        taken = RankStacks.from_data(taker.take())
    finally:
        release.set()
        for t in [trainer, *pool]:
            t.join(30)
    assert {t.name for t in taken.threads} >= {f"io-{i}" for i in range(110)} | {"trainer"}
    first = taken.threads[0]
    assert first.training and first.name == "trainer"
    assert [f.func for f in first.frames if f.own][-1] == "blocked_in_c"


def test_a_single_process_in_backward_waits_for_no_other_rank():
    one = [_rank(0, *BACKWARD)]
    assert doing(one[0], alone=True) == ("backward", "in backward")
    assert summary(one) == "rank 0 was in `loss.backward()` (train.py:15), in backward"
    assert "rank 0, step 29: in backward; training thread:" in render(one)
    assert "DDP" in doing(one[0])[1]  # a rank of several: DDP's all-reduce is what waits there


def test_collectives_are_counted_and_the_wrappers_undone():
    import torch.distributed as dist

    original = dist.all_reduce
    counted = Collectives(lambda: 7)
    counted.attach()
    try:
        assert dist.all_reduce is not original and dist.all_reduce.__wrapped__ is original
        try:
            dist.all_reduce(None)  # no process group: torch raises, after the count
        except Exception:  # noqa: BLE001 - torch's own error
            pass
        assert counted.counts == {"all_reduce": 1} and counted.last == {"all_reduce": 7}
    finally:
        counted.detach()
    assert dist.all_reduce is original


def test_proc_state_of_this_process():
    state, _ = process_state(os.getpid())
    assert state in ("R (running)", "S (sleeping)")
    assert process_state(2 ** 22 + 12345) == ("", "")


def test_a_rank_held_at_ptdash_s_step_boundary_waits_and_says_so():
    boundary = [Frame(file="/home/u/train.py", line=20, func="step", code="opt.step()", own=True),
                Frame(file=SITE + "torch/optim/optimizer.py", line=500, func="wrapper", lib="torch"),
                Frame(file="/src/ptdash/engine/controls.py", line=200, func="_apply_inbox", lib="ptdash"),
                Frame(file="/src/ptdash/engine/distributed.py", line=180, func="exchange", lib="ptdash"),
                Frame(file="/x/threading.py", line=320, func="wait", lib="threading")]
    ranks = [_rank(0, *boundary), _rank(1, *SPIN)]
    assert doing(ranks[0])[0] == "ptdash" and culprits(ranks) == [1]
    assert summary(ranks) == ("rank 1 was in `wait_for_lost_shard` (train.py:12); rank 0 waited in `opt.step()` "
                              "(train.py:20) (at ptdash's step boundary, waiting for the other ranks)")


def test_ptdash_stacks_refuses_a_timeout_that_is_not_a_positive_number_in_one_line():
    import pytest

    from ptdash.tui import subcommands
    from ptdash.tui.errors import CliError

    for bad in ("-1", "0", "nan", "soon"):
        with pytest.raises(CliError, match="--timeout must be a (finite )?number") as refused:
            subcommands.parse("stacks", ["--timeout", bad])
        assert refused.value.code == 2 and "\n" not in str(refused.value)
    assert subcommands.parse("stacks", ["--timeout", "2.5", "run"]).timeout == 2.5


def test_the_stacks_of_many_ranks_are_cut_to_fit_a_frame_the_innermost_frames_kept():
    deep = tuple(Frame(file=SITE + "torch/x.py", line=i, func=f"f{i}", code="x" * 80, lib="torch") for i in range(60))
    ranks = [RankStacks(rank=r, threads=(Thread(name="MainThread", training=True, frames=tuple(MAIN) + deep),
                                         *(Thread(name=f"t{i}", frames=deep) for i in range(9)))).to_data()
             for r in range(20)]
    assert fit(ranks, limit=10 ** 7) == ranks  # small enough: untouched
    cut = fit(ranks, limit=40_000)
    assert len(json.dumps(cut)) <= 40_000
    found = read(cut)
    assert [r.rank for r in found] == list(range(20))
    assert all(r.training.frames[-1].func == "f59" for r in found)  # where each one is, still there
    assert "too many ranks to send whole: other threads cut to their innermost frame" in found[0].note
    assert any(line.startswith("(too many ranks") for line in render(found))
