"""Strategies' own checks: FSDP is refused where the running torch's collectives would train it wrongly, and the
version flag behind that refusal matches what gloo really does."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ampkit import Engine, _compat


def _gloo_reduce_scatter_average(rank: int, device: torch.device) -> dict:
    x = torch.full((4,), float(rank + 1))  # rank r sends r+1 everywhere: the average over two ranks is 1.5
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG)
    return {"out": out}


def test_the_gloo_flag_matches_what_gloo_computes(run_ranks, device, world):
    if device.type != "cpu":
        pytest.skip("about gloo, the CPU's backend")
    out = run_ranks(_gloo_reduce_scatter_average)[0]["out"]
    expected = 1.5 if _compat.GLOO_REDUCE_SCATTER_AVERAGES else 3.0  # the average, or the sum this torch returns
    assert torch.equal(out, torch.full((2,), expected)), f"torch {torch.__version__}: got {out.tolist()}"


def _setup_fsdp_where_it_would_train_wrongly(rank: int, device: torch.device) -> dict:
    from ampkit.distributed import _strategy as strategy

    strategy.fsdp_problem = lambda device_type, world_size: f"no FSDP on {device_type} with {world_size} ranks"
    model = nn.Linear(4, 4).to(device)
    engine = Engine(strategy="fsdp")
    try:
        engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    except RuntimeError as exc:
        return {"raised": str(exc), "sharded": type(model.weight).__name__ == "DTensor"}
    return {"raised": "", "sharded": type(model.weight).__name__ == "DTensor"}


def test_fsdp_setup_refuses_before_sharding_where_the_torch_would_train_it_wrongly(run_ranks, device, world):
    for result in run_ranks(_setup_fsdp_where_it_would_train_wrongly):
        assert result["raised"] == f"no FSDP on {device.type} with {world} ranks"
        assert not result["sharded"]
