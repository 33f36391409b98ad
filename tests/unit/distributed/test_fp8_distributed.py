"""fp8-tensorwise under FSDP2 (weights all-gathered in fp8) and DDP, on the pass's ranks: the sharded run computes
what the replicated one does. Emulated on the CPU (gloo); fp8 against bf16 is tested in one process
(tests/unit/policy/test_fp8.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ampkit import Engine

pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[fp8]')")

ROWS, WIDTH = 16, 32

pytestmark = pytest.mark.usefixtures("fsdp_trains_correctly")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.gelu(self.fc(self.norm(x)))


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, WIDTH), Block(), Block(), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 16)).to(device)


def _policy(device: torch.device, precision: str):
    from ampkit.policy import FP8Tensorwise

    return FP8Tensorwise(emulate=device.type == "cpu", layers="all") if precision == "fp8" else precision


def _train(rank: int, device: torch.device, strategy: str, precision: str, steps: int = 4) -> dict:
    world = dist.get_world_size()
    engine = Engine(_policy(device, precision), strategy=strategy, clip_grad_norm=1.0)
    model = _model(device)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(world * ROWS, 16, generator=g), torch.randint(0, 16, (world * ROWS,), generator=g)
        x, y = x[rank * ROWS : (rank + 1) * ROWS].to(device), y[rank * ROWS : (rank + 1) * ROWS].to(device)
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach())
    weight = engine.models[0][0].weight
    local = weight._local_tensor if hasattr(weight, "_local_tensor") else weight
    return {
        "losses": torch.stack(losses),
        "params": {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone().float() for n, p in engine.models[0].named_parameters()},
        "fp8_gather": torch.tensor(type(local).__name__ == "WeightWithDynamicFloat8CastTensor"),
    }


def _both(rank: int, device: torch.device) -> dict:
    return {"fsdp": _train(rank, device, "fsdp", "fp8"), "ddp": _train(rank, device, "ddp", "fp8")}


def test_fsdp_gathers_fp8_weights_and_matches_ddp(run_ranks, device: torch.device) -> None:
    runs = run_ranks(_both)[0]
    fsdp, ddp = runs["fsdp"], runs["ddp"]
    assert bool(fsdp["fp8_gather"]) and not bool(ddp["fp8_gather"])
    # The sharded weight's scale comes from the whole weight's amax (an all-reduce), so the fp8 weights FSDP gathers
    # are the ones DDP casts: the runs differ only by the order of the gradient sums.
    start = {n: p.float() for n, p in _model(device).named_parameters()}
    for name, want in ddp["params"].items():
        moved = (want - start[name]).norm()
        assert moved > 0 and (fsdp["params"][name] - want).norm() <= 1e-3 * moved, name
    torch.testing.assert_close(fsdp["losses"], ddp["losses"], rtol=1e-4, atol=0)
