"""FLOP counting by format, recomputation left out, and MFU against the device's dense peaks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from ampkit.bench import _flops as flops
from ampkit.bench._flops import count_flops, mfu, peak_flops

B, D, H = 8, 32, 64


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, D))


def _forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    """The control: torch's own count of the forward alone."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    return counter.get_total_flops()


def test_linear_training_flops_are_three_matmuls() -> None:
    model, x = nn.Linear(32, 16), torch.randn(8, 32)
    # forward x@W^T, backward dX = dY@W (not needed: x has no grad) and dW = dY^T@x: 2 matmuls of 2*8*32*16
    assert count_flops(lambda: model(x).sum().backward()).total == 2 * (2 * 8 * 32 * 16)
    x.requires_grad_(True)
    assert count_flops(lambda: model(x).sum().backward()).total == 3 * (2 * 8 * 32 * 16)


def test_forward_and_backward_are_three_forwards_and_recomputation_is_not_useful_work() -> None:
    model, x = _mlp(), torch.randn(B, D, requires_grad=True)
    forward = _forward_flops(model, x)
    plain = count_flops(lambda: model(x).sum().backward())
    assert plain.total == 3 * forward and plain.recomputed == 0
    for reentrant in (False, True):  # activation checkpointing runs the forward again in backward
        model.zero_grad()
        checkpointed = count_flops(lambda r=reentrant: checkpoint(model, x, use_reentrant=r).sum().backward())
        assert checkpointed.total == plain.total and checkpointed.by_format == plain.by_format
        assert 0 < checkpointed.recomputed <= forward  # non-reentrant stops recomputing once it has what backward needs


def test_flops_are_filed_under_the_format_the_op_multiplied_in() -> None:
    model, x = _mlp(), torch.randn(B, D, requires_grad=True)
    fp32 = count_flops(lambda: model(x).sum().backward())
    assert set(fp32.by_format) == {"fp32"}
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts every Linear to bf16
        mixed = count_flops(lambda: model(x).float().sum().backward())
    assert mixed.by_format == {"16-bit": fp32.total}
    half = _mlp().to(torch.bfloat16)
    assert count_flops(lambda: half(x.detach().bfloat16().requires_grad_()).sum().backward()).by_format == {"16-bit": fp32.total}


def test_fp32_flops_count_as_tf32_while_torch_lets_cuda_run_them_in_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tf32 policy sets TF32 around its forward only: the format is read as each op runs, so a forward under
    # TF32 and a backward without it are filed apart (the forward's third of the FLOPs under tf32).
    model, x = _mlp(), torch.randn(B, D, requires_grad=True)
    monkeypatch.setattr(flops, "_on_cuda", lambda t: True)  # these CPU tensors stand in for CUDA ones
    total = count_flops(lambda: model(x).sum().backward()).total
    matmul = torch.backends.cuda.matmul
    per_backend = hasattr(matmul, "fp32_precision")  # torch 2.9+; the legacy flag before (never both: mixing raises)
    name, on, off = ("fp32_precision", "tf32", "ieee") if per_backend else ("allow_tf32", True, False)
    before = getattr(matmul, name)

    def forward_in_tf32() -> None:
        setattr(matmul, name, on)
        y = model(x).sum()
        setattr(matmul, name, off)
        y.backward()

    try:
        split = count_flops(forward_in_tf32)
    finally:
        setattr(matmul, name, before)
    assert split.by_format == {"tf32": _forward_flops(model, x), "fp32": total - _forward_flops(model, x)}


def test_cpu_convolutions_are_fp32_whatever_cudnns_tf32_default() -> None:
    conv, x = nn.Conv2d(3, 4, 3), torch.randn(2, 3, 8, 8)  # cuDNN may run fp32 convolutions in TF32 by default
    assert set(count_flops(lambda: conv(x).sum().backward()).by_format) == {"fp32"}


def test_peaks_by_device_and_format() -> None:
    assert peak_flops("NVIDIA H100 PCIe", "16-bit") == pytest.approx(756.5e12)  # PCIe is matched before the SXM entry
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(66.9e12)
    assert peak_flops("NVIDIA H100 80GB HBM3", "tf32") == pytest.approx(494.7e12)
    assert peak_flops("NVIDIA H200", "fp8") == pytest.approx(1978.9e12)
    assert peak_flops("NVIDIA A100-SXM4-40GB", "fp8") is None  # no fp8 tensor cores
    assert peak_flops("cpu", "16-bit") is None


def test_mfu_of_the_first_h200_run_is_over_the_peak_of_the_format_each_matmul_ran_in() -> None:
    # The rows of benchmarks/results/h200-2026-11-27 (03-bench.log): 2.23 TFLOP a step, each row's median time.
    step = 2.23e12
    bf16_true, _ = mfu({"16-bit": step}, 0.0122, "NVIDIA H200")  # printed 273.5%: divided by the fp32 peak
    bf16_mixed, _ = mfu({"16-bit": step}, 0.0146, "NVIDIA H200")
    fp32, _ = mfu({"fp32": step}, 0.0529, "NVIDIA H200")
    assert bf16_true == pytest.approx(step / 989.4e12 / 0.0122) and bf16_true < 1
    assert bf16_mixed == pytest.approx(step / 989.4e12 / 0.0146)
    assert fp32 == pytest.approx(step / 66.9e12 / 0.0529)
    # A step in two formats: the time each part would take at its own peak, summed, over the step's time.
    both, _ = mfu({"fp8": 1e12, "16-bit": 1e12}, 0.01, "NVIDIA H200")
    assert both == pytest.approx((1e12 / 1978.9e12 + 1e12 / 989.4e12) / 0.01)
    two_gpus, _ = mfu({"16-bit": 2 * step}, 0.0122, "NVIDIA H200", devices=2)  # both ranks' FLOPs over both peaks
    assert two_gpus == pytest.approx(bf16_true)


def test_mfu_over_100_percent_or_without_a_peak_is_a_reason_not_a_figure() -> None:
    value, why = mfu({"fp32": 2.23e12}, 0.0122, "NVIDIA H200")  # bf16 speed divided by the fp32 peak: 273%
    assert value is None and "273% of H200's dense peak is impossible" in why
    value, why = mfu({"16-bit": 1e12}, 0.01, "NVIDIA Future GPU")
    assert value is None and "no dense peak is known for 'NVIDIA Future GPU'" in why
    value, why = mfu({"fp8": 1e12}, 0.01, "NVIDIA A100-SXM4-80GB")
    assert value is None and "no listed peak for the step's fp8 FLOPs" in why
    value, why = mfu({"other": 1e9}, 0.01, "NVIDIA H200")  # fp64, or FLOPs of unknown format
    assert value is None and "other" in why
