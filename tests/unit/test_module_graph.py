"""The shape of the source tree: no import circles, no module-level ``__getattr__``, no
module over MAX_LINES lines.

Every ``import`` and ``from ... import`` in engine/ and tui/ is an edge, wherever it sits
(a function's lazy import and a ``TYPE_CHECKING`` one too: each still says which module is
the lower layer). A circle means two modules each lean on the other, and hides which is
below; a module ``__getattr__`` is how such a circle is usually papered over.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (("ptdash.tui", ROOT / "tui"), ("ptdash", ROOT / "engine"))
MAX_LINES = 400
"""A module does one thing; past this many lines it does several (STYLE.md): split it by
what it does, not by moving lines to a mixin or a helper of the same class."""


def modules(packages=PACKAGES) -> dict[str, Path]:
    """Every module's dotted name, and its file."""
    out: dict[str, Path] = {}
    for package, base in packages:
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.setdefault(".".join([package, *parts]), path)
    return out


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = node.module or ""
    if node.level:
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the tree it imports."""
    out: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(name, path, node, known):
                    while target and target not in known:  # a name inside a module: the module
                        target = target.rpartition(".")[0]
                    if target and target != name:
                        out[name].add(target)
    return out


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert circles(graph(modules())) == []


def test_no_module_defines_a_module_level_getattr():
    defined = [str(path.relative_to(ROOT)) for path in modules().values()
               if any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
                      for node in ast.parse(path.read_text()).body)]
    assert defined == []


def test_no_module_is_over_the_line_limit():
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in modules().values()}
    assert {path: n for path, n in lines.items() if n > MAX_LINES} == {}
    assert len(lines) > 100 and "engine/hooks.py" in lines  # the walk sees the whole tree


def test_the_walk_finds_a_circle_through_a_lazy_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\nx = 1\n")
    (pkg / "d.py").write_text("from . import c\n")
    known = modules((("pkg", pkg),))
    assert circles(graph(known)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
