"""A tune's result as measured (no training): every verdict of the table, a guard with losses, a compiled row whose
CPU memory was not measured, a failed trial; what the report, its plots and its files are drawn from."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from ampkit.tuning import Candidate, GuardResult, Trial, TuneResult
from ampkit.tuning._guard import Reference
from ampkit.workloads import Workload

START = Candidate(policy="32-true", micro_batch=32, accumulate=1)
BASE = [0.020, 0.021, 0.019, 0.020, 0.022, 0.020]


def _trial(c: Candidate, times: list[float], role: str = "candidate", **kw: object) -> Trial:
    return Trial(key=c.key, stage="precision", candidate=c.to_dict(), role=role, step_times_s=times, baseline_times_s=BASE, **kw)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _quiet(quiet_machine: None) -> None:
    """Every tune here sees a quiet machine (tests/conftest.py): what it measures must not hang on CI's other load."""


MLP_ROWS = 8


@pytest.fixture
def mlp(device: torch.device) -> Workload:
    """A two-block MLP on three batches of 8 rows on ``device``: what the trials and waves train (fresh per test)."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(MLP_ROWS, 6, generator=g), torch.randint(0, 3, (MLP_ROWS,), generator=g)) for _ in range(3)]
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(6 if i == 0 else 16, 16), nn.Tanh()) for i in range(2)]
    model = nn.Sequential(*blocks, nn.Linear(16, 3)).to(device)
    return Workload(name="mlp", model=model, train_batches=batches, items_per_batch=MLP_ROWS, steps=4, warmup=1)


@pytest.fixture
def measured() -> TuneResult:
    """The winner bf16-mixed (eager, its memory measured), a compiled faster one without memory (CPU), bf16-true
    rejected by the guard, a slower and a no-gain one, a failed one."""
    fast = dataclasses.replace(START, policy="bf16-mixed")
    compiled = dataclasses.replace(START, policy="bf16-mixed", compile="regional")
    lossy = dataclasses.replace(START, policy="bf16-true")
    slow = dataclasses.replace(START, threads=1)
    same = dataclasses.replace(START, policy="bf16-true-masters")
    broken = dataclasses.replace(START, fused_step=True)
    ref = Reference("accuracy", True, value=0.90, reordered=0.89, floor=0.02, steps=4, losses=[2.0, 1.5, 1.2, 1.0],
                    reordered_losses=[2.0, 1.6, 1.1, 1.05])
    guard = {
        START.numerics_key: GuardResult(START.key, "accuracy", True, 0.90, 0.90, ref.noise, ref.tolerance, list(ref.losses)),
        fast.numerics_key: GuardResult(fast.key, "accuracy", True, 0.895, 0.90, ref.noise, ref.tolerance, [2.0, 1.5, 1.25, 1.0]),
        lossy.numerics_key: GuardResult(lossy.key, "accuracy", True, 0.60, 0.90, ref.noise, ref.tolerance, [2.0, 1.9, 1.9, 1.8]),
    }
    trials = [
        _trial(START, BASE, role="baseline", peak_memory_bytes=4 << 20),
        _trial(fast, [t / 2 for t in BASE], peak_memory_bytes=3 << 20),
        _trial(compiled, [t / 2.5 for t in BASE], compile_s=8.0, peak_memory_bytes=None),
        _trial(lossy, [t / 3 for t in BASE], peak_memory_bytes=2 << 20),
        _trial(slow, [t * 2 for t in BASE], peak_memory_bytes=4 << 20),
        _trial(same, list(BASE), peak_memory_bytes=5 << 20),
        _trial(broken, [], status="failed", error="ValueError: fused_step: no masters"),
    ]
    return TuneResult(workload="toy", description="", device={"type": "cpu", "name": "cpu"}, unit="samples", items_per_step=32,
                      run_steps=1000, budget_s=60, start=START, baseline=START, winner=fast, winner_reason="fastest proven",
                      trials=trials, reference=ref, guard=guard, settings={"clip_grad_norm": 1.0, "guard_steps": 4})
