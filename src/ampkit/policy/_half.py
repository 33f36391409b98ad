"""16-bit-weights policies: ``bf16-true``, ``16-true`` and their fp32-master-weight forms.

``*-true`` stores the whole model in 16 bits (Apex O3 for fp16). ``*-true-masters`` is Apex O2's recipe,
generalised to bf16: 16-bit model, normalisation layers kept in fp32, fp32 master weights stepped by the
optimizer (the engine owns them), dynamic loss scaling for fp16. Inputs are cast to the model's dtype on the
way in and outputs to fp32 on the way out, as Apex did, so the user's loss runs in fp32.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ._base import LossScaling, Policy
from ._device import (
    Support,
    cpu_bf16_native,
    cuda_bf16_supported,
    cuda_fp16_tensor_cores,
    no_fp16_tensor_cores,
)
from ._islands import NORM_TYPES, cast_floating, make_fp32_island, match_modules
from ._masters import MasterWeights
from ._remainder_masters import RemainderMasters

__all__ = ["BF16True", "BF16TrueMasters", "BF16TrueRemainder", "FP16True", "FP16TrueMasters"]

_IO_HOOK_MARK = "_ampkit_io_cast"


def _cast_inputs(dtype: torch.dtype, module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any]:
    return cast_floating(args, dtype), cast_floating(kwargs, dtype)


def _cast_outputs(module: nn.Module, args: Any, output: Any) -> Any:
    return cast_floating(output, torch.float32)


@dataclass(frozen=True, kw_only=True)
class _Half(Policy):
    def _support(self, device: torch.device) -> Support:
        dtype = self.param_dtype
        if device.type == "cuda":
            if dtype == torch.bfloat16 and not cuda_bf16_supported(device):
                return Support(False, False, f"{torch.cuda.get_device_name(device)} has no bf16 (needs sm80+); use '16-true-masters'")
            if not cuda_fp16_tensor_cores(device):
                return no_fp16_tensor_cores(device, "32-true")
            return Support(True, True, "16-bit tensor cores")
        if device.type == "cpu":
            if dtype == torch.float16:
                return Support(True, False, "runs, but CPU fp16 is slow (conv backward ~170x fp32); use 'bf16-true-masters'")
            if cpu_bf16_native():
                return Support(True, True, "CPU has AMX/AVX512-BF16")
            return Support(True, False, "runs, but this CPU emulates bf16: expect no speed-up")
        return Support(True, False, f"16-bit on {device.type}: not measured by ampkit")

    def fp32_islands(self, module: nn.Module) -> list[tuple[str, nn.Module]]:
        keep: list[str | type[nn.Module]] = list(self.keep_fp32)
        if self.master_weights:
            keep.extend(NORM_TYPES)
        return match_modules(module, keep)

    def converted_modules(self, module: nn.Module) -> list[nn.Module]:
        inside = {id(m) for _, island in self.fp32_islands(module) for m in island.modules()}
        return [m for m in module.modules() if id(m) not in inside]

    def convert_module(self, module: nn.Module, device_type: str) -> None:
        dtype = self.param_dtype
        islands = self.fp32_islands(module)
        for m in self.converted_modules(module):
            for tensors in (m._parameters, m._buffers):
                for t in tensors.values():
                    # Assigning .data keeps each Parameter object, so optimizers built on it remain valid.
                    if t is not None and t.is_floating_point() and t.dtype != dtype:
                        t.data = t.data.to(dtype)
        for _, island in islands:
            make_fp32_island(island, device_type, output_dtype=dtype)
        if not getattr(module, _IO_HOOK_MARK, False):
            module.register_forward_pre_hook(functools.partial(_cast_inputs, dtype), with_kwargs=True)
            module.register_forward_hook(_cast_outputs)
            setattr(module, _IO_HOOK_MARK, True)


@dataclass(frozen=True, kw_only=True)
class BF16True(_Half):
    """``bf16-true``: the whole model in bfloat16; the optimizer steps bf16 weights (small updates can round away)."""

    name: str = "bf16-true"
    param_dtype: ClassVar[torch.dtype] = torch.bfloat16
    description: ClassVar[str] = "bf16 weights and compute, no masters"


@dataclass(frozen=True, kw_only=True)
class FP16True(_Half):
    """``16-true`` (Apex O3): the whole model in float16, no loss scaling; a speed baseline, rarely stable."""

    name: str = "16-true"
    param_dtype: ClassVar[torch.dtype] = torch.float16
    description: ClassVar[str] = "fp16 weights and compute, no masters, no scaling (Apex O3)"


@dataclass(frozen=True, kw_only=True)
class BF16TrueMasters(_Half):
    """``bf16-true-masters``: bf16 model, fp32 norms, fp32 master weights in the optimizer."""

    name: str = "bf16-true-masters"
    param_dtype: ClassVar[torch.dtype] = torch.bfloat16
    master_weights: ClassVar[bool] = True
    description: ClassVar[str] = "bf16 weights, fp32 norms and master weights"


@dataclass(frozen=True, kw_only=True)
class BF16TrueRemainder(BF16TrueMasters):
    """``bf16-true-remainder``: ``bf16-true-masters``' training, bit for bit, with the masters kept as int16
    remainders and tie bits of the bf16 weights (2.125 bytes per parameter instead of 8; see :mod:`ampkit.policy._remainder_masters`)."""

    name: str = "bf16-true-remainder"
    master_remainders: ClassVar[bool] = True
    master_store: ClassVar[type[MasterWeights]] = RemainderMasters
    description: ClassVar[str] = "bf16 weights, fp32 norms, fp32 masters stored as int16 remainders"


@dataclass(frozen=True, kw_only=True)
class FP16TrueMasters(_Half):
    """``16-true-masters`` (Apex O2): fp16 model, fp32 norms, fp32 master weights, dynamic loss scaling."""

    name: str = "16-true-masters"
    param_dtype: ClassVar[torch.dtype] = torch.float16
    master_weights: ClassVar[bool] = True
    loss_scaling: ClassVar[LossScaling] = "dynamic"
    description: ClassVar[str] = "fp16 weights, fp32 norms and master weights, dynamic scaling (Apex O2)"
