"""The hub gathers every rank's stacks: on demand (a ``stacks`` command) and at a stall.

A rank in the hub's process is taken here; each rank in another process is asked over its
rank link's data connection, and its engine's link thread answers (link.py), never its
training thread. A rank that does not answer in ``ANSWER_SECONDS`` is named as such, with
its last reported step and its process's state and kernel wait channel from /proc (a rank on
this machine; on another node, as that node's ptdash launcher reads it, nodeport.py). The gathering runs on a thread of its own: the dashboards' server and the
flusher never wait for it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable

from .shared.protocol import Stacks
from .shared.stacks import ANSWER_SECONDS, RankStacks, fit, process_state

log = logging.getLogger("ptdash.stacks")


class StackGatherer:
    """``gather()`` every rank's stacks (JSON objects by rank); ``request(id)`` publishes them
    as a ``Stacks`` message. ``local()`` takes this process's; ``ranks`` (the hub's collector)
    knows each rank's last step and takes the stacks at a stall; ``controls`` hands it the
    ``stacks`` commands."""

    def __init__(self, hub, local: Callable[[], dict], publish: Callable, ranks, controls,
                 nodes: Callable[[], object] = lambda: None) -> None:
        self._hub, self._local, self._publish, self._steps = hub, local, publish, ranks.steps
        self._nodes = nodes
        """The hub's port for the other nodes (nodeport.py), once open; None on one node."""
        self._cond = threading.Condition()
        self._answers: dict[int, dict[int, dict]] = {}
        self._ids = itertools.count(1)
        hub.on_stacks = self._answered
        ranks.stacks, controls.on_stacks = self.gather, self.request

    def request(self, cmd_id: str) -> None:
        """Gather on a thread of its own and publish the result with the command's id."""
        threading.Thread(target=self._serve, args=(cmd_id,), name="ptdash-stacks", daemon=True).start()

    def _serve(self, cmd_id: str) -> None:
        try:
            ranks = self.gather()
        except Exception:  # noqa: BLE001 - a failed gathering must not take a thread of the hub down
            log.exception("could not gather the ranks' stacks")
            ranks = []
        self._publish(Stacks(id=cmd_id, ranks=ranks, wall=time.time()))

    def gather(self, timeout: float = ANSWER_SECONDS) -> list[dict]:
        """Every rank's stacks, by rank; the ranks that did not answer in ``timeout`` say why."""
        infos = self._hub.rank_infos()
        if not infos:
            return [self._local()]  # one process: no rank registered
        req = next(self._ids)
        with self._cond:
            self._answers[req] = {}
        out: dict[int, dict] = {}
        asked = []
        for info in infos:
            if info.local:
                out[info.rank] = {**self._local(), "rank": info.rank}
            elif info.connections > 0 and self._hub.ask(info.rank, {"stacks": req}):
                asked.append(info.rank)
        deadline = time.monotonic() + timeout
        with self._cond:
            while not set(asked) <= set(self._answers[req]):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            answers = self._answers.pop(req)
        steps = self._steps()
        remote = self._remote_states([i for i in infos if i.rank not in out and i.rank not in answers and i.host])
        for info in infos:
            if info.rank in out:
                continue
            if info.rank in answers:
                out[info.rank] = {**answers[info.rank], "rank": info.rank, "host": info.host}
                continue
            state, wchan = remote.get((info.node, info.pid), ("", "")) if info.host else process_state(info.pid)
            if info.rank not in asked:
                note = "its rank link is closed" if info.connections <= 0 else "it could not be asked"
            else:
                note = f"no answer in {timeout:.0f} s: its interpreter is busy (C code holding the GIL?)"
                if state.startswith("T"):
                    note = "no answer: its process is stopped (SIGSTOP or a debugger)"
            out[info.rank] = RankStacks(rank=info.rank, pid=info.pid, host=info.host, step=steps.get(info.rank),
                                        answered=False, note=note, state=state, wchan=wchan,
                                        wall=time.time()).to_data()
        return fit([out[r] for r in sorted(out)])

    def _remote_states(self, silent: list) -> dict[tuple[int, int], tuple[str, str]]:
        """The /proc state of ranks on other nodes that did not answer, as their nodes' launchers
        read it (a job of several ``ptdash --nnodes``; none under the user's own torchrun)."""
        port = self._nodes()
        if not silent or port is None:
            return {}
        by_node: dict[int, list[int]] = {}
        for info in silent:
            by_node.setdefault(info.node, []).append(info.pid)
        try:
            return port.proc_states(by_node)
        except Exception:  # noqa: BLE001 - the ranks are named without it
            log.exception("could not ask the other nodes for their ranks' state")
            return {}

    def _answered(self, rank: int, frame: dict) -> None:
        """A rank's answer (its link thread at the hub)."""
        req, result = frame.get("stacks"), frame.get("result")
        if not isinstance(result, dict):
            return
        with self._cond:
            if req in self._answers:
                self._answers[req][rank] = result
                self._cond.notify_all()
