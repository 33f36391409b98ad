"""bench's peak and activations are ampkit memory's: the same window (setup and two steps), the FLOP count outside it.

The FLOP count once ran inside bench's peak window: with activation checkpointing the peak came out half again
above ``ampkit memory``'s measured one, so "Memory saved" said checkpointing costs memory.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ampkit.bench import BenchData, bench_model
from ampkit.memory import measure


class _Checkpointed(nn.Module):
    """Two blocks run under non-reentrant checkpointing, as ``model.gradient_checkpointing_enable()`` runs them."""

    def __init__(self, recompute: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(2))
        self.head, self.recompute = nn.Linear(32, 4), recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.recompute else block(x)
        return self.head(x)


def _bench_and_measure(recompute: bool) -> tuple[dict[str, int], dict[str, int]]:
    torch.manual_seed(0)
    model = _Checkpointed(recompute)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 32, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(2)]
    run = bench_model(model, BenchData(train=batches), "32-true", steps=3, warmup=2, rounds=1, device="cpu").runs[0]
    # ampkit memory's step on the same model, batch, optimizer (bench's default) and clip; held batch, as memory holds it.
    m = measure(model, batches[0], lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, fused=True), "32-true", clip_grad_norm=1.0)
    # bench keeps each step's loss (an fp32 scalar, 4 bytes) for its loss curve: the first one lives through the second.
    return ({"peak": run.peak_memory_bytes, "activations": run.activation_bytes, "flops": int(run.flops_per_step > 0)},
            {"peak": m.peak + 4, "activations": m.activations, "flops": 1})


def test_bench_peak_with_checkpointing_equals_memory_measured_step_exactly() -> None:
    bench, memory = _bench_and_measure(recompute=True)
    assert bench == memory  # to the byte: one definition (StepPeak) over the same window; and FLOPs were counted


def test_bench_peak_without_checkpointing_equals_memory_too() -> None:
    bench, memory = _bench_and_measure(recompute=False)
    assert bench == memory
