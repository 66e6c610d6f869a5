"""Where each rank is: every thread's Python stack, as the engines took them, and what they say.

An engine's own thread takes its process's stacks (engine/stacks.py); the hub gathers every
rank's (engine/stackgather.py) on demand (``ptdash stacks``, the Ranks tab's key) and when a
rank stalls (kept with the stall event). This module is what both sides read: the records
(``RankStacks``: a rank's threads, each a list of ``Frame``), what a rank's training thread is
doing (``doing``: in a collective, in backward, at ptdash's step boundary, waiting for a
DataLoader batch, in its own code...), which ranks the others wait for (``culprits``), one
sentence for a stall (``summary``) and the side-by-side text of ``ptdash stacks`` (``render``):
the frames common to every rank folded, the frame where they differ marked. Stdlib only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import flight
from .flight import Flight
from .records import Record

ANSWER_SECONDS = 3.0
"""How long the hub waits for a rank's engine to answer; past it, the rank is named as not
answering (its interpreter busy in C with the GIL held, or its process stopped)."""

WAITING = ("collective", "backward", "ptdash")
"""What a training thread does when it waits for the other ranks."""


@dataclass(frozen=True)
class Frame(Record):
    """One frame, outermost first in a thread's list."""

    file: str = ""
    line: int = 0
    func: str = ""
    code: str = ""
    """The source line, stripped."""
    own: bool = False
    """The script's code (not the standard library's, an installed package's, or ptdash's)."""
    lib: str = ""
    """The package a frame that is not the script's belongs to (``torch``, ``threading``...)."""


@dataclass(frozen=True)
class Thread(Record):
    name: str = ""
    training: bool = False
    """The thread that trains (the one that made the steps, else the main thread)."""
    ptdash: bool = False
    """One of ptdash's own threads."""
    frames: tuple[Frame, ...] = ()


@dataclass(frozen=True)
class RankStacks(Record):
    """One rank's stacks, or why it did not answer."""

    rank: int = 0
    pid: int = 0
    host: str = ""
    step: int | None = None
    """Its newest step (its engine's count; the hub's last known one when it did not answer)."""
    answered: bool = True
    note: str = ""
    """Why there are no stacks (no answer in time, not instrumented)."""
    state: str = ""
    """Its process's state from /proc (``R (running)``, ``S (sleeping)``, ``T (stopped)``)."""
    wchan: str = ""
    """Where in the kernel it waits (/proc/PID/wchan), when it does."""
    threads: tuple[Thread, ...] = ()
    collectives: dict = field(default_factory=dict)
    """torch.distributed calls made, by name (``all_reduce``: 31)."""
    last_collective: dict = field(default_factory=dict)
    """The step of each one's newest call (``all_reduce``: 29)."""
    wall: float = 0.0
    flight: Flight = field(default_factory=Flight)
    """torch's flight recorder's newest collectives per process group (shared/flight.py)."""

    @property
    def training(self) -> Thread | None:
        return next((t for t in self.threads if t.training), None)


STATES = {"R": "running", "S": "sleeping", "D": "waiting for I/O", "T": "stopped", "t": "stopped by a tracer",
          "Z": "a zombie", "X": "dead", "I": "idle"}


def process_state(pid: int) -> tuple[str, str]:
    """``("R (running)", wchan)`` of a process from /proc, or ``("", "")`` when it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", ""
    letter = stat.rpartition(")")[2].split()[0] if ")" in stat else ""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        wchan = ""
    return (f"{letter} ({STATES.get(letter, '?')})" if letter else ""), ("" if wchan in ("0", "") else wchan)


FIT_BYTES = 4 * 1024 * 1024
"""The most every rank's stacks together may take as JSON: half a protocol frame (8 MiB), so that
a job of many ranks still gets its answer and its stall event to the dashboards."""


def _others_innermost(t: dict) -> dict | None:
    return t if t.get("training") else {**t, "frames": (t.get("frames") or [])[-1:]}


def _training_inner(t: dict) -> dict | None:
    return {**t, "frames": (t.get("frames") or [])[-12:]} if t.get("training") else t


def _no_code(t: dict) -> dict | None:
    return {**t, "frames": [{**f, "code": ""} for f in t.get("frames") or []]}


def _training_only(t: dict) -> dict | None:
    return {**t, "frames": (t.get("frames") or [])[-3:]} if t.get("training") else None


CUTS = (("other threads cut to their innermost frame", _others_innermost),
        ("the training thread cut to its 12 innermost frames", _training_inner),
        ("source lines left out", _no_code),
        ("only the training thread's 3 innermost frames kept", _training_only))
"""How ``fit`` makes every rank's stacks smaller, the least useful part first."""


