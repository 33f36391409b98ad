"""largest_batch(): the answer fits and one more sample does not, checked against estimate() itself."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.memory import estimate
from ampkit.memory.fit import largest_batch, parse_bytes, resize_batch


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


@pytest.mark.parametrize("budget_mib", [3, 40, 700])
def test_few_estimates_and_the_same_answer_as_a_scan(budget_mib: int, monkeypatch):
    """The secant guess plus bracket needs a handful of estimates; its answer is the boundary a scan finds."""
    from ampkit.memory import fit as fit_module

    model, batch = _mlp()
    calls: list[int] = []
    real = fit_module.estimate

    def counting(model, batch, *args, **kwargs):
        calls.append(batch[0].shape[0])
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(fit_module, "estimate", counting)
    budget = budget_mib * 2**20
    found = largest_batch(model, batch, budget=budget).batch_size
    assert len(calls) <= 14, calls
    peaks = {n: real(model, resize_batch(batch, n), device="cpu").peak for n in (found, found + 1)}
    assert peaks[found] <= budget < peaks[found + 1]


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
