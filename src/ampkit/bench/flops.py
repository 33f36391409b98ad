"""FLOPs of a training step (torch's FlopCounterMode) and the device peaks that turn FLOP/s into MFU.

Peaks are dense (no sparsity) figures from the vendors' data sheets, per compute dtype. They are kept in one
table keyed by device name rather than hard-coded for one GPU; a device that is not listed gets no MFU unless
the user passes its peak (``ampkit bench --peak-tflops``).

    >>> peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) / 1e12
    989.4
    >>> peak_flops("Some Future GPU", torch.bfloat16) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["count_flops", "peak_flops", "PEAK_TFLOPS"]

# name fragment (matched in order, case-insensitive) -> dense peak TFLOP/s for (16-bit, tf32, fp32).
PEAK_TFLOPS: tuple[tuple[str, tuple[float, float, float]], ...] = (
    ("H200", (989.4, 494.7, 66.9)),
    ("H100 PCIe", (756.5, 378.0, 51.2)),
    ("H100", (989.4, 494.7, 66.9)),  # SXM / HBM3
    ("A100", (312.0, 156.0, 19.5)),
    ("L40S", (362.1, 183.0, 91.6)),
    ("L4", (121.0, 60.0, 30.3)),
    ("A10", (125.0, 62.5, 31.2)),
    ("V100", (125.0, 15.7, 15.7)),  # no TF32: tf32 requests run in fp32
    ("T4", (65.0, 8.1, 8.1)),
)


def peak_flops(device_name: str, compute_dtype: torch.dtype | None, tf32: bool = False) -> float | None:
    """Dense peak FLOP/s of ``device_name`` computing in ``compute_dtype`` (None: fp32, or TF32 when ``tf32``)."""
    lowered = device_name.lower()
    for fragment, (half, tf, full) in PEAK_TFLOPS:
        if fragment.lower() in lowered:
            if compute_dtype in (torch.float16, torch.bfloat16):
                return half * 1e12
            return (tf if tf32 else full) * 1e12
    return None


def count_flops(step: Callable[[], object]) -> int:
    """FLOPs torch counts while ``step()`` runs: matmuls, convolutions and attention, forward and backward.

    >>> a = torch.randn(8, 16, requires_grad=True)
    >>> count_flops(lambda: (a @ torch.randn(16, 4)).sum().backward())  # 2*8*16*4 forward + the same for grad a
    2048
    """
    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())
