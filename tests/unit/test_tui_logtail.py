"""Following output.log: only complete lines, the tail of a long file, progress bars, truncation."""

from __future__ import annotations

from ptdash.tui.source.logtail import LogTail


def test_log_tail_follows_lines(tmp_path):
    path = tmp_path / "output.log"
    tail = LogTail(path, max_bytes=20)
    assert tail.read() == []
    path.write_bytes(b"a line that is long\nsecond\nthi")
    assert tail.read() == ["second"]  # only the last 20 bytes, first partial line dropped
    with open(path, "ab") as f:
        f.write(b"rd\nprogress 10%\rprogress 50%\r\n")
    assert tail.read() == ["third", "progress 50%"]
    path.write_bytes(b"new\n")  # truncated and rewritten
    assert tail.read() == ["new"]
    with open(path, "ab") as f:
        f.write("caf\u00e9 \xff\n".encode("utf-8") + b"\xff\n")
    assert tail.read() == ["café ÿ", "\ufffd"]
