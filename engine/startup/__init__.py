"""The interpreter start-up hook that finds the ranks ptdash did not start itself.

This folder goes first on the run's ``PYTHONPATH``, so every Python process of the run
(``mp.spawn`` children, a framework re-executing the interpreter for its ranks, DataLoader
workers, helpers) imports its ``sitecustomize``. That module only arranges that when
``torch.distributed`` is imported, ``init_process_group`` is wrapped: a process that
joins a process group is a rank, and its engine starts when the call returns
(``ptdash.rankstart``). A process that never calls it (a DataLoader worker, a helper) is
left alone and costs nothing more than the import of this small file.
"""

from pathlib import Path

STARTUP_DIR = Path(__file__).resolve().parent
