"""What a device can run fast, and why: the facts every policy's support check rests on.

Measured on the development machine (Sapphire Rapids, AMX-BF16, torch 2.13 CPU): bf16 autocast gives a real
speed-up on CPU (2.3x on a small GPT step), while fp16 autocast is no faster than fp32 and about 170x slower for
convolution backward, because oneDNN has no fast fp16 convolution-backward kernel. Policies report this through
:class:`Support` so that tools recommending a policy do not recommend a slow one.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

import torch

from .._compat import cpu_isa_probe

__all__ = [
    "Support",
    "as_device",
    "cpu_bf16_native",
    "cpu_fp16_native",
    "cpu_name",
    "cuda_bf16_supported",
    "cuda_fp16_tensor_cores",
    "cuda_tf32_supported",
    "no_fp16_tensor_cores",
]


@dataclass(frozen=True, slots=True)
class Support:
    """Whether a policy runs on a device (``supported``), whether it pays there (``fast``), and why."""

    supported: bool
    fast: bool
    reason: str


def as_device(device: torch.device | str | int | None) -> torch.device:
    """Normalise ``device`` ("cuda", 0, torch.device, None meaning CPU) to a torch.device with an index on CUDA.

    >>> as_device(None)
    device(type='cpu')
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, bool):
        raise TypeError(f"device must be a torch.device, a string such as 'cuda:0', or a CUDA index; got {device!r}.")
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


@functools.cache
def _cpu_flags() -> frozenset[str]:
    # /proc/cpuinfo is the ground truth on Linux; torch's private probes are only a fallback elsewhere.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset(flag for flag in ("amx_bf16", "avx512_bf16") if cpu_isa_probe(flag))


def cpu_name() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it on Linux; platform's guess elsewhere."""
    # platform.processor() is often just "x86_64" or empty on Linux, so /proc/cpuinfo comes first.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_bf16_native() -> bool:
    """True when this CPU has bf16 matrix instructions (AMX-BF16 or AVX512-BF16), so bf16 beats fp32."""
    return bool({"amx_bf16", "avx512_bf16"} & _cpu_flags())


def cpu_fp16_native() -> bool:
    """True when this CPU has AMX-FP16; even then oneDNN's fp16 convolution backward stays slow."""
    return "amx_fp16" in _cpu_flags()


def cuda_bf16_supported(device: torch.device) -> bool:
    """True when the CUDA device computes bf16 natively (compute capability 8.0, Ampere, or newer)."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def cuda_fp16_tensor_cores(device: torch.device) -> bool:
    """True when the CUDA device has fp16 tensor cores (compute capability 7.0, Volta, or newer). Below that fp16
    runs, but without them (Pascal's consumer parts do fp16 arithmetic at 1/64 of the fp32 rate)."""
    return torch.cuda.get_device_capability(device) >= (7, 0)


def no_fp16_tensor_cores(device: torch.device, alternative: str) -> Support:
    """What an fp16 policy reports on a CUDA device older than Volta: it runs, it does not pay."""
    return Support(
        True, False, f"runs, but {torch.cuda.get_device_name(device)} has no fp16 tensor cores (needs sm70+): expect no speed-up; use {alternative!r}"
    )


def cuda_tf32_supported(device: torch.device) -> bool:
    """True when the CUDA device has TF32 tensor cores (compute capability 8.0 or newer)."""
    return torch.cuda.get_device_capability(device) >= (8, 0)
