"""One policy's run measured alone: its memory figures against ampkit.memory's control, at any accumulation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.bench.results import BenchResult
from ampkit.bench.runner import run_bench
from ampkit.bench.workload import Workload, default_optimizer
from ampkit.memory import measure

ROWS = 8
POLICIES = ["32-true", "bf16-mixed"]


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    )


def _workload(accumulate: int) -> Workload:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(ROWS, 3, 8, 8, generator=g), torch.randint(0, 4, (ROWS,), generator=g)) for _ in range(4)]
    return Workload(name="cnn", model=_cnn(), train_batches=batches, items_per_batch=ROWS, steps=2, warmup=1, accumulate=accumulate)


@pytest.fixture(scope="module")
def one_micro_batch() -> BenchResult:
    return run_bench(_workload(1), POLICIES, "cpu", rounds=1)


@pytest.mark.parametrize("precision", POLICIES)
def test_cpu_peak_is_the_live_tensor_peak_ampkit_memory_measures(one_micro_batch: BenchResult, precision: str) -> None:
    # One definition for both tools: the most bytes of live tensors during the step. The control is
    # ampkit.memory.measure (what `ampkit memory` predicts to the byte on the CPU) on the same model, batch,
    # optimizer, loss and clipping.
    w, run = _workload(1), one_micro_batch.run(precision)
    control = measure(w.model, w.train_batches[0], default_optimizer, precision, loss_fn=w.loss_fn, clip_grad_norm=w.clip_grad_norm)
    # The bench keeps each step's loss (a 4-byte scalar) for its loss curve: the only bytes it holds beyond the step.
    assert control.peak <= run.peak_memory_bytes <= control.peak + 4 * 2
    assert run.activation_bytes == control.activations


def test_accumulating_micro_batches_multiplies_the_work_not_the_activations_or_peak(one_micro_batch: BenchResult) -> None:
    one = one_micro_batch.run("32-true")
    four = run_bench(_workload(4), ["32-true"], "cpu", rounds=1).runs[0]  # 4 micro-batches like the one
    assert four.activation_bytes == one.activation_bytes  # each backward frees its micro-batch's graph
    # What accumulation does hold: the gradients summed so far live through the next micro-batch's forward and
    # backward, which a single micro-batch's step (gradients set to None after each update) does not. That is
    # the whole tolerance: at most one set of gradients (plus the loss scalars the bench keeps, 4 bytes each).
    gradients = one.memory_breakdown["gradients"]
    assert one.peak_memory_bytes <= four.peak_memory_bytes <= one.peak_memory_bytes + gradients + 4 * 8
    # The work does multiply: a step is K micro-batches, and its FLOPs (and throughput) count all of them.
    assert four.flops_per_step == 4 * one.flops_per_step and four.flops_by_format == {"fp32": four.flops_per_step}
