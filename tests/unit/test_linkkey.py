"""The link key: from the environment or a 0600 file of this user's, made atomically by the
first node; unsafe files and short keys are refused with the reason."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ptdash.shared import linkkey
from ptdash.shared.linkkey import LinkKeyError, load_key


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(linkkey.ENV, raising=False)
    return tmp_path / "config" / "ptdash" / "link.key"


def test_the_first_node_makes_a_0600_key_and_the_next_reads_the_same(home):
    key = load_key()
    assert len(key) == 32 and home.exists()
    assert oct(home.stat().st_mode & 0o777) == "0o600"
    assert oct(home.parent.stat().st_mode & 0o777) == "0o700"
    assert load_key(create=False) == key


def test_nodes_starting_together_end_with_one_key(home):
    code = "from ptdash.shared.linkkey import load_key; print(load_key().hex())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "XDG_CONFIG_HOME": str(home.parents[1])}) for _ in range(6)]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(keys) == 1 and bytes.fromhex(keys.pop()) == load_key(create=False)
    assert [p.name for p in home.parent.iterdir()] == ["link.key"]  # no temporary file left


def test_a_missing_key_is_not_made_when_told_not_to(home):
    with pytest.raises(LinkKeyError, match="does not exist"):
        load_key(create=False)


def test_the_environment_wins_and_must_be_long_enough(home, monkeypatch):
    monkeypatch.setenv(linkkey.ENV, "ab" * 16)
    assert load_key() == bytes.fromhex("ab" * 16) and not home.exists()
    monkeypatch.setenv(linkkey.ENV, "ab" * 8)
    with pytest.raises(LinkKeyError, match="at least 32"):
        load_key()
    monkeypatch.setenv(linkkey.ENV, "not hex at all, not hex at all!!")
    with pytest.raises(LinkKeyError, match="not hexadecimal"):
        load_key()


def test_a_key_file_others_can_read_or_replace_is_refused(home):
    load_key()
    home.chmod(0o644)
    with pytest.raises(LinkKeyError, match="chmod 600"):
        load_key()
    home.chmod(0o600)
    home.parent.chmod(0o777)
    with pytest.raises(LinkKeyError, match="can be written by others"):
        load_key()
    home.parent.chmod(0o700)
    target = home.with_name("elsewhere")
    home.rename(target)
    home.symlink_to(target)
    with pytest.raises(LinkKeyError, match="not a regular file"):
        load_key()
