"""The engine under FSDP2 on the pass's ranks (two gloo ranks on the CPU, one NCCL rank on CUDA): matches DDP, skips
together on a shard's inf, clips by the global norm."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ampkit import Engine

ROWS = 8

# Every test here compares FSDP's gradients or updates with DDP's or with the single-process ones.
pytestmark = pytest.mark.usefixtures("fsdp_trains_correctly")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), Block(32), Block(32), nn.LayerNorm(32), nn.Linear(32, 5)).to(device)


def _batches(steps: int, world: int, device: torch.device):
    g = torch.Generator().manual_seed(1)  # drawn on the CPU: every device sees the same values
    batches = [(torch.randn(world * ROWS, 12, generator=g), torch.randint(0, 5, (world * ROWS,), generator=g)) for _ in range(steps)]
    return [(x.to(device), y.to(device)) for x, y in batches]


def _full(p: torch.Tensor) -> torch.Tensor:
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone().float()


def _train(rank: int, device: torch.device, strategy: str, precision: str, steps: int = 4, inf_at: int | None = None, accumulate: int = 1) -> dict:
    model = _model(device)
    world = dist.get_world_size()
    engine = Engine(precision, strategy=strategy, clip_grad_norm=0.5, accumulate=accumulate)
    model, _opt = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    out = {"norms": [], "skipped": [], "scales": []}
    for step, (x, y) in enumerate(_batches(steps, world, device)):
        x, y = x[rank * ROWS : (rank + 1) * ROWS], y[rank * ROWS : (rank + 1) * ROWS]
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        if step == inf_at and rank == world - 1:
            # After the reduce-scatter: only the last rank's shard of one gradient holds the overflow.
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


@pytest.mark.parametrize("spec, rtol", [("32-true", 1e-5), ("{half}-mixed", 1e-2), ("{half}-true-masters", 5e-2)], ids=["32-true", "half-mixed", "half-true-masters"])
def test_fsdp_matches_ddp(run_ranks, device, half_dtype, spec, rtol):
    precision = spec.format(half="16" if half_dtype == torch.float16 else "bf16")  # fp16 with loss scaling on CUDA
    fsdp = run_ranks(_train, "fsdp", precision)[0]
    ddp = run_ranks(_train, "ddp", precision)[0]
    assert bool(fsdp["sharded"]) and not bool(ddp["sharded"])
    torch.testing.assert_close(torch.stack(fsdp["norms"]), torch.stack(ddp["norms"]), rtol=rtol, atol=0, equal_nan=True)  # global norm, not a shard's
    start = {n: p.float() for n, p in _model(device).named_parameters()}
    for name, want in ddp["params"].items():
        moved = (want - start[name]).norm()
        assert (fsdp["params"][name] - want).norm() <= rtol * max(moved, 1e-3 * want.norm()), name


def test_an_inf_in_one_ranks_shard_skips_the_step_on_every_rank(run_ranks):
    results = run_ranks(_train, "fsdp", "16-mixed", 3, 1)
    for r in results:
        assert [bool(s) for s in r["skipped"]] == [False, True, False]
        assert [float(s) for s in r["scales"]] == [2.0**16, 2.0**15, 2.0**15]
        for name, p in results[0]["params"].items():
            assert torch.equal(p, r["params"][name])


def test_deferred_reduction_over_a_window_equals_reducing_every_micro_batch(run_ranks):
    from ampkit.distributed import FSDP

    eager = run_ranks(_train, "fsdp", "32-true", 4, None, 2)[0]
    lazy = run_ranks(_train, FSDP(reduce_every_micro_batch=False), "32-true", 4, None, 2)[0]
    for name, p in eager["params"].items():
        torch.testing.assert_close(lazy["params"][name], p, rtol=1e-5, atol=1e-6)


def _fsdp_params(rank: int, device: torch.device, compile_spec: object) -> dict:
    model = _model(device)
    engine = Engine("bf16-mixed" if device.type == "cpu" else "16-mixed", strategy="fsdp", compile=compile_spec)
    model, _opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for x, y in _batches(3, dist.get_world_size(), device):
        x, y = x[rank * ROWS : (rank + 1) * ROWS], y[rank * ROWS : (rank + 1) * ROWS]
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()
    return {"params": {n: _full(p) for n, p in engine.models[0].named_parameters()}, "compiled": torch.tensor(len(engine.compiled))}


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_fsdp_with_regional_compile_matches_fsdp_without(run_ranks):
    """fully_shard first, then each block compiled (what torch recommends for FSDP2): FSDP's hooks stay outside
    the compiled blocks, and with aot_eager (the captured graph run unfused) the run ends bitwise where the eager
    one does."""
    compiled = run_ranks(_fsdp_params, {"backend": "aot_eager", "regional": True})[0]
    eager = run_ranks(_fsdp_params, None)[0]
    assert int(compiled["compiled"]) == 2 and int(eager["compiled"]) == 0  # the two Blocks
    assert compiled["params"].keys() == eager["params"].keys()
    assert all(torch.equal(compiled["params"][n], eager["params"][n]) for n in eager["params"])
