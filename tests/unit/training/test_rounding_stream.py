"""bf16-true-sr's rounding stream: its own, seeded by what the script seeded, kept by checkpoints, sharded by mesh
coordinates. The replicas' agreement under DDP is tests/unit/distributed/test_lowbit_ddp.py's subject."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.training._rounding_stream import _shard_coordinates

REGION = {"backend": "aot_eager"}  # no inductor compile: the first step runs eagerly anyway


def _rng_states(device: torch.device) -> list[torch.Tensor]:
    """The global CPU generator's state and, on CUDA, the device's: torchao draws from the weights' device's."""
    return [torch.get_rng_state()] + ([torch.cuda.get_rng_state(device)] if device.type == "cuda" else [])


def _sr_run(device: torch.device, steps: int, seed: int, inf_at: int | None = None) -> tuple[Engine, list[torch.Tensor], list[torch.Tensor]]:
    """``steps`` bf16-true-sr steps after ``torch.manual_seed(seed)``; the engine, and the global generators' states
    (:func:`_rng_states`) before and after them."""
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    torch.manual_seed(seed)
    model = nn.Linear(16, 8).to(device)
    engine = Engine("bf16-true-sr", fused_step=REGION, skip_nonfinite=inf_at is not None)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    gen = torch.Generator().manual_seed(1)
    before = _rng_states(device)
    for i in range(steps):
        loss = model(torch.randn(4, 16, generator=gen).to(device, torch.bfloat16)).float().square().mean()
        engine.backward(loss * float("inf") if i == inf_at else loss)
        engine.step()
    return engine, before, _rng_states(device)


def test_the_rounding_leaves_the_scripts_random_stream_as_it_was(device: torch.device) -> None:
    # torchao draws its bits from the global generator: without a stream of its own, the next dropout mask would
    # depend on how many weights the optimizer rounded.
    engine, before, after = _sr_run(device, 2, seed=3)
    assert len(before) == len(after) and all(torch.equal(b, a) for b, a in zip(before, after))  # on CUDA, the GPU's too
    assert engine.rounding is not None and engine.rounding.draws == 2


def test_the_stream_is_seeded_by_the_scripts_seed_counts_taken_steps_and_is_saved(device: torch.device) -> None:
    engine, _, _ = _sr_run(device, 4, seed=5, inf_at=1)
    assert engine.step_was_skipped is False and engine.skipped_steps == 1
    assert engine.state_dict()["rounding"] == {"seed": 5, "draws": 3}  # the skipped step drew nothing
    assert Engine("bf16-true").state_dict()["rounding"] is None


@dataclass
class _Place:
    shard: bool

    def is_shard(self) -> bool:
        return self.shard


class _Mesh:
    def __init__(self, *coordinates: int) -> None:
        self.coordinates = coordinates

    def get_local_rank(self, dim: int) -> int:
        return self.coordinates[dim]


def _sharded(mesh: _Mesh, *shard: bool) -> nn.Parameter:
    """A parameter that answers as a DTensor does: its mesh and its placement on each mesh dimension."""
    p = nn.Parameter(torch.zeros(2))
    p.device_mesh, p.placements = mesh, tuple(_Place(s) for s in shard)  # type: ignore[attr-defined]
    return p


def _opt(*params: nn.Parameter) -> torch.optim.Optimizer:
    return torch.optim.SGD(list(params), lr=0.1)


def test_shards_take_their_coordinates_on_the_sharding_mesh_dimensions_and_replicas_none() -> None:
    assert _shard_coordinates([_opt(nn.Parameter(torch.zeros(2)))]) == ()  # DDP: every rank a replica
    assert _shard_coordinates([_opt(_sharded(_Mesh(1), True))]) == (1,)  # FSDP: rank 1's shard
    hsdp = _Mesh(1, 3)  # replica group 1, shard 3: replicas of shard 3 share its bits
    assert _shard_coordinates([_opt(_sharded(hsdp, False, True), _sharded(hsdp, False, True))]) == (3,)
    # Sharded on meshes that give different coordinates: no one key fits them all, and the shared stream is safe.
    assert _shard_coordinates([_opt(_sharded(_Mesh(1), True), nn.Parameter(torch.zeros(2)))]) == ()
