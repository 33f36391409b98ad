"""bf16-true-kahan and bf16-true-sr under DDP, on ranks whose global random streams differ (as in scripts that seed
by rank): Kahan summation is deterministic and keeps the replicas equal; stochastic rounding would not, so it is refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit import Engine

pytest.importorskip("optimi", reason="Requires: torch-optimi (pip install -e '.[lowbit]')")


def _model(rank: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Linear(8, 1, bias=False).to(device)  # one shape: torchao compiles its step per shape
    torch.manual_seed(100 + rank)  # each rank its own random stream from here on
    return model


def _train(model: nn.Module, engine: Engine, rank: int, device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(2, 4, 8, generator=g)[rank].to(device)  # this rank's rows
        engine.backward(model(x).float().pow(2).mean())
        engine.step()
    return [p.detach().clone() for p in engine.models[0].parameters()]


def _kahan_then_sr(rank: int, device: torch.device) -> dict:
    engine = Engine("bf16-true-kahan", strategy="ddp")
    model = _model(rank, device)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    params = _train(model, engine, rank, device)
    refusal = ""
    other = _model(rank, device)
    try:
        Engine("bf16-true-sr", strategy="ddp").setup(other, torch.optim.AdamW(other.parameters(), lr=1e-3))
    except ValueError as e:
        refusal = str(e)
    return {"params": params, "refusal": refusal}


@pytest.mark.slow
def test_kahan_replicas_stay_equal_and_stochastic_rounding_is_refused(run_ranks, world) -> None:
    results = run_ranks(_kahan_then_sr)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0]["params"], other["params"], strict=True))
    for r in results:
        assert ("drift apart" in r["refusal"]) == (world > 1)


def _sr_without_the_refusal(rank: int, device: torch.device) -> list[torch.Tensor]:
    from torchao.optim import _AdamW

    model = _model(rank, device).bfloat16()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = _AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, bf16_stochastic_round=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(2, 4, 8, generator=g)[rank].to(device).bfloat16()
        ddp(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow
def test_why_stochastic_rounding_is_refused_the_replicas_drift_apart(run_ranks, world) -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    if world < 2:
        pytest.skip("Requires: 2 ranks (the CPU pass's gloo ranks)")
    results = run_ranks(_sr_without_the_refusal)
    assert not all(torch.equal(a, b) for a, b in zip(results[0], results[1], strict=True))
