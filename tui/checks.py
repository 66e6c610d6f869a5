"""What the ``ptdash`` command checks before it creates anything: that the script can run,
that the run dir can be one, that ``-m MODULE`` can be found, that ``--resume`` names a readable ptdash checkpoint.

Each check raises CliError with one line (exit status 2), so a bad option leaves nothing
behind: no run dir, no engine. None of them imports torch or runs the user's code: the
module is looked up the way the engine's ``runpy`` will find it, by the import system's
finders alone (no package ``__init__`` runs), and the checkpoint is read as the zip
archive torch writes, its pickle walked opcode by opcode, never loaded. Whether the
checkpoint fits the script's model is the engine's check, before the script's first step.
"""

from __future__ import annotations

import os
import pickletools
import subprocess
import sys
import zipfile
from importlib.machinery import BuiltinImporter, FrozenImporter, ModuleSpec, PathFinder
from pathlib import Path

from ptdash.shared.private import filesystem_type

from .errors import CliError

KERNEL_FILESYSTEMS = frozenset({"sysfs", "proc", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                                "securityfs", "configfs", "pstore", "bpf", "efivarfs", "mqueue", "fusectl",
                                "binfmt_misc", "autofs", "hugetlbfs"})
"""File systems that hold the kernel's state, not files: a run dir there cannot work."""


def run_dir(path: Path, root: bool = False) -> None:
    """Refuse a ``--run-dir`` (or, with ``root``, the directory runs go in by default) that
    cannot be made or used: a file, a non-empty directory, a place no one can write."""
    try:
        os.fspath(path.absolute()).encode("utf-8")
    except UnicodeEncodeError:
        # run.json, the live-run registry and every reply name the run dir as UTF-8 text.
        shown = os.fsencode(path.absolute()).decode("ascii", "backslashreplace")
        what = "the runs directory" if root else "--run-dir"
        raise CliError(f"{what} {shown} is not a UTF-8 path, which ptdash needs to record it; "
                       f"choose another{'' if root else ' name'}" + (" with --run-dir" if root else ""), 2) from None
    option = f"the runs directory {path}" if root else f"--run-dir {path}"
    try:
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise CliError(f"{option} exists and is not a directory", 2)
            if not root and any(path.iterdir()):
                raise CliError(f"{option} exists and is not empty", 2)
        parent = path
        while not parent.exists():
            parent = parent.parent
    except OSError as exc:
        raise CliError(f"{option}: {exc.strerror or exc}", 2) from None
    if not parent.is_dir():
        raise CliError(f"{option}: {parent} is not a directory", 2)
    fstype = filesystem_type(parent)
    if fstype in KERNEL_FILESYSTEMS:
        raise CliError(f"{option} is on {fstype}, a kernel file system, not a place for a run", 2)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"{option}: cannot create it in {parent} (permission denied)", 2)


