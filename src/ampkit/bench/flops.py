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

from ..policy.gpu_specs import GPU_SPECS, gpu_spec

__all__ = ["count_flops", "peak_flops", "PEAK_TFLOPS"]

# name fragment (matched in order, case-insensitive) -> dense peak TFLOP/s for (16-bit, tf32, fp32), from the one
# device table the fp8 roofline also reads.
PEAK_TFLOPS: tuple[tuple[str, tuple[float, float, float]], ...] = tuple(
    (s.name, (s.bf16_tflops, s.tf32_tflops, s.fp32_tflops)) for s in GPU_SPECS
)


def peak_flops(device_name: str, compute_dtype: torch.dtype | None, tf32: bool = False) -> float | None:
    """Dense peak FLOP/s of ``device_name`` computing in ``compute_dtype`` (None: fp32, or TF32 when ``tf32``)."""
    spec = gpu_spec(device_name)
    if spec is None:
        return None
    if compute_dtype in (torch.float16, torch.bfloat16):
        return spec.bf16_tflops * 1e12
    return (spec.tf32_tflops if tf32 else spec.fp32_tflops) * 1e12


def count_flops(step: Callable[[], object]) -> int:
    """FLOPs torch counts while ``step()`` runs: matmuls, convolutions and attention, forward and backward.

    >>> a = torch.randn(8, 16, requires_grad=True)
    >>> count_flops(lambda: (a @ torch.randn(16, 4)).sum().backward())  # 2*8*16*4 forward + the same for grad a
    2048
    """
    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())
