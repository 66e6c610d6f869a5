"""A run's data is its owner's alone: the run dir is 0700 and every file in it 0600
(checkpoints, the store and its WAL, output.log, engine.log, profiles, run.json, the
token), whatever the umask; ``--share-group`` lets one group read, never steer. Checked
on real runs through the real CLI, and by real other users (throwaway accounts made with
useradd when the tests run as root; skipped with the reason otherwise).
"""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

import pytest

from ptdash.shared.reader import StoreReader
from support import users
from support.runner import SCRIPTS, Run, wait_for

STEADY = SCRIPTS / "steady.py"

READ_EACH = """
import sys
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        print("READ", path)
    except OSError as exc:
        print("DENIED", type(exc).__name__, path)
"""

CLI = "import sys; from ptdash.tui.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def others():
    reason = users.skip_reason()
    if reason:
        pytest.skip(reason)
    return users.system_python()


def start_full_run(base: Path, *options: str) -> Run:
    """A run that has written every kind of file: a checkpoint, a profile, the store's WAL.

    Started under umask 000, the most permissive: its modes must not come from the umask.
    """
    old = os.umask(0)
    try:
        run = Run(base, STEADY, "--sleep", "0.01", options=options, run_dir=base / "ptdash-runs" / "mine")
    finally:
        os.umask(old)
    assert run.send("checkpoint").ok
    assert run.send("profile", 2).ok
    wait_for(lambda: list((run.run_dir / "profiles").glob("*.json")), 60, what="the profile's trace")
    wait_for(lambda: any(e.kind == "profile" for e in StoreReader(run.run_dir / "metrics.db").events()), 60,
             what="the profile's report")
    return run


def tree(run_dir: Path) -> tuple[list[Path], list[Path]]:
    dirs, files = [run_dir], []
    for root, subdirs, names in os.walk(run_dir):
        dirs += [Path(root) / d for d in subdirs]
        files += [Path(root) / n for n in names]
    return dirs, files


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def read_each(user: str, python: str, paths: list[Path]) -> dict[str, str]:
    result = users.as_user(user, python, "-c", READ_EACH, *map(str, paths))
    assert result.returncode == 0, result.stderr
    return {line.split()[-1]: line.split()[0] for line in result.stdout.splitlines()}


def test_another_user_can_read_no_file_of_a_run_nor_steer_it(others):
    python = others
    with users.open_base() as base, users.throwaway_user() as intruder, users.ptdash_for_others() as farm:
        run = start_full_run(base)
        try:
            dirs, files = tree(run.run_dir)
            names = {p.name for p in files}
            for expected in ("run.json", "token", "metrics.db", "metrics.db-wal", "output.log", "engine.log"):
                assert expected in names, expected
            assert any(p.parent.name == "checkpoints" for p in files)
            assert any(p.parent.name == "profiles" for p in files)
            assert {str(p): oct(mode(p)) for p in dirs if mode(p) != 0o700} == {}
            assert {str(p): oct(mode(p)) for p in files if mode(p) != 0o600} == {}

            seen = read_each(intruder, python, files + [run.run_dir / "checkpoints"])
            assert set(seen.values()) == {"DENIED"}, seen
            listing = users.as_user(intruder, python, "-c", f"import os; os.listdir({str(run.run_dir)!r})")
            assert listing.returncode != 0 and "PermissionError" in listing.stderr

            env = {"PYTHONPATH": str(farm)}
            named = users.as_user(intruder, python, "-c", CLI, "ctl", str(run.run_dir), "pause", env=env)
            assert named.returncode == 1 and named.stdout == ""
            assert named.stderr.strip().splitlines() == [
                f"ptdash: error: cannot read run {run.run_dir}: permission denied (it is another user's)"]
            # With no RUN, from the directory of the run: nothing of another user's is a candidate.
            bare = users.as_user(intruder, python, "-c", CLI, "ctl", "pause", env=env, cwd=str(base))
            assert bare.returncode == 1, bare.stderr
            assert bare.stderr.strip().splitlines() == ["ptdash: error: no live run (see `ptdash ls`)"]
            assert run.info().status == "running"
            before = run.last_step()
            run.wait_step(before + 3)
        finally:
            run.close()


def test_a_run_shared_with_a_group_is_read_by_it_and_steered_by_its_owner_alone(others):
    python = others
    with users.open_base() as base, users.throwaway_group() as group, users.throwaway_user((group,)) as member, \
            users.throwaway_user() as outsider, users.ptdash_for_others() as farm:
        gid = grp.getgrnam(group).gr_gid
        run = start_full_run(base, "--share-group", group)
        try:
            dirs, files = tree(run.run_dir)
            assert {str(p): oct(mode(p)) for p in dirs if mode(p) != 0o2750} == {}
            token = run.run_dir / "token"
            assert mode(token) == 0o600
            assert {str(p): oct(mode(p)) for p in files if p != token and mode(p) != 0o640} == {}
            assert {os.lstat(p).st_gid for p in dirs + files} == {gid}

            seen = read_each(member, python, files)
            assert seen.pop(str(token)) == "DENIED"
            assert set(seen.values()) == {"READ"}, seen
            assert set(read_each(outsider, python, files).values()) == {"DENIED"}

            steer = users.as_user(member, python, "-c", CLI, "ctl", str(run.run_dir), "pause",
                                  env={"PYTHONPATH": str(farm)})
            assert steer.returncode == 1 and steer.stdout == ""
            assert steer.stderr.strip().splitlines() == [
                f"ptdash: error: cannot read {token}: permission denied (only the run's owner can steer it)"]
            assert run.info().status == "running"
        finally:
            run.close()
