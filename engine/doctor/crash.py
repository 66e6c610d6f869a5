"""Reading a crash: autograd's in-place error, DDP's unused-parameter error."""

from __future__ import annotations

import re

_INPLACE = re.compile(r"modified by an inplace operation: \[(?P<tensor>.+?)\], which is output (?P<output>\d+) "
                      r"of (?P<node>\w+), is at version (?P<version>\d+); expected version (?P<expected>\d+)")
UNUSED_PARAMS_ERROR = "Expected to have finished reduction in the prior iteration"
"""DistributedDataParallel's error when some parameters got no gradient."""


def parse_inplace(text: str) -> dict | None:
    """The parts of autograd's 'modified by an inplace operation' error, or None."""
    if "modified by an inplace operation" not in text:
        return None
    m = _INPLACE.search(text)
    return m.groupdict() if m else {}


def inplace_finding(inplace: dict, source: str | None, forward: str | None, base_fix: str) -> tuple[str, str]:
    """(what, fix) of an ``inplace-autograd`` finding; ``forward`` is the forward op's line
    when anomaly mode named it."""
    from .sources import quoted

    saved = (f"{inplace['tensor']}, output {inplace['output']} of {inplace['node']}, at version "
             f"{inplace['version']} instead of {inplace['expected']}") if inplace else "a saved tensor"
    what = (f"backward() at {quoted(source)} failed: a tensor it needed ({saved}) was modified by an in-place "
            "operation" + (f"; it was saved by the forward op at {quoted(forward)}" if forward else ""))
    fix = base_fix + ("" if forward else (
        "; to name the forward op, rerun with `ptdash --detect-anomaly ...` (or call "
        "torch.autograd.set_detect_anomaly(True) at the top of the script)"))
    return what, fix
