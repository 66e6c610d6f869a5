"""The Overview's grad-norm chart: the total, or a sharded model's local norm where no total is."""

from ptdash.shared import names
from ptdash.shared.protocol import Metrics
from ptdash.tui.state import RunState
from ptdash.tui.tabs import overview
from ptdash.tui.view import ChartView


def _state(rows) -> RunState:
    state = RunState()
    state.add_metrics(Metrics(rows=rows))
    return state


def test_a_sharded_run_with_no_total_draws_rank_0s_shards_norm_said_so():
    state = _state([[s, float(s), {names.LOSS: 1.0, **({names.GRAD_NORM_LOCAL: 0.5 * s} if s % 2 else {})}]
                    for s in range(1, 11)])
    reads = overview.grad_reads(state)
    assert reads[0] == names.GRAD_NORM_LOCAL
    panel = overview.grad(state, ChartView(), reads)
    assert panel.legend.plain == "rank 0's shards 4.5"  # the newest local norm, named as a part


def test_a_total_is_drawn_whenever_there_is_one():
    state = _state([[1, 1.0, {names.GRAD_NORM_LOCAL: 0.5}], [2, 2.0, {names.GRAD_NORM: 2.0}]])
    reads = overview.grad_reads(state)
    assert reads[0] == names.GRAD_NORM
    assert overview.grad(state, ChartView(), reads).legend.plain == "2"
    assert overview.grad(_state([[1, 1.0, {names.LOSS: 1.0}]]), ChartView()).legend.plain == "no gradients yet"
