"""The wheel carries both halves, the stylesheet and the demo's corpus."""

import subprocess
import sys
import zipfile

from support.runner import REPO


def test_wheel_contains_both_halves_and_data(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("ptdash-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("ptdash/__init__.py", "ptdash/protocol.py", "ptdash/bootstrap.py", "ptdash/tui/cli.py",
                     "ptdash/tui/app.py", "ptdash/tui/app.tcss", "ptdash/tui/widgets/__init__.py",
                     "ptdash/demo/train.py", "ptdash/demo/corpus.txt"):
        assert required in names, required
    assert not any(n.startswith(("tests/", "engine/", "tui/")) for n in names)
    # Installed from the wheel alone (no source tree on the path), the CLI starts.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-c", "import ptdash.tui.cli as c, ptdash.demo, ptdash;"
                          "print(c.__file__); c.main(['--version'])"],
                         cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert str(target) in out.stdout and "ptdash 0.1.0" in out.stdout
