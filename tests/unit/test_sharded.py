"""What the flush reads of DTensors (engine/sharded.py): a replicated one's value, a partial
one's None, and nothing that would be a collective on the flusher thread."""

from __future__ import annotations

import subprocess
import sys

from support.runner import ENV

_SNIPPET = r"""
import math, os, tempfile
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
from ptdash.recorder import _to_host
from ptdash.sharded import is_dtensor, is_sharded, local
mesh = init_device_mesh("cpu", (1,))
replicated = DTensor.from_local(torch.tensor(2.5), mesh, [Replicate()])
partial = DTensor.from_local(torch.tensor(4.0), mesh, [Partial()])
calls = []
real = dist.all_reduce
dist.all_reduce = lambda *a, **k: calls.append(a) or real(*a, **k)
values = _to_host([torch.tensor(1.5), replicated, partial])
param = torch.nn.Parameter(DTensor.from_local(torch.ones(3), mesh, [Replicate()]))
print(values[:2], math.isnan(values[2]), calls, is_dtensor(replicated), is_sharded([param]),
      is_sharded([torch.nn.Parameter(torch.ones(3))]), type(local([param])[0]).__name__)
"""


def test_the_flush_reads_a_replicated_dtensor_and_records_a_partial_one_as_missing():
    out = subprocess.run([sys.executable, "-c", _SNIPPET], capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "[1.5, 2.5] True [] True True False Tensor"