def module(name: str) -> None:
    """Refuse ``-m NAME`` unless the engine will find it: on the current directory and
    sys.path (as the engine's ``sys.path`` will be), or through an installed finder."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise CliError(f"-m {name!r} is not a module name", 2)
    spec = _find_top(parts[0])
    for depth in range(2, len(parts) + 1):
        if spec is None or spec.submodule_search_locations is None:
            spec = None
            break
        spec = PathFinder.find_spec(".".join(parts[:depth]), list(spec.submodule_search_locations))
    if spec is None:
        raise CliError(f"no module named {name!r} (looked in the current directory and sys.path)", 2)
    if spec.submodule_search_locations is not None and \
            PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations)) is None:
        raise CliError(f"{name!r} is a package without a __main__ module, so -m cannot run it", 2)


def _find_top(name: str) -> ModuleSpec | None:
    search = [os.getcwd(), *sys.path[1:]]  # the engine puts the cwd first, as `python -m` does
    for finder in sys.meta_path:
        try:
            if finder is PathFinder:
                spec = PathFinder.find_spec(name, search)
            elif finder in (BuiltinImporter, FrozenImporter):
                continue  # a built-in module has no code for runpy to run
            else:  # an installed finder (an editable install's): it maps names, runs nothing
                spec = finder.find_spec(name, None)
        except Exception:  # noqa: BLE001 - a finder that fails has not found it
            continue
        if spec is not None:
            return spec
    return None


def checkpoint(path: Path) -> int | None:
    """Refuse a ``--resume`` file that is missing, unreadable, damaged or not ptdash's; the
    step it was saved at (None if the file does not say where it is expected)."""
    if not path.exists():
        raise CliError(f"checkpoint {path} does not exist", 2)
    if path.is_dir():  # a sharded model's (FSDP): torch.distributed.checkpoint's files and ptdash's own
        if not (path / ".metadata").is_file() or not (path / "ptdash.pt").is_file():
            raise CliError(f"{path} is not a ptdash checkpoint: a directory without the .metadata and ptdash.pt "
                           "of a sharded one", 2)
        return checkpoint(path / "ptdash.pt")
    if not path.is_file():
        raise CliError(f"checkpoint {path} is not a file", 2)
    try:
        with open(path, "rb"):
            pass
        archive = zipfile.ZipFile(path) if zipfile.is_zipfile(path) else None
    except OSError as exc:
        raise CliError(f"cannot read checkpoint {path}: {exc.strerror or exc}", 2) from None
    if archive is None:
        raise CliError(f"checkpoint {path} is unreadable: not a PyTorch checkpoint archive "
                       "(damaged, cut short, or another kind of file)", 2)
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if not pickles:
            raise CliError(f"{path} is not a ptdash checkpoint: a zip archive, but not PyTorch's", 2)
        try:
            data = archive.read(pickles[0])  # checks its CRC
            ops = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
        except Exception as exc:  # noqa: BLE001 - zipfile and pickletools raise many kinds
            raise CliError(f"checkpoint {path} is unreadable: damaged ({str(exc)[:80]})", 2) from None
    strings = [arg for name, arg in ops if isinstance(arg, str) and "UNICODE" in name]
    # ptdash's dict starts with its own "ptdash" entry (checkpoint.build) and names the step.
    if not strings or strings[0] != "ptdash" or "step" not in strings:
        raise CliError(f"{path} is not a ptdash checkpoint (a PyTorch file without ptdash's state)", 2)
    return _saved_step(ops)


INT_OPS = frozenset({"INT", "LONG", "BININT", "BININT1", "BININT2", "LONG1", "LONG4"})
"""The pickle opcodes that push an int (a memo index, BINPUT's, is not one)."""


def _saved_step(ops: list[tuple[str, object]]) -> int | None:
    """The step a ptdash checkpoint was saved at: the int after its first "step" key, which
    is ptdash's own entry's (the optimizers' states come later)."""
    found = False
    for name, arg in ops:
        if found and name in INT_OPS and isinstance(arg, int):
            return arg
        found = found or (arg == "step" and "UNICODE" in name)
    return None


def git_commit(target: list[str]) -> str | None:
    """The commit of the script's repository (recorded in run.json), or None outside one."""
    where = Path(target[0]).resolve().parent if target and target[0] != "-m" else Path.cwd()
    try:
        out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=2)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def target(argv: list[str], module_name: str | None) -> tuple[list[str], str]:
    """The bootstrap's argv (the script or ``-m module_name``, then ``argv``'s rest) and the run
    name; one-line errors for a bad script."""
    if module_name:
        module(module_name)
        return ["-m", module_name, *argv], module_name.rsplit(".", 1)[-1]
    if not argv:
        raise CliError("no script given (usage: ptdash [options] script.py [args...])")
    script = argv[0]
    if script.startswith("-"):
        raise CliError(f"unrecognized option {script}")
    path = Path(script)
    source = path
    if path.is_dir():  # a directory with a __main__.py, as python runs it (a zip is a file)
        source = path / "__main__.py"
        if not source.is_file():
            raise CliError(f"cannot run {script!r}: a directory without a __main__.py", 2)
    elif not path.is_file():
        raise CliError(f"cannot open script {script!r}: no such file", 2)
    if zipfile.is_zipfile(path):
        return list(argv), path.stem
    try:
        compile(source.read_bytes(), str(source) if source is not path else script, "exec")
    except SyntaxError as exc:
        raise CliError(f"syntax error in {exc.filename or script}, line {exc.lineno}: {exc.msg}", 1) from None
    except ValueError as exc:  # source with null bytes
        raise CliError(f"cannot compile {script}: {exc}", 1) from None
    return list(argv), path.stem
