"""Metric math against direct computations, on tiny CPU models."""

import copy

import pytest
import torch

from ptdash import metrics


def _grads(seed=0, dtypes=(torch.float32,)):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, shape in enumerate([(7, 3), (3,), (16, 16), (1,), (5, 2, 2)]):
        out.append((torch.randn(shape, generator=g) * (10 ** (i - 2))).to(dtypes[i % len(dtypes)]))
    return out


@pytest.mark.parametrize("dtypes", [(torch.float32,), (torch.float32, torch.float64), (torch.bfloat16, torch.float32)])
def test_total_norm_is_bit_identical_to_torch(dtypes):
    grads = _grads(dtypes=dtypes)
    per, total = metrics.grad_norms(grads)
    expected = torch.nn.utils.get_total_norm(grads)
    assert total.dtype == expected.dtype and torch.equal(total, expected)
    direct = torch.stack([torch.linalg.vector_norm(g).float() for g in grads])
    assert torch.equal(per, direct)  # per-tensor, in the caller's order


def test_clip_through_our_norms_equals_clip_grad_norm():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    twin = copy.deepcopy(model)
    x = torch.randn(16, 4)
    model(x).pow(2).sum().backward()
    twin(x).pow(2).sum().backward()
    ref = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.1)
    params = list(model.parameters())
    per, total = metrics.grad_norms([p.grad for p in params])
    metrics.clip_with_norm(params, 0.1, total)
    assert torch.equal(total, ref)
    for a, b in zip(params, twin.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_update_ratio_matches_explicit_copies():
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(4, 10)).sum().backward()
    opt.step()
    after = [p.detach() for p in model.parameters()]
    ratios = metrics.update_ratio(before, after)
    for r, b, a in zip(ratios, before, after):
        assert torch.isclose(r, (a - b).norm() / b.norm(), rtol=1e-6)


def test_snapshot_of_small_parameters_copies_them_whole_outside_autograd():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)])
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    exact_before = [p.detach().clone() for p in params]
    assert torch.is_grad_enabled()  # where the optimizer's pre-step hooks run
    before = metrics.snapshot(params)
    assert all(b.grad_fn is None and not b.requires_grad for b in before)
    assert all(b.data_ptr() != p.data_ptr() for b, p in zip(before, params))  # copies, not views
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    ratios = metrics.update_ratio(before, metrics.ratio_samples(params))
    for r, b, p in zip(ratios, exact_before, params):
        assert torch.isclose(r, (p.detach() - b).norm() / b.norm(), rtol=1e-6)


def test_update_ratio_of_a_large_parameter_is_estimated_from_a_bounded_sample():
    torch.manual_seed(0)
    big, small = torch.nn.Parameter(torch.randn(512, 1024)), torch.nn.Parameter(torch.randn(64))
    opt = torch.optim.SGD([big, small], lr=0.1)
    exact_before = [big.detach().clone(), small.detach().clone()]
    samples = metrics.ratio_samples([big, small])
    assert samples[0].numel() <= metrics.RATIO_SAMPLE < big.numel() and samples[1].numel() == small.numel()
    before = torch._foreach_mul(samples, 1.0)  # what the hooks copy: 1/8 of the big weight
    big.grad, small.grad = torch.randn_like(big), torch.randn_like(small)
    opt.step()
    ratios = metrics.update_ratio(before, metrics.ratio_samples([big, small]))
    exact = [float((p.detach() - b).norm() / b.norm()) for p, b in zip((big, small), exact_before)]
    assert float(ratios[1]) == pytest.approx(exact[1], rel=1e-6)  # small: compared whole
    assert float(ratios[0]) == pytest.approx(exact[0], rel=0.02)  # big: a strided sample


def test_empty_grad_list():
    per, total = metrics.grad_norms([])
    assert per.numel() == 0 and total.item() == 0.0
