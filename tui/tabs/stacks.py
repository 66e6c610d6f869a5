"""What the stacks screen shows (``k``): where every thread of every rank is, each frame's
file:line, the training thread first.

Pure (Rich, no Textual), tested without an app. A run of several ranks gets the side-by-side
view of ``ptdash stacks`` first (shared/stacks.py's ``render``: the frames common to every rank
folded, ▶ where the ranks differ), then each rank's threads whole; a single process gets the
sentence saying where it is, then its threads whole. ptdash's own threads come last, one line
each: they are never what a script waits for.
"""

from __future__ import annotations

from rich.text import Text

from ptdash.shared.stacks import Frame, RankStacks, Thread, at, doing, read, render, script_frames, summary


def hint(live: bool) -> str:
    """The screen's last line: its keys (``k`` asks again only a live run)."""
    return ("k asks again" if live else "kept stacks (not a live run)") + " · Esc closes · ↑↓ PgUp PgDn scroll"


def title(when: str, asking: bool) -> Text:
    """The screen's first line: which stacks these are (asked for when, or the stall's)."""
    out = Text.assemble(("Stacks ", "bold"), (when, ""))
    if asking:
        out.append("  (asking the run again…)", "yellow")
    return out


def _frame(out: Text, frame: Frame, mark: bool = False) -> None:
    out.append(f"\n  {'▶' if mark else ' '} ")
    out.append(frame.func, "bold" if frame.own else "")
    out.append(f"  {at(frame)}", "cyan" if frame.own else "dim")
    if frame.code:
        out.append(f"\n        {frame.code}", "" if frame.own else "dim")


def _thread(out: Text, thread: Thread, training: bool) -> None:
    frames = script_frames(thread.frames) if training else list(thread.frames)
    left = len(thread.frames) - len(frames)
    out.append(f"\n\n {'training thread' if training else 'thread'} {thread.name}", "bold yellow" if training else "bold")
    out.append(" (most recent call last" + (f"; {left} of ptdash's left out)" if left else ")"),
               "dim")
    if not frames:
        out.append("\n    no Python frame (in C code, or not started)", "dim")
    for i, frame in enumerate(frames):
        _frame(out, frame, mark=training and i == len(frames) - 1)


def _rank(out: Text, rank: RankStacks, several: bool) -> None:
    step = f", step {rank.step}" if rank.step is not None else ""
    host = f" on {rank.host}" if rank.host else ""
    head = f"rank {rank.rank} (pid {rank.pid}{host}{step})" if several else f"pid {rank.pid}{host}{step}"
    out.append(f"\n\n{head}: ", "bold")
    if not rank.answered:
        out.append(f"{rank.note or 'no answer'}" + (f"; process {rank.state}" if rank.state else "")
                   + (f", in the kernel at {rank.wchan}" if rank.wchan else ""), "bold red")
        return
    out.append(doing(rank, alone=not several)[1])
    if rank.note:
        out.append(f" ({rank.note})", "dim")
    threads = sorted(rank.threads, key=lambda t: (not t.training, t.ptdash))
    for thread in threads:
        if not thread.ptdash:
            _thread(out, thread, thread.training)
    own = [t for t in threads if t.ptdash]
    if own:
        out.append("\n\n ptdash's own threads:", "dim")
        for t in own:
            top = t.frames[-1] if t.frames else None
            out.append(f"\n   {t.name}: " + (f"{top.func}  {at(top)}" if top else "no Python frame"), "dim")


def body(found: tuple | list, width: int = 100) -> Text:
    """Everything under the title: the sentence, the side by side (several ranks), every thread."""
    ranks = read(list(found))
    if not ranks:
        return Text("No stacks came: the run did not answer.", "dim")
    out = Text()
    sentence = summary(ranks)
    out.append(sentence or "", "bold")
    several = len(ranks) > 1
    if several:
        lines = render(ranks, width=width, all_threads=False)
        if sentence and lines[:1] == [sentence]:
            lines = lines[2:]
        for line in lines:
            out.append("\n" + line, "yellow" if "▶" in line else "dim" if line.endswith(":") else "")
        out.append("\n\n── every thread of each rank ──", "bold")
    for rank in ranks:
        _rank(out, rank, several)
    return out
