"""The accuracy guard: a model built to lose its signal in 16 bits is rejected, a normal one passes, and the
tolerance is the one stated, from fp32's measured noise."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.tuning import Candidate, GuardResult
from ampkit.tuning._guard import NOISE_FACTOR, Reference, judge, reference, reordered
from ampkit.workloads import Accuracy, Workload

ROWS, WIDTH, STEPS = 32, 8, 30
OFFSET = 1000.0
"""bf16's step between numbers near 1000 is 8 and fp16's 0.5: a signal of about 0.1 added to it rounds away."""


class OffsetModel(nn.Module):
    """Classifies ``x - OFFSET`` as ``W x - W offset``: exact enough in fp32 (its step near 1000 is 6e-5), while a
    matmul whose input is rounded to 16 bits sees ``x == offset`` and outputs the bias alone, for every sample."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, 2, bias=False)
        self.bias = nn.Parameter(torch.zeros(2))
        self.register_buffer("offset", torch.full((WIDTH,), OFFSET))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) - self.fc(self.offset.expand_as(x)) + self.bias


def _workload(model: nn.Module, offset: float) -> Workload:
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(WIDTH, generator=g)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        signal = 0.1 * torch.randn(ROWS, WIDTH, generator=g)
        return offset + signal, (signal @ truth > 0).long()

    train = [batch() for _ in range(8)]
    return Workload(name="offset", model=model, train_batches=train, eval_batches=[batch() for _ in range(4)], metric=Accuracy,
                    items_per_batch=ROWS, steps=STEPS, warmup=1, lr=0.05)


def _start() -> Candidate:
    return Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)


def test_a_model_whose_signal_lives_below_16_bit_resolution_is_rejected(device: torch.device, mixed_policy: str) -> None:
    torch.manual_seed(0)
    w = _workload(OffsetModel().to(device), OFFSET)
    ref = reference(w, _start(), device, steps=STEPS)
    assert ref.metric == "accuracy" and ref.value > 0.8  # fp32 learns the signal
    result = judge(w, Candidate(policy=mixed_policy, micro_batch=ROWS, accumulate=1), ref, device)
    assert not result.passed and result.gap > ref.tolerance
    assert result.reason == (f"accuracy {result.value:.4g} is {result.gap:.3g} worse than fp32's {ref.value:.4g}, beyond the "
                             f"tolerance {ref.tolerance:.3g} (fp32's own noise {ref.noise:.3g})")


def test_a_normal_model_passes_in_the_mixed_policy(device: torch.device, mixed_policy: str) -> None:
    torch.manual_seed(0)
    w = _workload(nn.Sequential(nn.Linear(WIDTH, 16), nn.ReLU(), nn.Linear(16, 2)).to(device), 0.0)
    ref = reference(w, _start(), device, steps=STEPS)
    result = judge(w, Candidate(policy=mixed_policy, micro_batch=ROWS, accumulate=1), ref, device)
    assert result.passed, result.reason
    assert result.tolerance == ref.tolerance == max(Accuracy.tolerance, NOISE_FACTOR * abs(ref.value - ref.reordered))


def test_the_noise_run_sees_the_same_batches_in_another_order() -> None:
    w = _workload(nn.Linear(WIDTH, 2), 0.0)
    other = reordered(w, seed=0)
    assert [id(b) for b in other.train_batches] != [id(b) for b in w.train_batches]
    assert sorted(id(b) for b in other.train_batches) == sorted(id(b) for b in w.train_batches)


@pytest.mark.parametrize(("value", "passed"), [(0.89, True), (0.86, True), (0.85, False), (float("nan"), False)])
def test_only_worse_beyond_the_tolerance_is_rejected(value: float, passed: bool) -> None:
    ref = Reference("accuracy", True, value=0.9, reordered=0.88, floor=0.02, steps=10)
    assert ref.noise == pytest.approx(0.02) and ref.tolerance == pytest.approx(0.04)
    g = GuardResult("k", "accuracy", True, value, ref.value, ref.noise, ref.tolerance)
    assert g.passed is passed and (g.reason is None) is passed
    assert GuardResult("k", "final_loss", False, 1.0, 1.2, 0.0, 0.01).passed  # a lower loss is better, never a failure


def test_the_reference_keeps_both_fp32_runs_losses_for_the_reports_curves() -> None:
    from ampkit.tuning._guard import _train

    torch.manual_seed(0)
    w = _workload(nn.Linear(WIDTH, 2), 0.0)
    ref = reference(w, _start(), torch.device("cpu"), steps=4)
    _, _, control = _train(reordered(w, seed=0), _start(), torch.device("cpu"), 4, 0)  # the twin trained alone
    assert len(ref.losses) == len(ref.reordered_losses) == 4
    assert ref.reordered_losses == control["losses"] and ref.reordered_losses != ref.losses
    assert Reference.from_dict(ref.to_dict()).reordered_losses == ref.reordered_losses
