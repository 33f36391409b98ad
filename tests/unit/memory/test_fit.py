"""largest_batch(): the answer fits and one more sample does not, checked against estimate() itself."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from ampkit.memory import estimate
from ampkit.memory._fit import largest_batch, parse_bytes, resize_batch


def _mlp() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 10)), (torch.randn(4, 256), torch.randint(0, 10, (4,)))


@pytest.mark.parametrize("policy", ["32-true", "bf16-mixed", "bf16-true-masters"])
def test_the_answer_fits_and_the_next_size_does_not(policy: str):
    model, batch = _mlp()
    budget = 64 * 2**20
    fit = largest_batch(model, batch, policy=policy, budget=budget)
    assert fit.batch_size > 1 and not fit.limit_reached
    # Checked independently: fresh estimates at the answer and one above.
    assert estimate(model, resize_batch(batch, fit.batch_size), policy=policy, device="cpu").peak <= budget
    assert estimate(model, resize_batch(batch, fit.batch_size + 1), policy=policy, device="cpu").peak > budget


def _control_search(peak_at, budget: int) -> int:
    """Plain doubling then bisection on the estimates themselves: the answer the fast search must reproduce."""
    if peak_at(1) > budget:
        return 0
    low, high = 1, 2
    while peak_at(high) <= budget:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if peak_at(mid) <= budget else (low, mid)
    return low


def _counting(monkeypatch: pytest.MonkeyPatch, peak=None) -> list[int]:
    """Count the estimates largest_batch makes (batch sizes, in order); ``peak(n)`` replaces the estimate's peak."""
    from ampkit.memory import _fit as fit_module

    calls: list[int] = []
    real = fit_module.estimate

    def counting(model, batch, *args, **kwargs):
        calls.append(batch[0].shape[0])
        if peak is None:
            return real(model, batch, *args, **kwargs)
        n = batch[0].shape[0]
        return types.SimpleNamespace(peak=peak(n), activations=peak(n) // 2, batch=n)  # only what the search reads

    monkeypatch.setattr(fit_module, "estimate", counting)
    return calls


@pytest.mark.parametrize(("budget_mib", "most"), [(12, 5), (700, 5), (3, 9)])
def test_few_estimates_and_the_same_answer_as_a_bisection(budget_mib: int, most: int, monkeypatch: pytest.MonkeyPatch):
    """Where activations hold the peak it is affine in the batch: a guess, its neighbour, the line's answer and its
    neighbour. At 3 MiB the answer sits where fixed temporaries stop holding the peak: a second line is needed."""
    model, batch = _mlp()
    calls = _counting(monkeypatch)
    budget = budget_mib * 2**20
    found = largest_batch(model, batch, budget=budget).batch_size
    assert len(calls) <= most, calls
    peak = lambda n: estimate(model, resize_batch(batch, n), device="cpu").peak
    if budget_mib < 100:
        assert found == _control_search(peak, budget)
    else:  # a control search would take 2 log2(55,000) estimates; the boundary it would find is this one
        assert peak(found) <= budget < peak(found + 1)


def test_a_peak_that_is_not_affine_falls_back_to_bisection(monkeypatch: pytest.MonkeyPatch):
    model, batch = _mlp()
    quadratic = lambda n: 10**6 + 37 * n * n  # no line holds anywhere
    calls = _counting(monkeypatch, quadratic)
    budget = 3 * 10**9
    fit = largest_batch(model, batch, budget=budget, limit=2**20)
    assert fit.batch_size == _control_search(quadratic, budget) and not fit.limit_reached
    assert len(calls) <= 30, calls


def test_bf16_fits_a_larger_batch_than_fp32():
    model, batch = _mlp()
    fp32 = largest_batch(model, batch, policy="32-true", budget=32 * 2**20).batch_size
    bf16 = largest_batch(model, batch, policy="bf16-mixed", budget=32 * 2**20).batch_size
    assert bf16 > 1.4 * fp32


def test_nothing_fits_and_the_search_limit():
    model, batch = _mlp()
    assert largest_batch(model, batch, budget=1024).batch_size == 0
    capped = largest_batch(model, batch, budget=2**40, limit=64)
    assert capped.limit_reached and capped.batch_size == 64


def test_memory_sizes_parse_and_bad_ones_name_the_form():
    assert parse_bytes("80GB") == 80 * 10**9 and parse_bytes("24 GiB") == 24 * 2**30 and parse_bytes("512mib") == 2**29
    for bad in ("24XB", "", "GiB", "-1GiB"):
        with pytest.raises(ValueError, match="24GiB, 80GB"):
            parse_bytes(bad)
    with pytest.raises(ValueError, match="positive"):
        largest_batch(nn.Linear(2, 2), (torch.randn(1, 2), torch.zeros(1, dtype=torch.long)), budget=0)


def test_resize_keeps_channels_last():
    x = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    (big,) = resize_batch((x,), 9)
    assert big.shape == (9, 3, 4, 4) and big.is_contiguous(memory_format=torch.channels_last)
