"""FLOP counting and device peaks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.bench.flops import count_flops, peak_flops


def test_linear_training_flops_are_three_matmuls() -> None:
    model, x = nn.Linear(32, 16), torch.randn(8, 32)
    # forward x@W^T, backward dX = dY@W (not needed: x has no grad) and dW = dY^T@x: 2 matmuls of 2*8*32*16
    assert count_flops(lambda: model(x).sum().backward()) == 2 * (2 * 8 * 32 * 16)
    x.requires_grad_(True)
    assert count_flops(lambda: model(x).sum().backward()) == 3 * (2 * 8 * 32 * 16)


def test_flops_are_counted_under_bf16_autocast_too() -> None:
    model, x = nn.Linear(32, 16), torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        flops = count_flops(lambda: model(x).float().sum().backward())
    assert flops == 2 * (2 * 8 * 32 * 16)


def test_peaks_by_device_and_dtype() -> None:
    assert peak_flops("NVIDIA H100 PCIe", torch.bfloat16) == pytest.approx(756.5e12)  # PCIe is matched before the SXM entry
    assert peak_flops("NVIDIA H100 80GB HBM3", None) == pytest.approx(66.9e12)
    assert peak_flops("NVIDIA H100 80GB HBM3", None, tf32=True) == pytest.approx(494.7e12)
    assert peak_flops("NVIDIA A100-SXM4-40GB", torch.float16) == pytest.approx(312e12)
    assert peak_flops("NVIDIA H200", torch.bfloat16) == pytest.approx(989.4e12)
    assert peak_flops("cpu", torch.bfloat16) is None
