"""``ptdash fork``'s command line: its own words apart from the run options, the parent's options carried over."""

from __future__ import annotations

import dataclasses

import pytest

from ptdash.shared.config import RunConfig, RunInfo
from ptdash.tui import cli
from ptdash.tui.fork import _split, inherited

PARSER = cli._run_parser()
TAKES_VALUE = {o for a in PARSER._actions if a.nargs != 0 and a.option_strings for o in a.option_strings}


def test_the_forks_own_words_are_told_from_run_options_wherever_they_stand():
    own, options = _split(["--lr-scale", "0.5", "RUN", "--at", "30", "--headless", "--clip=2", "--from=x.pt"],
                          TAKES_VALUE)
    assert own == ["RUN", "--at", "30", "--from=x.pt"]
    assert options == ["--lr-scale", "0.5", "--headless", "--clip=2"]
    # A run option's value is never taken for RUN, even one that looks like a name.
    assert _split(["--name", "halved", "RUN"], TAKES_VALUE) == (["RUN"], ["--name", "halved"])


@pytest.mark.parametrize("config", [
    RunConfig(),
    RunConfig(checkpoint_every=25, keep_last=3, on_anomaly="skip", steps=900, update_ratio_every=0,
              overhead_budget=2.5, stall_seconds=30.0, flush_interval=0.125, detect_anomaly=True,
              memory_history=True, parse_output=False),
    RunConfig(checkpoint_every_s=1800.0),
])
def test_the_parents_options_carry_over_but_for_the_live_settings_and_start_only_ones(config):
    parent = dataclasses.replace(config, clip=0.5, lr_scale=0.1, profile_steps=(3, 4), pause_timeout=60.0,
                                 resume="/old.pt")
    info = RunInfo(id="abc", name="p", run_dir="/r", socket="/s", config=parent, nproc_per_node=2)
    args = PARSER.parse_args(inherited(info))
    assert args.nproc_per_node == 2
    assert args.clip is None and args.lr_scale is None and args.profile_steps is None and args.resume is None
    every = {"checkpoint_every": config.checkpoint_every} if config.checkpoint_every else \
        {"checkpoint_every_s": config.checkpoint_every_s} if config.checkpoint_every_s else {}
    if config.checkpoint_every:
        assert args.checkpoint_every == ("steps", config.checkpoint_every)
    elif config.checkpoint_every_s:
        assert args.checkpoint_every == ("seconds", config.checkpoint_every_s)
    else:
        assert args.checkpoint_every is None
    again = RunConfig(keep_last=args.keep_last, on_anomaly=args.on_anomaly, steps=args.steps,
                      update_ratio_every=args.update_ratio_every, overhead_budget=args.overhead_budget,
                      stall_seconds=args.stall_timeout, flush_interval=args.flush_interval,
                      detect_anomaly=args.detect_anomaly, memory_history=args.memory_history,
                      parse_output=args.parse_output, **every)
    assert again == config
