"""Full-precision policies: ``32-true`` (plain fp32) and ``tf32`` (fp32 storage, TF32 tensor-core matmuls)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import ClassVar

import torch

from .._compat import per_backend_fp32_precision
from ._base import Policy
from ._device import Support, cuda_tf32_supported

__all__ = ["FullPrecision", "TF32Precision"]


@dataclass(frozen=True, kw_only=True)
class FullPrecision(Policy):
    """``32-true``: weights, activations and gradients in float32; the reference every other policy is held to."""

    name: str = "32-true"
    description: ClassVar[str] = "fp32 weights and compute (the reference)"


_per_backend_api = per_backend_fp32_precision  # a module attribute, so tests can pretend to run an older torch


@contextlib.contextmanager
def _tf32_matmuls() -> Iterator[None]:
    # These settings are process-global, so the caller's are restored on the way out. Where torch has per-backend
    # settings, only the CUDA ones are touched: the legacy global getter raises once backends disagree, so
    # reading or writing it would break users of the newer API (and the CPU's oneDNN setting is not ours).
    if _per_backend_api():
        # cudnn.conv exists from torch 2.9 (this branch), on the class that replaces the cudnn module at import;
        # the module's declared attributes (what a type checker reads) leave it out (2.13).
        backends = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)  # type: ignore[attr-defined]
        previous = [b.fp32_precision for b in backends]
        for b in backends:
            b.fp32_precision = "tf32"
        try:
            yield
        finally:
            for b, value in zip(backends, previous):
                b.fp32_precision = value
        return
    previous_matmul = torch.get_float32_matmul_precision()
    previous_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous_matmul)
        torch.backends.cudnn.allow_tf32 = previous_cudnn


@dataclass(frozen=True, kw_only=True)
class TF32Precision(Policy):
    """``tf32``: fp32 storage; matmuls and convolutions on TF32 tensor cores (10-bit mantissa). CUDA, Ampere+."""

    name: str = "tf32"
    description: ClassVar[str] = "fp32 weights, TF32 tensor-core matmuls (CUDA sm80+)"

    def _support(self, device: torch.device) -> Support:
        if device.type != "cuda":
            return Support(False, False, "TF32 is a CUDA tensor-core mode; on CPU use 'bf16-mixed' (AMX) or '32-true'")
        if not cuda_tf32_supported(device):
            return Support(False, False, f"{torch.cuda.get_device_name(device)} has no TF32 (needs sm80+); use '16-mixed'")
        return Support(True, True, "TF32 tensor cores")

    def forward_context(self, device_type: str) -> ContextManager[None]:
        return _tf32_matmuls()

    def backward_context(self, device_type: str) -> ContextManager[None]:
        # The backward's matmuls (two per forward matmul: two thirds of the step's FLOPs) read the setting when
        # they run, outside the forward's context: without this, tf32 ran its backward in full fp32.
        return _tf32_matmuls()
