"""A policy family of this file's own, added without touching any ampkit package, trains: in one process (against a
hand-written loop of the same recipe) and under FSDP2 on the pass's ranks (against the same family under DDP).

The family is a recipe no built-in policy has: the whole model in bf16 (no fp32 islands), fp32 master weights, a
static loss scale of 256, and under FSDP the fp32 shards as the masters, gathered in bf16, gradients reduced in
fp32, outputs left in bf16 as on one device. It states its description and overrides the parts that differ; the engine, the strategies and FSDP's setup
ask it for the rest (its masters, its scaler, its FSDP mixed precision, its casts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from ampkit import Engine
from ampkit.policy import Policy
from ampkit.scaling import StaticLossScaler

ROWS, SCALE, LR = 8, 256.0, 0.05


@dataclass(frozen=True, kw_only=True)
class Bf16StaticScale(Policy):
    """bf16 weights everywhere, fp32 masters, a static loss scale of 256."""

    name: str = "test-bf16-static-scale"
    param_dtype: ClassVar[torch.dtype] = torch.bfloat16
    master_weights: ClassVar[bool] = True
    description: ClassVar[str] = "bf16 weights everywhere, fp32 masters, static loss scale 256 (a test's own family)"

    def converted_modules(self, module: nn.Module) -> list[nn.Module]:
        return list(module.modules())

    def convert_module(self, module: nn.Module, device_type: str) -> None:
        for t in [*module.parameters(), *module.buffers()]:
            if t.is_floating_point():
                t.data = t.data.to(torch.bfloat16)  # .data: the optimizers' parameters stay the same objects

    def default_scaler(self) -> StaticLossScaler:
        return StaticLossScaler(SCALE)

    def fsdp_mixed_precision(self, root: bool = False) -> MixedPrecisionPolicy:
        # Outputs stay bf16 under FSDP as on one device (the built-in master policies return fp32 at the root).
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def prepare_for_sharding(self, module: nn.Module, device_type: str) -> list[tuple[str, nn.Module]]:
        return []  # the fp32 shards are the masters: nothing is cast, FSDP gathers them in bf16


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 5)).to(device)


def _batches(steps: int, world: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(world * ROWS, 12, generator=g).to(device), torch.randint(0, 5, (world * ROWS,), generator=g).to(device)) for _ in range(steps)]


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y)


def test_the_family_trains_in_one_process_as_its_recipe_written_by_hand() -> None:
    device = torch.device("cpu")
    engine = Engine(Bf16StaticScale())
    model = _model(device)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=LR))
    # The parts the family built: its masters (every parameter, fp32) and its scaler.
    assert engine.scale == SCALE and engine.skip_nonfinite
    assert len(engine.masters) == 6 and all(m.dtype == torch.float32 for m in engine.masters.masters)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())

    # The recipe by hand: bf16 model, fp32 masters stepped by SGD on the unscaled fp32 gradients, copied back.
    control = _model(device)
    masters = [p.detach().clone() for p in control.parameters()]
    control.to(torch.bfloat16)
    opt = torch.optim.SGD(masters, lr=LR)
    for x, y in _batches(3, 1, device):
        with engine.autocast():
            loss = _loss(model, x, y)
        engine.backward(loss)
        engine.step()
        (_loss(control, x, y) * SCALE).backward()
        for m, p in zip(masters, control.parameters()):
            m.grad = p.grad.float() / SCALE
            p.grad = None
        opt.step()
        with torch.no_grad():
            for m, p in zip(masters, control.parameters()):
                p.copy_(m)
    for got, want in zip(engine.masters.masters, masters):
        assert torch.equal(got, want)
    for got, want in zip(model.parameters(), control.parameters()):
        assert torch.equal(got, want)
    assert engine.steps == 3 and engine.skipped_steps == 0


def _train(rank: int, device: torch.device, strategy: str) -> dict:
    world = dist.get_world_size()
    engine = Engine(Bf16StaticScale(), strategy=strategy)
    model = _model(device)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=LR))
    outputs = []
    for x, y in _batches(3, world, device):
        x, y = x[rank * ROWS : (rank + 1) * ROWS], y[rank * ROWS : (rank + 1) * ROWS]
        with engine.autocast():
            out = model(x.to(torch.bfloat16))
            outputs.append(out.dtype == torch.bfloat16)
            loss = nn.functional.cross_entropy(out.float(), y)
        engine.backward(loss)
        engine.step()
    first = next(engine.models[0].parameters())
    # The fp32 weights the run steps: under DDP the masters (the bf16 model is their rounding), under FSDP the shards.
    params = engine.masters.state_dict() if engine.masters is not None else {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for n, p in engine.models[0].named_parameters()
    }
    return {
        "params": params,
        "scale": torch.tensor(engine.scale),
        "sharded_fp32": torch.tensor(type(first).__name__ == "DTensor" and first.dtype == torch.float32),
        "masters": torch.tensor(engine.masters is not None),
        "bf16_out": torch.tensor(all(outputs)),
    }


@pytest.mark.usefixtures("fsdp_trains_correctly")
def test_the_family_trains_under_fsdp_as_under_ddp(run_ranks, device: torch.device) -> None:
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip("Requires: [CUDA bf16]")
    fsdp = run_ranks(_train, "fsdp")[0]
    ddp = run_ranks(_train, "ddp")[0]
    # Under FSDP the family's mixed precision carries it: fp32 shards (the masters), no separate master copy.
    assert bool(fsdp["sharded_fp32"]) and not bool(fsdp["masters"]) and bool(ddp["masters"])
    assert float(fsdp["scale"]) == float(ddp["scale"]) == SCALE
    assert bool(fsdp["bf16_out"]) and bool(ddp["bf16_out"])  # the family's FSDP setting, not the built-ins' fp32 root
    start = {n: p.detach().float() for n, p in _model(device).named_parameters()}
    for name, want in ddp["params"].items():
        moved = (want - start[name]).norm()
        assert moved > 0, name
        # Both are fp32 masters; DDP averages bf16 gradients, FSDP reduces them in fp32: within bf16's rounding of the move.
        assert fsdp["params"][name].dtype == want.dtype == torch.float32, name
        assert (fsdp["params"][name] - want).norm() <= 2e-2 * moved, name
