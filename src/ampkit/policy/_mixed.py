"""Mixed-precision policies: fp32 weights, 16-bit compute under ``torch.autocast`` (``bf16-mixed``, ``16-mixed``)."""

from __future__ import annotations

from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import ClassVar

import torch

from ._base import LossScaling, Policy
from ._device import Support, cpu_bf16_native, cuda_bf16_supported, cuda_fp16_tensor_cores, no_fp16_tensor_cores

__all__ = ["BF16Mixed", "FP16Mixed"]


@dataclass(frozen=True, kw_only=True)
class _Mixed(Policy):
    def forward_context(self, device_type: str) -> ContextManager[None]:
        return torch.autocast(device_type=device_type, dtype=self.compute_dtype)


@dataclass(frozen=True, kw_only=True)
class BF16Mixed(_Mixed):
    """``bf16-mixed``: autocast to bfloat16. fp32's range, so no loss scaling; the CPU policy that pays."""

    name: str = "bf16-mixed"
    compute_dtype: ClassVar[torch.dtype] = torch.bfloat16
    description: ClassVar[str] = "fp32 weights, bf16 autocast, no loss scaling"

    def _support(self, device: torch.device) -> Support:
        if device.type == "cuda":
            if not cuda_bf16_supported(device):
                return Support(False, False, f"{torch.cuda.get_device_name(device)} has no bf16 (needs sm80+); use '16-mixed'")
            return Support(True, True, "bf16 tensor cores")
        if device.type == "cpu":
            if cpu_bf16_native():
                return Support(True, True, "CPU has AMX/AVX512-BF16: bf16 matmuls and convolutions are fast")
            return Support(True, False, "runs, but this CPU emulates bf16 (no AMX/AVX512-BF16): expect no speed-up")
        return Support(True, False, f"autocast on {device.type}: not measured by ampkit")


@dataclass(frozen=True, kw_only=True)
class FP16Mixed(_Mixed):
    """``16-mixed``: autocast to float16 with dynamic loss scaling (fp16 flushes gradients below 2^-24)."""

    name: str = "16-mixed"
    compute_dtype: ClassVar[torch.dtype] = torch.float16
    loss_scaling: ClassVar[LossScaling] = "dynamic"
    description: ClassVar[str] = "fp32 weights, fp16 autocast, dynamic loss scaling"

    def _support(self, device: torch.device) -> Support:
        if device.type == "cuda":
            if not cuda_fp16_tensor_cores(device):
                return no_fp16_tensor_cores(device, "32-true")
            return Support(True, True, "fp16 tensor cores")
        if device.type == "cpu":
            return Support(
                True, False, "runs, but CPU fp16 is no faster than fp32 and ~170x slower for conv backward; use 'bf16-mixed'"
            )
        return Support(True, False, f"autocast on {device.type}: not measured by ampkit")