def _each_thread(cut):
    return lambda r: {**r, "threads": [c for t in r.get("threads") or [] if (c := cut(t)) is not None]}


def fit(ranks: list[dict], limit: int = FIT_BYTES) -> list[dict]:
    """``ranks`` (RankStacks JSON objects) made to fit in ``limit`` bytes of JSON by the flight
    recorder's cut then ``CUTS``, one after another until they do; each rank's note says what was
    left out."""
    def size(obj) -> int:
        return len(json.dumps(obj, separators=(",", ":"), default=str))

    if size(ranks) <= limit:
        return ranks
    said = []
    for words, cut in ((flight.CUT, flight.cut), *((w, _each_thread(c)) for w, c in CUTS)):
        smaller = [cut(r) for r in ranks]
        said += [words] if smaller != ranks else []
        ranks = smaller
        if size(ranks) <= limit:
            break
    told = "too many ranks to send whole: " + ", ".join(said)
    return [{**r, "note": f"{r['note']}; {told}" if r.get("note") else told} for r in ranks]


def read(ranks: object) -> list[RankStacks]:
    """The records of a list of JSON objects (what travels and is stored), by rank."""
    if not isinstance(ranks, (list, tuple)):
        return []
    found = [r if isinstance(r, RankStacks) else RankStacks.from_data(r) for r in ranks]
    return sorted(found, key=lambda r: r.rank)


