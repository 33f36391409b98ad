"""bench_model: the Python side of ``ampkit bench --model --data``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.bench import bench_model


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)]


def test_a_bad_tolerance_is_refused_as_the_cli_refuses_it() -> None:
    from ampkit.bench import BenchData

    data = BenchData(train=batches(3), eval=batches(1))
    with pytest.raises(ValueError, match="tolerance"):
        bench_model(nn.Linear(8, 3), data, "bf16", steps=3, warmup=1, rounds=1, device="cpu", tolerance=-0.5)


def test_the_tolerance_decides_within() -> None:
    from ampkit.bench import BenchData

    data = BenchData(train=batches(4), eval=batches(2))
    strict = bench_model(nn.Linear(8, 3), data, "bf16", steps=4, warmup=1, rounds=1, device="cpu", tolerance=0.0)
    loose = bench_model(nn.Linear(8, 3), data, "bf16", steps=4, warmup=1, rounds=1, device="cpu", tolerance=10.0)
    assert strict.runs[1].eval_metric != strict.runs[0].eval_metric  # bf16 lands elsewhere, so 0 tolerance excludes it
    assert strict.runs[1].within_tolerance is False
    assert loose.runs[1].within_tolerance is True
