"""The series-name grammar (ptdash.shared.names): builders, parsers, and that nothing else spells it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ptdash.shared import names

ROOT = Path(__file__).resolve().parents[2]


def test_optimizer_series_round_trip():
    assert names.of_optimizer(0, names.LOSS) == "loss"
    assert names.of_optimizer(2, names.GRAD_NORM) == "opt2/grad/norm_total"
    assert names.optimizer_of("opt2/grad/norm_total") == (2, "grad/norm_total")
    assert names.optimizer_of("loss/micro_batches") == (0, "loss/micro_batches")
    assert names.optimizer_of(names.lr(0, 3)) == (0, "lr/group3")
    assert names.optimizer_of(names.lr(1, 0)) == (1, "lr/group0")


def test_lr_names_round_trip_and_order():
    assert names.lr(0, 0) == "opt/lr/group0"
    assert names.lr(3, 12) == "opt3/lr/group12"
    for index, group in [(0, 0), (0, 7), (1, 0), (12, 3)]:
        assert names.parse_lr(names.lr(index, group)) == (index, group)
    for other in ["loss", "opt/lr", "opt0/lr/group0", "opt/lr/groupx", "xopt/lr/group0", "opt/lr/group0/x"]:
        assert names.parse_lr(other) is None, other
    shuffled = ["opt1/lr/group0", "loss", "opt/lr/group10", "opt/lr/group2", "opt2/lr/group0", "opt/lr/group0"]
    assert names.lr_names(shuffled) == ["opt/lr/group0", "opt/lr/group2", "opt/lr/group10", "opt1/lr/group0",
                                        "opt2/lr/group0"]


def test_others_finds_every_other_optimizers_series_in_order():
    series = ["loss", "opt10/loss", "opt2/loss", "opt2/grad/norm_total", "opt2/loss/micro_batches", "user/opt3/loss"]
    assert names.others(series, names.LOSS) == [(2, "opt2/loss"), (10, "opt10/loss")]


def test_gpu_user_and_export_names():
    assert names.parse_gpu(names.gpu(3, "mem_allocated_bytes")) == (3, "mem_allocated_bytes")
    assert names.parse_gpu("gpux/mem") is None and names.parse_gpu("host/rss_bytes") is None
    assert names.parse_user(names.user("val_loss")) == "val_loss"
    assert names.parse_user("loss") is None
    assert names.ranked(0, "loss") == "loss" and names.ranked(3, "loss") == "rank3/loss"
    assert names.layer("fc.weight", "grad_norm") == "layer/fc.weight/grad_norm"


def test_printed_names_and_their_splits():
    assert names.printed("val_loss") == "printed/val_loss"
    assert names.parse_printed(names.printed("val_loss")) == "val_loss" and names.parse_printed("user/x") is None
    assert names.split_of("val_loss") == ("val", "loss")
    assert names.split_of("test_average_loss") == ("test", "loss")
    assert names.split_of("train/loss_step") == ("train", "loss_step")
    assert names.split_of("valid ppl") == ("valid", "ppl")
    assert names.split_of("loss") == (None, "loss") and names.split_of("avg_loss") == (None, "loss")
    assert names.split_of("average") == (None, "average") and names.split_of("val") == (None, "val")
    assert names.held_out("eval_accuracy") and names.held_out("test_average_loss")
    assert not names.held_out("train_loss") and not names.held_out("loss") and not names.held_out("top1")


# A series name as the grammar spells it: any of these, whole, in a string literal outside
# names.py is a name written out again.
_SERIES = re.compile(
    r"opt\d*/loss|(opt\d*/)?(loss/micro_batches|grad/(norm_total|clip_max|clipped)|lr/group\d*)"
    r"|time/\w+_s|throughput/\w+|host/\w+|gpu\d*/\w+|ptdash/\w+_(pct|every)|user/\w+|printed/\w+|opt\d*/"
    r"|opt/lr/group|layer/")
# f-strings, with each replacement field as {}: the spellings that build a name by pieces.
_BUILT = re.compile(r"(opt|gpu|rank)\{\}/.*|(host|user|printed|layer|ptdash|time|grad)/\{\}.*")
LOOKUPS = {"get", "stats", "series", "sampled", "latest", "sample"}
"""Calls whose first argument is a series name (``values.get("loss")``): the bare word ``loss``
is a series there, in a subscript and in an ``in`` test; elsewhere it is a word (a chart's id)."""


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
    return out


def _looked_up(tree: ast.AST) -> set[int]:
    """The string constants used as a series is: a lookup's first argument, a subscript, ``x in``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in LOOKUPS:
                out.update(id(a) for a in node.args[:2])
        elif isinstance(node, ast.Subscript):
            out.add(id(node.slice))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            out.add(id(node.left))
    return out


def _spellings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    lookups = _looked_up(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            shape = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if _BUILT.fullmatch(shape):
                found.append((node.lineno, shape))
            skip.update(id(v) for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if _SERIES.fullmatch(node.value) or (node.value == "loss" and id(node) in lookups):
                found.append((node.lineno, node.value))
    return found


def _sources() -> list[Path]:
    return sorted(p for half in ("engine", "tui") for p in (ROOT / half).rglob("*.py")
                  if p != ROOT / "engine/shared/names.py" and "demo" not in p.parts)


def test_series_names_are_spelled_only_in_names_py():
    spelled = [f"{p.relative_to(ROOT)}:{line}: {text!r}" for p in _sources() for line, text in _spellings(p)]
    assert not spelled, "series names spelled outside engine/shared/names.py:\n" + "\n".join(spelled)


@pytest.mark.parametrize("source, caught", [
    ('x = values.get("grad/norm_total")', True),
    ('x = f"opt{k}/lr/group{g}"', True),
    ('x = f"gpu{i}/{metric}"', True),
    ('x = "host/rss_bytes"', True),
    ('x = f"step {n}: loss {v}"', False),
    ('x = "loss spike"', False),
    ('x = state.series.get("loss")', True),
    ('x = values["loss"]', True),
    ('x = "loss" in values', True),
    ('x = latest(state, "loss")', True),
    ('x = {"loss": 1.0}', False),
    ('"""The loss chart: ``grad/norm_total``."""', False),
])
def test_the_walk_catches_a_name_written_out(tmp_path, source, caught):
    path = tmp_path / "m.py"
    path.write_text(source + "\n")
    assert bool(_spellings(path)) is caught
