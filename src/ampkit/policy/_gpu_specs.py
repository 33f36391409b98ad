"""What a GPU can do at most: dense peak FLOP/s per compute format and memory bandwidth, from the vendors' data sheets.

One table serves everything that turns work into time: the bench's MFU (FLOPs over the 16-bit, tf32 or fp32 peak)
and the fp8 layer filter's roofline (FLOPs over the fp8 peak against bytes over bandwidth). Figures are dense (no
2:4 sparsity) and for the SXM part unless the name says otherwise. A GPU that is not listed has no spec: callers
say so rather than guess.

    >>> spec = gpu_spec("NVIDIA H100 80GB HBM3")
    >>> spec.name, spec.bf16_tflops, spec.fp8_tflops, spec.bandwidth_tbs
    ('H100', 989.4, 1978.9, 3.35)
    >>> gpu_spec("NVIDIA H100 PCIe").name, gpu_spec("Some Future GPU") is None
    ('H100 PCIe', True)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GpuSpec", "GPU_SPECS", "gpu_spec", "fp8_gpus"]


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU's dense peaks (TFLOP/s) per format and its memory bandwidth (TB/s); ``fp8_tflops`` None: no fp8."""

    name: str
    bf16_tflops: float
    tf32_tflops: float
    fp32_tflops: float
    fp8_tflops: float | None
    bandwidth_tbs: float


# Matched in order by name fragment (case-insensitive): the PCIe and NVL parts before the H100 SXM entry, L40S before
# L4. fp8 figures are those with fp32 accumulation, which is what torch._scaled_mm runs.
GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("B200", 2250.0, 1125.0, 75.0, 4500.0, 8.0),
    GpuSpec("H200", 989.4, 494.7, 66.9, 1978.9, 4.8),
    GpuSpec("H100 PCIe", 756.5, 378.0, 51.2, 1513.0, 2.0),
    GpuSpec("H100 NVL", 835.5, 417.5, 60.0, 1670.5, 3.9),
    GpuSpec("H100", 989.4, 494.7, 66.9, 1978.9, 3.35),
    GpuSpec("A100", 312.0, 156.0, 19.5, None, 2.039),
    GpuSpec("L40S", 362.1, 183.0, 91.6, 733.0, 0.864),
    GpuSpec("L4", 121.0, 60.0, 30.3, 242.5, 0.3),
    GpuSpec("RTX 4090", 165.2, 82.6, 82.6, 330.3, 1.008),
    GpuSpec("A10", 125.0, 62.5, 31.2, None, 0.6),
    GpuSpec("V100", 125.0, 15.7, 15.7, None, 0.9),  # no TF32: tf32 requests run in fp32
    GpuSpec("T4", 65.0, 8.1, 8.1, None, 0.32),
)


def gpu_spec(device_name: str) -> GpuSpec | None:
    """The spec of the GPU whose name contains a listed fragment (``torch.cuda.get_device_name()``), or None."""
    lowered = device_name.lower()
    return next((s for s in GPU_SPECS if s.name.lower() in lowered), None)


def fp8_gpus() -> list[str]:
    """The listed GPUs with fp8 tensor cores, by name.

    >>> fp8_gpus()[:3]
    ['B200', 'H200', 'H100 PCIe']
    """
    return [s.name for s in GPU_SPECS if s.fp8_tflops is not None]
