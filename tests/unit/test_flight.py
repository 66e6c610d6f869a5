"""torch's flight recorder as the ranks' stacks carry it: read in a real gloo process group
(engine/flight.py), and what it names across ranks (shared/flight.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ptdash.flight import parse
from ptdash.shared.flight import Entry, Flight, Group, entry_line, mismatch, render
from ptdash.shared.stacks import RankStacks, read, summary

ONE_RANK = """
import json, os, tempfile, threading
import torch, torch.distributed as dist
from torch import nn
from ptdash.stacks import StackTaker

dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
model = nn.parallel.DistributedDataParallel(nn.Linear(5, 5))
for _ in range(3):
    model(torch.randn(2, 5)).sum().backward()  # DDP's reducer all-reduces the gradients: 30 elements
dist.all_reduce(torch.ones(25))
out = {}
taker = threading.Thread(target=lambda: out.update(StackTaker(lambda: 0, lambda: 3).take()))
taker.start()
taker.join()
print(json.dumps(out["flight"]))
"""


def _one_rank(**env) -> Flight:
    done = subprocess.run([sys.executable, "-c", ONE_RANK], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert done.returncode == 0, done.stderr
    return Flight.from_data(json.loads(done.stdout.splitlines()[-1]))


def test_a_take_reads_the_recorder_with_ddp_s_gradient_all_reduces():
    # torch's own recorder as it is by default (ptdash sets no size): 2000 entries in 2.13.
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    done = subprocess.run([sys.executable, "-c", ONE_RANK], capture_output=True, text=True, timeout=120,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    flight = Flight.from_data(json.loads(done.stdout.splitlines()[-1]))
    assert flight.note == "" and len(flight.entries) == 8  # the newest 8 of the default group
    assert all(e.group == "0" and e.desc == "default_pg" for e in flight.entries)
    last = flight.entries[-1]
    assert (last.op, last.sizes, last.dtypes, last.retired) == ("gloo:all_reduce", ((25,),), ("Float",), True)
    buckets = [e for e in flight.entries if e.op == "gloo:all_reduce" and e.sizes == ((30,),)]
    assert len(buckets) >= 2  # the reducer's, which the script never calls by name
    assert [e.seq for e in flight.entries] == list(range(last.seq - 7, last.seq + 1))
    assert flight.groups == (Group(group="0", enqueued=last.seq, started=-1, completed=last.seq),)
    assert entry_line(last) == f"group 0 #{last.seq}  gloo:all_reduce  [25]  Float  completed"


def test_a_recorder_switched_off_reads_as_a_note():
    flight = _one_rank(TORCH_FR_BUFFER_SIZE="0")
    assert flight == Flight(note="the flight recorder is off (TORCH_FR_BUFFER_SIZE=0)")


def test_no_process_group_no_entries_and_old_stacks_read_without_a_recorder():
    from ptdash.flight import read as read_flight

    assert read_flight() == Flight(note="no process group")
    old = {"rank": 1, "pid": 3, "threads": [], "collectives": {"all_reduce": 2}}  # stored before the recorder
    (back,) = read([old])
    assert back.flight == Flight() and back.collectives == {"all_reduce": 2}


def _op(seq: int, op: str = "gloo:all_reduce", size: int = 30, retired: bool = True) -> Entry:
    return Entry(group="0", desc="default_pg", seq=seq, op=op, sizes=((size,),) if size else (), dtypes=("Float",) * bool(size),
                 state="scheduled", retired=retired, created_ns=seq)


def _ranks(*flights: Flight) -> list[RankStacks]:
    return [RankStacks(rank=i, pid=10 + i, flight=f) for i, f in enumerate(flights)]


def test_a_rank_behind_the_others_is_named_with_the_collectives_each_is_at():
    ahead = Flight(entries=(_op(41), _op(42, retired=False)), groups=(Group(group="0", enqueued=42, completed=41),))
    behind = Flight(entries=(_op(40), _op(41)), groups=(Group(group="0", enqueued=41, completed=41),))
    ranks = _ranks(ahead, behind, ahead)
    assert mismatch(ranks) == ("rank 1 is at collective 41 (gloo:all_reduce, 30 elements, completed) of group 0 "
                               "(default_pg); ranks 0, 2 at collective 42 (gloo:all_reduce, 30 elements, scheduled)")
    assert summary(ranks).endswith(f"; by the flight recorder, {mismatch(ranks)}")
    back = read([r.to_data() for r in ranks])
    assert back == ranks  # the entries travel as JSON and read back


def test_ranks_that_ran_different_collectives_under_one_number_are_named():
    reduce = Flight(entries=(_op(7), _op(8, retired=False)))
    barrier = Flight(entries=(_op(7), _op(8, "gloo:barrier", 0, retired=False)))
    assert mismatch(_ranks(reduce, barrier)) == (
        "collective 8 of group 0 (default_pg) is not the same on every rank: rank 0 gloo:all_reduce, 30 elements, "
        "scheduled; rank 1 gloo:barrier, scheduled")
    assert mismatch(_ranks(reduce, reduce)) == ""


def test_groups_a_rank_is_not_in_and_ranks_without_a_recorder_are_left_out():
    other = Entry(group="1", desc="undefined", seq=3, op="gloo:broadcast", sizes=((4,),))
    zero = Flight(entries=(_op(5), other))
    one = Flight(entries=(_op(5),))
    assert mismatch(_ranks(zero, one)) == ""  # only rank 0 is in group 1
    assert mismatch(_ranks(zero, Flight(note="this torch has no flight recorder"))) == ""


def test_parse_keeps_the_newest_of_each_group_and_maps_the_counters_to_group_names():
    raw = [{"collective_seq_id": s, "pg_id": 0, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce",
            "input_sizes": [[2, 3]], "input_dtypes": ["Float"], "state": "scheduled", "retired": True,
            "time_created_ns": s} for s in range(1, 13)]
    raw.append({"collective_seq_id": 1, "pg_id": 1, "process_group": ["7", "undefined"], "profiling_name": "gloo:barrier",
                "input_sizes": [], "retired": False, "time_created_ns": 100})
    flight = parse({"entries": raw, "pg_status": {"0": {"last_enqueued_collective": "12",
                                                        "last_completed_collective": "12"},
                                                  "1": {"last_enqueued_collective": "1"}}}, keep=3)
    assert [(e.group, e.seq) for e in flight.entries] == [("0", 10), ("0", 11), ("0", 12), ("7", 1)]
    assert flight.entries[0].sizes == ((2, 3),)
    assert flight.groups == (Group(group="0", enqueued=12, completed=12), Group(group="7", enqueued=1))
    assert parse({"version": "2.10"}) == Flight()


def test_ptdash_stacks_text_has_each_rank_s_newest_collectives_one_line_each():
    reduce = Flight(entries=tuple(_op(s) for s in range(1, 9)) + (_op(9, retired=False),))
    barrier = Flight(entries=(_op(8), _op(9, "gloo:barrier", 0, retired=False)))
    ranks = _ranks(reduce, barrier, reduce)
    lines = render(ranks, width=120)
    at = lines.index("flight recorder, newest collectives:")
    rows = [[cell.strip() for cell in line.split("│")] for line in lines[at + 1:at + 6]]
    assert rows == [["ranks 0, 2:", "rank 1:"],
                    ["group 0 #6  gloo:all_reduce  [30]  Float  completed",
                     "group 0 #8  gloo:all_reduce  [30]  Float  completed"],
                    ["group 0 #7  gloo:all_reduce  [30]  Float  completed", "group 0 #9  gloo:barrier  scheduled"],
                    ["group 0 #8  gloo:all_reduce  [30]  Float  completed", ""],
                    ["group 0 #9  gloo:all_reduce  [30]  Float  scheduled", ""]]
    narrow = render(ranks, width=60)  # one under the other
    assert narrow[narrow.index("rank 1:") + 2] == "  group 0 #9  gloo:barrier  scheduled"
    off = _ranks(Flight(note="the flight recorder is off (TORCH_FR_BUFFER_SIZE=0)"), Flight(note="no process group"))
    assert "(the flight recorder is off (TORCH_FR_BUFFER_SIZE=0))" in render(off)
    assert not any("flight recorder" in line for line in render(_ranks(Flight(note="no process group"))))


def test_stacks_of_many_ranks_cut_to_fit_keep_the_newest_collectives_that_name_the_mismatch():
    from ptdash.shared.stacks import fit

    ranks = _ranks(*[Flight(entries=tuple(_op(s) for s in range(1, 9)) + (_op(9, retired=False),))] * 39,
                   Flight(entries=tuple(_op(s) for s in range(1, 9))))
    data = [r.to_data() for r in ranks]
    said = mismatch(ranks)
    assert said.startswith("rank 39 is at collective 8")
    cut = fit(data, limit=len(json.dumps(data)) // 2)
    assert len(json.dumps(cut)) <= len(json.dumps(data)) // 2
    back = read(cut)
    assert [len(r.flight.entries) for r in back] == [2] * 40 and mismatch(back) == said
    assert back[0].note == "too many ranks to send whole: the flight recorder's entries cut to the newest 2 of each group"


def test_a_stall_every_rank_waits_at_is_named_by_the_flight_recorder_when_the_stacks_cannot_tell():
    import threading
    import time

    from ptdash.ranks import RankCollector
    from ptdash.shared import events
    from ptdash.shared.stacks import Frame, Thread

    site = "/venv/lib/python3.11/site-packages/"
    main = Frame(file="/u/train.py", line=40, func="<module>", code="main()", own=True)
    backward = (Frame(file="/u/train.py", line=15, func="main", code="loss.backward()", own=True),
                Frame(file=site + "torch/_tensor.py", line=623, func="backward", lib="torch"))
    recv = (Frame(file="/u/train.py", line=20, func="main", code="dist.recv(t, 0, group=pipe)", own=True),
            Frame(file=site + "torch/distributed/distributed_c10d.py", line=2500, func="recv", lib="torch"))

    def rank(r: int, inner: tuple, flight: Flight) -> dict:
        return RankStacks(rank=r, flight=flight, threads=(Thread(name="MainThread", training=True,
                                                                 frames=(main, *inner)),)).to_data()

    ahead = Flight(entries=(_op(41), _op(42, retired=False)))
    journaled, done = [], threading.Event()
    collector = RankCollector(None, lambda msg: None, lambda what, message: (journaled.append((what, message)),
                                                                            done.set()),
                              lambda: "running", stall_seconds=0.05)
    collector.stacks = lambda: [rank(0, backward, ahead), rank(1, recv, Flight(entries=(_op(41),)))]
    collector.receive(1, {"rows": []})
    collector.collect([[29, 1.0, {"loss": 1.0}]])
    collector._progress[1] = collector._progress[0]  # both ranks at step 29: the counts cannot tell
    time.sleep(0.2)
    collector.collect([])
    done.wait(30)
    stall, text = journaled[0]
    assert isinstance(stall, events.Stall) and stall.ranks == (1,)
    assert text.startswith("rank 1 stalled: no step for 0 s (at step 29); the others made a collective it has not "
                           "(by the flight recorder): ")
    assert "rank 1 is at collective 41" in text