def short(path: str) -> str:
    """A frame's file as it reads best: after site-packages or the stdlib's directory, else its name."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    parts = path.replace("\\", "/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part.startswith("python3") and i and parts[i - 1] == "lib":
            return "/".join(parts[i + 1:])
    return parts[-1]


def at(frame: Frame) -> str:
    return f"{short(frame.file)}:{frame.line}"


def doing(rank: RankStacks, alone: bool = False) -> tuple[str, str]:
    """``(kind, words)``: what the training thread does. Kinds: ``collective``, ``backward``,
    ``ptdash`` (the others' step boundary), ``data`` (a DataLoader batch), ``sleep``,
    ``python`` (the script's own code runs, or a C function it called, like ``time.sleep``),
    ``library``, ``stopped``, ``silent`` (no answer). ``alone``: the run's only process (its
    backward waits for no other rank)."""
    if not rank.answered:
        if rank.state.startswith("T"):
            return "stopped", "its process is stopped (SIGSTOP or a debugger)"
        return "silent", "its interpreter did not answer" + (f"; process {rank.state}" if rank.state else "")
    thread = rank.training
    if thread is None or not thread.frames:
        return "library", "no Python frame in its training thread"
    frames = thread.frames
    user = [i for i, f in enumerate(frames) if f.own]
    below = frames[user[-1] + 1:] if user else frames
    for f in below:
        if f.lib == "ptdash" and f.func in ("exchange", "request", "barrier"):
            return "ptdash", "at ptdash's step boundary, waiting for the other ranks"
        if "torch/distributed/" in f.file and f.func not in ("wrapper", "_fn"):
            return "collective", f"in {f.func}"
        if "torch/utils/data/" in f.file:
            return "data", "waiting for a DataLoader batch"
        if f.func in ("backward", "_engine_run_backward") and f.lib == "torch":
            return "backward", "in backward" + ("" if alone else " (DDP's gradient all-reduce waits there)")
        if f.func == "sleep" or (f.lib in ("threading", "queue") and f.func in ("wait", "get", "acquire")):
            return "sleep", f"waiting in {f.func}"
    if not below:
        return "python", "in its own code (or a C function it called: no Python frame shows one)"
    return "library", f"in {below[-1].func} ({short(below[-1].file)})"


def where(rank: RankStacks) -> str:
    """The script's line a rank's training thread is at: "`slow` (train.py:12)" while its own
    code runs, "`loss.backward()` (train.py:15)" when a library call waits under that line."""
    thread = rank.training
    if thread is None:
        return ""
    own = [f for f in thread.frames if f.own]
    if not own:
        return f"`{thread.frames[-1].func}` ({at(thread.frames[-1])})" if thread.frames else ""
    frame = own[-1]
    if frame is thread.frames[-1] or not frame.code:
        return f"`{frame.func}` ({at(frame)})"
    return f"`{frame.code.split('  #')[0].strip()}` ({at(frame)})"


def culprits(ranks: list[RankStacks]) -> list[int]:
    """The ranks the others wait for, by their stacks: those that are not in a collective,
    backward or ptdash's step boundary while some others are (none when all wait, or none does)."""
    kinds = {r.rank: doing(r, len(ranks) == 1)[0] for r in ranks}
    waiting = [r for r, k in kinds.items() if k in WAITING]
    if not waiting or len(waiting) == len(kinds):
        return []
    return sorted(r for r, k in kinds.items() if k not in WAITING)


def _ranks(numbers: list[int]) -> str:
    return f"rank{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def mismatch(ranks: list[RankStacks]) -> str:
    """The collectives some ranks made more of than others ("rank 1 made 1 fewer all_reduce
    than rank 0 since step 29": after its call at step 29 the others made one more), or ""."""
    answered = [r for r in ranks if r.answered]
    names = sorted({n for r in answered for n in r.collectives})
    out = []
    for name in names:
        counts = {r.rank: int(r.collectives.get(name, 0)) for r in answered}
        most = max(counts.values())
        fewer = sorted(r for r, c in counts.items() if c < most)
        if fewer:
            top = sorted(r for r, c in counts.items() if c == most)
            gap = most - min(counts[r] for r in fewer)
            lasts = [r.last_collective.get(name) for r in answered if r.rank in fewer]
            since = f" since step {min(lasts)}" if lasts and all(isinstance(x, int) for x in lasts) else ""
            out.append(f"{_ranks(fewer)} made {gap} fewer {name} than {_ranks(top)}{since} ({most} made)")
    return "; ".join(out)


def summary(ranks: list[RankStacks], seconds: float | None = None, so_far: bool = False) -> str:
    """One sentence: "rank 1 was in `slow` (train.py:12) for 40 s; rank 0 waited in
    `loss.backward()` (train.py:15)" (the ranks the others wait for first). With ``seconds``
    (a stall's length; ``so_far`` while it lasts) the length is said even when every rank waits."""
    if not ranks:
        return ""
    named, alone = culprits(ranks), len(ranks) == 1
    groups: dict[tuple[str, str], list[int]] = {}
    for r in ranks:
        kind, words = doing(r, alone)
        spot = where(r)
        groups.setdefault((spot, kind if kind in WAITING or not spot else words), []).append(r.rank)
    lasting = f" for {seconds:.0f} s{' so far' if so_far else ''}" if seconds is not None else ""
    parts = []
    for (spot, what), numbers in sorted(groups.items(), key=lambda g: (not set(g[1]) & set(named), g[1])):
        first = ranks[[r.rank for r in ranks].index(numbers[0])]
        kind, words = doing(first, alone)
        if kind in ("stopped", "silent"):
            step = f" (last reported step {first.step})" if first.step is not None else ""
            parts.append(f"{_ranks(numbers)}: {words}{step}")
        elif kind in WAITING and not alone:  # a single process waits for no other
            said = f" ({words})" if kind in ("collective", "ptdash") and spot else ""
            parts.append(f"{_ranks(numbers)} waited in {spot or words}{said}")
        else:
            parts.append(f"{_ranks(numbers)} {'was' if len(numbers) == 1 else 'were'} in {spot}{lasting}"
                         + ("" if kind == "python" else f", {words}"))
    text = "; ".join(parts)
    if lasting and lasting not in text:
        text += f"; no rank made a step{lasting}"
    recorded = flight.mismatch(ranks)
    more = "; ".join(m for m in (mismatch(ranks), recorded and f"by the flight recorder, {recorded}") if m)
    return f"{text}; {more}" if more else text


# ---------------------------------------------------------------------------- the fold


def _key(frame: Frame) -> tuple:
    return frame.file, frame.line, frame.func


def script_frames(frames) -> list[Frame]:
    """A thread's frames from the script's first one on (ptdash's bootstrap and runpy left out)."""
    frames = list(frames)
    first = next((i for i, f in enumerate(frames) if f.own), 0)
    return frames[first:]


def fold(ranks: list[RankStacks]) -> tuple[list[Frame], list[tuple[list[int], list[Frame]]]]:
    """The training threads' frames common to every rank that answered (outermost first), and
    the rest grouped: ``[(ranks, frames after the common ones)]``, identical rests together;
    the first frame of each rest is where the ranks differ."""
    stacks = {r.rank: script_frames(r.training.frames) if r.training else [] for r in ranks if r.answered}
    if not stacks:
        return [], []
    lists = list(stacks.values())
    common = 0
    while all(len(s) > common for s in lists) and len({_key(s[common]) for s in lists}) == 1:
        common += 1
    if len(lists) > 1 and all(len(s) == common for s in lists) and common:
        common -= 1  # identical stacks: keep the innermost frame where it shows
    groups: dict[tuple, tuple[list[int], list[Frame]]] = {}
    for rank, frames in sorted(stacks.items()):
        rest = frames[common:]
        groups.setdefault(tuple(map(_key, rest)), ([], rest))[0].append(rank)
    return lists[0][:common], list(groups.values())


def _frame_lines(frame: Frame, mark: bool, width: int) -> list[str]:
    head = f"{'▶ ' if mark else '  '}{frame.func}  {at(frame)}"
    lines = [head[:width]]
    if frame.code:
        lines.append(("    " + frame.code)[:width])
    return lines


def render(ranks: list[RankStacks], width: int = 100, all_threads: bool = True) -> list[str]:
    """The text of ``ptdash stacks``: the summary, the common frames, the ranks side by side
    from the frame where they differ (marked ▶), the silent ranks, each rank's newest collectives
    by the flight recorder (shared/flight.py), then the other threads."""
    ranks = read(ranks)
    lines = []
    text = summary(ranks)
    if text:
        lines += [text, ""]
    common, groups = fold(ranks)
    answered = [r for r in ranks if r.answered]
    if len(answered) == 1:  # one process, or one rank of several that answered: its stack alone
        only = answered[0]
        step = f", step {only.step}" if only.step is not None else ""
        lines.append(f"rank {only.rank}{step}: {doing(only, len(ranks) == 1)[1]}; training thread:")
        for frame in common + (groups[0][1] if groups else []):
            lines += _frame_lines(frame, False, width)
        common, groups = [], []
    if common:
        noun = "all ranks" if len(ranks) > 1 else f"rank {ranks[0].rank}"
        lines.append(f"training thread, common to {noun} ({len(common)} frames):")
        for frame in common:
            lines += _frame_lines(frame, False, width)
    if groups:
        lines.append("ranks differ here:" if len(groups) > 1 else "then:")
        columns = max(1, len(groups))
        col = max(24, (width - 3 * (columns - 1)) // columns)
        blocks = []
        for numbers, frames in groups:
            first = next(r for r in ranks if r.rank == numbers[0])
            step = f", step {first.step}" if first.step is not None else ""
            block = [f"{_ranks(numbers)}{step}: {doing(first)[1]}"[:col]]
            for i, frame in enumerate(frames):
                block += _frame_lines(frame, i == 0 and len(groups) > 1, col)
            blocks.append(block)
        height = max(len(b) for b in blocks)
        for row in range(height):
            cells = [(b[row] if row < len(b) else "").ljust(col) for b in blocks]
            lines.append(" │ ".join(cells).rstrip())
    for r in ranks:
        if not r.answered:
            step = f", last reported step {r.step}" if r.step is not None else ""
            lines.append(f"rank {r.rank} (pid {r.pid}{step}): {r.note or 'no answer'}"
                         + (f"; process {r.state}" if r.state else "") + (f", in the kernel at {r.wchan}"
                                                                          if r.wchan else ""))
    for note in sorted({r.note for r in ranks if r.answered and r.note}):
        lines.append(f"({note})")
    recorded = flight.render(ranks, width)
    lines += [""] + recorded if recorded else []
    if all_threads:
        for r in ranks:
            others = [t for t in r.threads if not t.training]
            if not others:
                continue
            lines += ["", f"rank {r.rank}: other threads"]
            for t in others:
                top = t.frames[-1] if t.frames else None
                lines.append(f"  {t.name}{' (ptdash)' if t.ptdash else ''}: "
                             + (f"{top.func}  {at(top)}" if top else "no Python frame"))
                if not t.ptdash:
                    for frame in t.frames[-4:-1][::-1]:
                        lines.append(f"      from {frame.func}  {at(frame)}")
    return lines
