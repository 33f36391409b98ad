"""The recommended loss scale against a direct cast: the scaled gradients fit fp16, twice the scale does not."""

from __future__ import annotations

import pytest
import torch

from ampkit.numerics._scale import NO_GRADIENT_LOG2, largest_safe_log2, recommend_loss_scale
from ampkit.numerics._stats import StatsAccumulator


@pytest.mark.parametrize("seed", range(5))
def test_scale_is_the_largest_power_of_two_that_casts_finitely(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    grads = torch.randn(4000, generator=g) * torch.pow(10.0, torch.empty(1).uniform_(-9, 2, generator=g))
    acc = StatsAccumulator(rounding=False)
    acc.update(grads)
    advice = recommend_loss_scale(acc.summary())
    top = grads.abs().max().double()
    assert top * 2.0**advice.log2 <= 65504 < top * 2.0 ** (advice.log2 + 1)
    assert torch.isfinite((grads.double() * 2.0**advice.log2).half()).all()
    flushed = ((grads.abs() < 2.0**-24) & (grads != 0)).float().mean().item()
    assert advice.underflow_unscaled == pytest.approx(flushed)
    assert advice.underflow_scaled <= advice.underflow_unscaled


def test_boundaries_are_exact() -> None:
    assert largest_safe_log2(65504.0) == 0
    assert largest_safe_log2(65504.0 * 2**-20) == 20
    assert largest_safe_log2(65504.0 * (1 + 2**-40)) == -1
    assert largest_safe_log2(0.0) == NO_GRADIENT_LOG2
    with pytest.raises(ValueError, match="not finite"):
        largest_safe_log2(float("inf"))
