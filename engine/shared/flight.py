"""torch's flight recorder, as each rank's engine read it: its newest collectives per process group.

Every process group of torch.distributed records the collectives it runs in a ring buffer
(``TORCH_FR_BUFFER_SIZE`` entries: 2000 by default in torch 2.13, which ptdash leaves as it is;
gloo's in one recorder, NCCL's in one of its own, both read: seen on an H200), including
those the script never calls by name: DDP's reducer's gradient all-reduces. A
rank's engine reads it with its stacks (engine/flight.py); this module is what both sides read:
the records (``Flight``: a rank's newest ``Entry``s per group and each group's counters), the
sentence that names the ranks that are behind or disagree (``mismatch``) and one line per
entry (``entry_line``). Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .records import Record

KEEP = 8
"""Entries kept per process group, the newest."""

NO_GROUP = "no process group"
"""The note of a process that made none (a run of one process): nothing to say."""


@dataclass(frozen=True)
class Entry(Record):
    """One collective a process group ran (or is running), as the recorder has it."""

    group: str = ""
    """The process group's name (``0`` for the default group), the same on every rank."""
    desc: str = ""
    """The group's description (``default_pg``; ``undefined`` when the script gave none)."""
    seq: int = 0
    """Its number in the group's collectives (``collective_seq_id``), 1 for the first."""
    op: str = ""
    """``gloo:all_reduce``, ``nccl:broadcast``..."""
    sizes: tuple[tuple[int, ...], ...] = ()
    """Its input tensors' shapes."""
    dtypes: tuple[str, ...] = ()
    state: str = ""
    """``scheduled``, ``started`` or ``completed`` (gloo says ``scheduled`` until it is retired)."""
    retired: bool = False
    """Its work is over (completed, or given up)."""
    p2p: bool = False
    """A send or recv (numbered apart, in ``p2p_seq``)."""
    p2p_seq: int = 0
    created_ns: int = 0


@dataclass(frozen=True)
class Group(Record):
    """A process group's counters: the numbers of its newest collectives (-1: none yet)."""

    group: str = ""
    enqueued: int = -1
    started: int = -1
    completed: int = -1


@dataclass(frozen=True)
class Flight(Record):
    """What a rank's flight recorder held when its stacks were taken, or why nothing."""

    entries: tuple[Entry, ...] = ()
    """The newest ``KEEP`` of each group, oldest first."""
    groups: tuple[Group, ...] = ()
    note: str = ""
    """Why there are no entries (no recorder in this torch, switched off, not read)."""


CUT = "the flight recorder's entries cut to the newest 2 of each group"
"""What ``cut`` leaves out, said in the note of stacks too big to send (stacks.fit)."""


def cut(rank: dict) -> dict:
    """A RankStacks JSON object with its flight recorder's newest 2 entries of each group only: the
    newest numbers are what ``mismatch`` compares."""
    found = rank.get("flight")
    if not isinstance(found, dict) or not isinstance(found.get("entries"), list):
        return rank
    entries, seen = [], {}
    for e in reversed(found["entries"]):
        group = e.get("group") if isinstance(e, dict) else None
        seen[group] = seen.get(group, 0) + 1
        if seen[group] <= 2:
            entries.append(e)
    return {**rank, "flight": {**found, "entries": entries[::-1]}}


def status(entry: Entry) -> str:
    """``completed``, ``started`` or ``scheduled``: what is known of how far it got."""
    return "completed" if entry.state == "completed" or entry.retired else (entry.state or "scheduled")


def elements(entry: Entry) -> int:
    total = 0
    for shape in entry.sizes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def what(entry: Entry, with_state: bool = True) -> str:
    """``gloo:all_reduce, 25 elements, scheduled``."""
    parts = [entry.op or "?"]
    if entry.sizes:
        n = elements(entry)
        parts.append(f"{n} element{'s' if n != 1 else ''}")
    if with_state:
        parts.append(status(entry))
    return ", ".join(parts)


def entry_line(entry: Entry) -> str:
    """One entry on one line: ``group 0 #42  gloo:all_reduce  [25]  Float  scheduled`` (a barrier
    has no tensors to show)."""
    number = f"p2p #{entry.p2p_seq}" if entry.p2p else f"#{entry.seq}"
    shapes = " ".join("[" + ", ".join(map(str, s)) + "]" for s in entry.sizes)
    parts = [f"group {entry.group} {number}", entry.op, shapes, " ".join(entry.dtypes), status(entry)]
    return "  ".join(p for p in parts if p)


def group_name(group: str, desc: str) -> str:
    return f"group {group}" + (f" ({desc})" if desc and desc != "undefined" else "")


def _newest(flight: Flight, group: str) -> tuple[int, Entry | None]:
    """The number of a rank's newest collective in ``group`` and its entry (when kept)."""
    kept = [e for e in flight.entries if e.group == group and not e.p2p]
    counted = next((g.enqueued for g in flight.groups if g.group == group), -1)
    seq = max([counted] + [e.seq for e in kept])
    return seq, next((e for e in reversed(kept) if e.seq == seq), None)


def _ranks(numbers: list[int]) -> str:
    return f"rank{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def _at(seq: int, entry: Entry | None) -> str:
    return f"collective {seq}" + (f" ({what(entry)})" if entry is not None else "")


