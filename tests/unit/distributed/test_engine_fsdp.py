"""The engine under FSDP2 on two gloo ranks: matches DDP, skips together on a shard's inf, clips by the global norm."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit import Engine

ROWS = 8


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), Block(32), Block(32), nn.LayerNorm(32), nn.Linear(32, 5))


def _batches(steps: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2 * ROWS, 12, generator=g), torch.randint(0, 5, (2 * ROWS,), generator=g)) for _ in range(steps)]


def _full(p: torch.Tensor) -> torch.Tensor:
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone().float()


def _train(rank: int, strategy: str, precision: str, steps: int = 4, inf_at: int | None = None, accumulate: int = 1) -> dict:
    model = _model()
    engine = Engine(precision, strategy=strategy, clip_grad_norm=0.5, accumulate=accumulate)
    model, opt = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    out = {"norms": [], "skipped": [], "scales": []}
    for step, (x, y) in enumerate(_batches(steps)):
        x, y = x[rank * ROWS : (rank + 1) * ROWS], y[rank * ROWS : (rank + 1) * ROWS]
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        if step == inf_at and rank == 1:
            # After the reduce-scatter: only rank 1's shard of one gradient holds the overflow.
            grad = next(p for p in model.parameters() if p.grad is not None).grad
            local = grad._local_tensor if hasattr(grad, "_local_tensor") else grad
            local.view(-1)[0] = float("inf")
        if engine.step():
            out["norms"].append(torch.tensor(engine.grad_norm if not engine.step_was_skipped else float("nan")))
            out["skipped"].append(torch.tensor(engine.step_was_skipped))
            out["scales"].append(torch.tensor(engine.scale if engine.scale is not None else 0.0))
    out["params"] = {n: _full(p) for n, p in engine.models[0].named_parameters()}
    out["sharded"] = torch.tensor(type(next(model.parameters())).__name__ == "DTensor")
    return out


@pytest.mark.parametrize("precision, rtol", [("32-true", 1e-5), ("bf16-mixed", 1e-2), ("bf16-true-masters", 5e-2)])
def test_fsdp_matches_ddp(run_ranks, precision, rtol):
    fsdp, _ = run_ranks(_train, "fsdp", precision)
    ddp, _ = run_ranks(_train, "ddp", precision)
    assert bool(fsdp["sharded"]) and not bool(ddp["sharded"])
    torch.testing.assert_close(torch.stack(fsdp["norms"]), torch.stack(ddp["norms"]), rtol=rtol, atol=0)  # global norm, not a shard's
    start = {n: p.float() for n, p in _model().named_parameters()}
    for name, want in ddp["params"].items():
        moved = (want - start[name]).norm()
        assert (fsdp["params"][name] - want).norm() <= rtol * max(moved, 1e-3 * want.norm()), name


def test_an_inf_in_one_ranks_shard_skips_the_step_on_every_rank(run_ranks):
    r0, r1 = run_ranks(_train, "fsdp", "16-mixed", 3, 1)
    assert [bool(s) for s in r0["skipped"]] == [bool(s) for s in r1["skipped"]] == [False, True, False]
    assert [float(s) for s in r0["scales"]] == [float(s) for s in r1["scales"]] == [2.0**16, 2.0**15, 2.0**15]
    for name, p in r0["params"].items():
        assert torch.equal(p, r1["params"][name])


def test_deferred_reduction_over_a_window_equals_reducing_every_micro_batch(run_ranks):
    from ampkit.distributed import FSDP

    eager, _ = run_ranks(_train, "fsdp", "32-true", 4, None, 2)
    lazy, _ = run_ranks(_train, FSDP(reduce_every_micro_batch=False), "32-true", 4, None, 2)
    for name, p in eager["params"].items():
        torch.testing.assert_close(lazy["params"][name], p, rtol=1e-5, atol=1e-6)
