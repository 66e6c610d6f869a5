"""``ptdash.log`` through the real CLI: values at the step in progress, or at a step given."""

from __future__ import annotations

import torch

from ptdash.shared import names
from ptdash.shared.reader import StoreReader
from support.runner import ptdash

SCRIPT = """\
import ptdash, torch
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 13):
    opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()
    ptdash.log(now=float(step))                                   # this step's record
    if step % 4 == 0:                                             # an evaluation of 2 steps ago
        ptdash.log(step=step - 2, val=torch.tensor(step / 100))
    if step == 6:
        ptdash.log(step=torch.tensor(1), first=1.5)               # an int tensor is a step too
    ptdash.log(step="x", bad=float(step))                         # a mistake: said once, kept
ptdash.log(test_acc=0.75)                                         # after the loop: at the last step
"""


def test_values_given_a_step_are_stored_at_it_and_a_bad_step_is_said_once(tmp_path):
    (tmp_path / "logs.py").write_text(SCRIPT)
    result = ptdash("--headless", "--run-dir", "run", "logs.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    with StoreReader(tmp_path / "run" / "metrics.db") as store:
        # Given after a step's update, a value is the next step's (the step in progress); after
        # the last update there is no next step: a name the last step holds keeps its value.
        assert store.series(names.user("now")) == (list(range(2, 13)), [float(s) for s in range(1, 12)])
        steps, values = store.series(names.user("val"))
        assert steps == [2, 6, 10] and values == [torch.tensor(s / 100).item() for s in (4, 8, 12)]  # float32
        assert store.series(names.user("first")) == ([1], [1.5])
        assert store.series(names.user("bad"))[0] == list(range(2, 13))  # at the step in progress
        assert store.series(names.user("test_acc")) == ([12], [0.75])
        warned = [e.message for e in store.events(kind="warning") if e.message.startswith("ptdash.log")]
    assert warned == ["ptdash.log: step must be an int, not str; the values are kept at the step in progress"]
