"""torch's flight recorder, read with a rank's stacks.

Each process group records its collectives in a ring buffer whose size torch reads from
``TORCH_FR_BUFFER_SIZE`` (or ``TORCH_NCCL_TRACE_BUFFER_SIZE``) when the group is made; 0 is off.
NCCL's groups record in a recorder of their own (its entries hold CUDA events), dumped by a call
of its own: on an H200 (torch 2.11) the first call's dump held none of a NCCL group's entries and
NCCL's held them all. ``read`` takes both and reads them as one.
torch 2.13 keeps 2000 by default (measured here); older releases may keep none (not tried here).
ptdash sets neither: the recorder is the one torch or the user made (a job's own dumps on a
timeout keep their history). ``read`` takes the newest entries per group
(``_dump_fr_trace_json``, a copy of the whole buffer made under its lock, then its JSON read
with the GIL held), on ptdash's thread that takes the stacks (stacks.py), only when stacks are
asked for or a stall takes them: a full 2000 cost 32 ms of a rank's CPU here, 256 cost 3 ms
(benchmarks/flight_cost.py). Anything that goes wrong reads as a ``Flight`` with a note,
never as an error of the take.
"""

from __future__ import annotations

import json
import os
import sys

from .shared.flight import KEEP, NO_GROUP, Entry, Flight, Group

BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
def _int(value, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _entry(raw: dict) -> Entry:
    group = raw.get("process_group") or ["", ""]
    return Entry(group=str(group[0]), desc=str(group[1]) if len(group) > 1 else "",
                 seq=_int(raw.get("collective_seq_id"), 0), op=str(raw.get("profiling_name", "")),
                 sizes=tuple(tuple(_int(d, 0) for d in s) for s in raw.get("input_sizes") or () if isinstance(s, list)),
                 dtypes=tuple(map(str, raw.get("input_dtypes") or ())), state=str(raw.get("state", "")),
                 retired=raw.get("retired") is True, p2p=raw.get("is_p2p") is True,
                 p2p_seq=_int(raw.get("p2p_seq_id"), 0), created_ns=_int(raw.get("time_created_ns"), 0))


def _order(raw: dict) -> tuple:
    p2p = raw.get("is_p2p") is True
    return p2p, _int(raw.get("p2p_seq_id" if p2p else "collective_seq_id"), 0), _int(raw.get("time_created_ns"), 0)


def parse(dump: dict, keep: int = KEEP) -> Flight:
    """The newest ``keep`` entries of each group and the groups' counters, from the recorder's JSON
    (the entries chosen from the raw dicts: a full buffer may hold thousands, and a few are kept)."""
    by_group: dict[str, list[dict]] = {}
    names = {}
    for raw in dump.get("entries") or ():
        if isinstance(raw, dict):
            group = str((raw.get("process_group") or [""])[0])
            by_group.setdefault(group, []).append(raw)
            names[str(raw.get("pg_id"))] = group
    newest = [_entry(raw) for group in by_group.values() for raw in sorted(group, key=_order)[-keep:]]
    newest.sort(key=lambda e: e.created_ns)
    groups = tuple(Group(group=names.get(pg, pg), enqueued=_int(s.get("last_enqueued_collective")),
                         started=_int(s.get("last_started_collective")),
                         completed=_int(s.get("last_completed_collective")))
                   for pg, s in sorted((dump.get("pg_status") or {}).items()) if isinstance(s, dict))
    return Flight(entries=tuple(newest), groups=groups)


DUMPERS = ("_dump_fr_trace_json", "_dump_nccl_trace_json")  # gloo's and the CPU backends'; NCCL's own


def _dumps() -> list[dict]:
    """Every recorder's dump this torch can make: NCCL keeps a recorder of its own (CUDA events),
    read by its own call; a build without NCCL has only the first."""
    import torch._C._distributed_c10d as c10d

    dumpers = [getattr(c10d, name) for name in DUMPERS if hasattr(c10d, name)]
    if not dumpers:
        raise ImportError("no flight recorder")
    return [d for d in (json.loads(dump(True, False)) for dump in dumpers) if isinstance(d, dict)]


def merged(dumps: list[dict]) -> dict:
    """The dumps as one: their entries (an entry two dumps both hold counted once) and groups."""
    seen, entries, status = set(), [], {}
    for dump in dumps:
        for raw in dump.get("entries") or ():
            if not isinstance(raw, dict):
                continue  # parse reads dicts alone
            key = (str(raw.get("pg_id")), raw.get("is_p2p"), raw.get("collective_seq_id"), raw.get("p2p_seq_id"),
                   raw.get("time_created_ns"))
            if key not in seen:
                seen.add(key)
                entries.append(raw)
        status.update(dump.get("pg_status") or {})
    return {"entries": entries, "pg_status": status}


def read(keep: int = KEEP) -> Flight:
    """This process's flight recorders now: their newest entries per group, or a note why none."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return Flight(note=NO_GROUP)
    try:
        flight = parse(merged(_dumps()), keep)
    except ImportError:
        return Flight(note="this torch has no flight recorder")
    except Exception as exc:  # noqa: BLE001 - the stacks are taken all the same
        return Flight(note=f"the flight recorder could not be read: {type(exc).__name__}: {exc}")
    if not flight.entries and not flight.groups:
        size = next((os.environ[n] for n in BUFFER_ENV if n in os.environ), None)
        return Flight(note=f"the flight recorder is off ({BUFFER_ENV[0]}={size})" if size == "0"
                      else "the flight recorder holds nothing")
    return flight