def _behind(group: str, desc: str, newest: dict[int, tuple[int, Entry | None]]) -> str:
    top = max(seq for seq, _ in newest.values())
    low = sorted(r for r, (seq, _) in newest.items() if seq < top)
    parts = []
    for seq in sorted({newest[r][0] for r in low}):
        numbers = [r for r in low if newest[r][0] == seq]
        parts.append(f"{_ranks(numbers)} {'is' if len(numbers) == 1 else 'are'} at {_at(seq, newest[numbers[0]][1])}")
    ahead = sorted(r for r, (seq, _) in newest.items() if seq == top)
    return f"{'; '.join(parts)} of {group_name(group, desc)}; {_ranks(ahead)} at {_at(top, newest[ahead[0]][1])}"


def _differ(group: str, desc: str, flights: dict[int, Flight]) -> str:
    """The first collective number that the ranks kept but ran as different collectives (op or
    shapes), named with what each ran; "" when none."""
    kept = {r: {e.seq: e for e in f.entries if e.group == group and not e.p2p} for r, f in flights.items()}
    common = set.intersection(*(set(k) for k in kept.values())) if kept else set()
    for seq in sorted(common):
        runs: dict[tuple, list[int]] = {}
        for r, k in sorted(kept.items()):
            runs.setdefault((k[seq].op, k[seq].sizes), []).append(r)
        if len(runs) > 1:
            said = "; ".join(f"{_ranks(rs)} {what(kept[rs[0]][seq])}" for rs in runs.values())
            return f"collective {seq} of {group_name(group, desc)} is not the same on every rank: {said}"
    return ""


def _groups(ranks: list):
    """``(group, desc, {rank: Flight})`` of each process group two or more ranks' recorders have."""
    flights = {r.rank: r.flight for r in ranks if r.answered and (r.flight.entries or r.flight.groups)}
    groups: dict[str, str] = {}
    for e in (e for f in flights.values() for e in f.entries):
        groups.setdefault(e.group, e.desc)
    for g in (g for f in flights.values() for g in f.groups):
        groups.setdefault(g.group, "")
    for group, desc in sorted(groups.items(), key=lambda g: (len(g[0]), g[0])):
        members = {r: f for r, f in flights.items() if any(e.group == group for e in f.entries)
                   or any(g.group == group and g.enqueued >= 0 for g in f.groups)}
        if len(members) > 1:
            yield group, desc, members


def mismatch(ranks: list) -> str:
    """By the flight recorder, per process group: the ranks whose newest collective is an older
    one than the others' ("rank 1 is at collective 41 (gloo:all_reduce, 25 elements, completed)
    of group 0 (default_pg); rank 0 at collective 42 (...)"), and a collective number the ranks
    ran as different collectives; "" when they agree or no rank's recorder was read.
    ``ranks`` are RankStacks (their ``rank``, ``answered`` and ``flight``)."""
    out = []
    for group, desc, members in _groups(ranks):
        newest = {r: _newest(f, group) for r, f in members.items()}
        if len({seq for seq, _ in newest.values()}) > 1:
            out.append(_behind(group, desc, newest))
        elif said := _differ(group, desc, members):
            out.append(said)
    return "; ".join(out)


def behind(ranks: list) -> list[int]:
    """The ranks whose newest collective in some group is older than the others': the others have
    made a collective that waits for them."""
    out = set()
    for group, _, members in _groups(ranks):
        newest = {r: _newest(f, group)[0] for r, f in members.items()}
        out |= {r for r, seq in newest.items() if seq < max(newest.values())}
    return sorted(out)


def _newest_lines(flight: Flight, last: int) -> tuple[str, ...]:
    groups = dict.fromkeys(e.group for e in flight.entries)
    shown = [e for g in groups for e in [x for x in flight.entries if x.group == g][-last:]]
    return tuple(entry_line(e) for e in sorted(shown, key=lambda e: e.created_ns))


def render(ranks: list, width: int = 100, last: int = 4) -> list[str]:
    """The ``ptdash stacks`` lines of each rank's ``last`` newest collectives per group, newest last:
    ranks with the same entries together, side by side when they fit in ``width`` (the ranks' notes
    when no rank's recorder had any, but for a process with no group)."""
    kept: dict[tuple[str, ...], list[int]] = {}
    for r in ranks:
        if r.answered and r.flight.entries:
            kept.setdefault(_newest_lines(r.flight, last), []).append(r.rank)
    if not kept:
        notes = sorted({n for r in ranks if r.answered and (n := r.flight.note) and n != NO_GROUP})
        return [f"({'; '.join(notes)})"] if notes else []
    blocks = [[f"{_ranks(numbers)}:"] + [f"  {line}" for line in lines] for lines, numbers in kept.items()]
    col = max(len(line) for b in blocks for line in b)
    out = ["flight recorder, newest collectives:"]
    if len(blocks) > 1 and len(blocks) * (col + 3) - 3 <= width:
        for row in range(max(len(b) for b in blocks)):
            out.append(" │ ".join((b[row] if row < len(b) else "").ljust(col) for b in blocks).rstrip())
        return out
    return out + [line for b in blocks for line in b]
