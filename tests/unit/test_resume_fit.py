"""Whether a checkpoint fits the script's objects is decided before anything is loaded,
and said in one line: names missing or unexpected, shapes that differ, states refused."""

from __future__ import annotations

import pytest
import torch

from ptdash.checkpoint_format import CheckpointError, apply, build, misfit


def test_a_fitting_state_has_no_misfit():
    model = torch.nn.Linear(10, 10)
    assert misfit(model.state_dict(), torch.nn.Linear(10, 10).state_dict()) is None


def test_names_and_shapes_that_differ_are_listed_in_one_line():
    saved = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 2)).state_dict()
    live = torch.nn.Sequential(torch.nn.Linear(10, 4)).state_dict()
    text = misfit(saved, live)
    assert text == ("2 unexpected (1.weight, 1.bias); 0.weight is 10x10 in the checkpoint, 4x10 in the model; "
                    "0.bias is 10 in the checkpoint, 4 in the model")
    many = {f"p{i}": torch.zeros(1) for i in range(6)}
    assert misfit({}, many) == "6 missing (p0, p1, p2 and 3 more)"


def test_apply_refuses_another_model_before_changing_anything():
    source = torch.nn.Linear(10, 10)
    ckpt = build(5, [source], [], [], [], {})
    other = torch.nn.Linear(10, 3)
    before = other.weight.detach().clone()
    with pytest.raises(CheckpointError, match="does not fit the script's model Linear: "):
        apply(ckpt, [other], [], [], [])
    assert torch.equal(other.weight, before)


def test_a_refused_optimizer_state_is_one_line():
    model = torch.nn.Linear(10, 10)
    ckpt = build(5, [model], [torch.optim.SGD(model.parameters(), lr=0.1)], [], [], {})
    live = torch.nn.Linear(10, 10)
    two_groups = torch.optim.SGD([{"params": [live.weight]}, {"params": [live.bias]}], lr=0.1)
    with pytest.raises(CheckpointError) as caught:
        apply(ckpt, [live], [two_groups], [], [])
    assert str(caught.value).startswith("its optimizer state does not fit the script's: ")
    assert "\n" not in str(caught.value)


def test_one_model_of_another_class_name_is_loaded_when_its_parameters_fit():
    class Net(torch.nn.Linear):
        pass

    source = torch.nn.Linear(4, 4)
    ckpt = build(5, [source], [], [], [], {})
    live = Net(4, 4)
    restored, warnings = apply(ckpt, [live], [], [], [])
    assert warnings == ["model Net loaded from the checkpoint's Linear"]
    assert restored[0] == "model Net"
    assert torch.equal(live.weight, source.weight)
