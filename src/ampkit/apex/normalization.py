"""``apex.normalization`` on torch's LayerNorm and RMSNorm, whose kernels now match Apex's fused ones.

Output dtypes follow Apex:

* ``FusedLayerNorm`` / ``FusedRMSNorm`` return the *input's* dtype, also when the weights have another one
  (16-bit activations through fp32 norms, as in amp O2); mixed inputs are normalised in fp32.
* ``MixedFusedLayerNorm`` / ``MixedFusedRMSNorm`` (Megatron's) return the *parameters'* dtype, computing in
  the wider of the two dtypes: fp32 activations through bf16 weights give bf16, bf16 activations through
  fp32 weights give fp32. Their parameters stay in whatever dtype the module is given.

Under autocast they follow torch's autocast rules for ``layer_norm`` and ``rms_norm`` (fp32 on CUDA, the
input's dtype on the CPU), where Apex's CUDA kernels ran in the autocast dtype. ``memory_efficient`` only chose what Apex saved for backward and is
accepted.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm"]

log = logging.getLogger("ampkit")

Shape = int | list[int] | tuple[int, ...] | torch.Size


class FusedLayerNorm(nn.LayerNorm):
    """Apex's ``FusedLayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True)``: ``nn.LayerNorm``.

    >>> norm = FusedLayerNorm(4)
    >>> norm(torch.arange(4.0)).detach().round(decimals=3)
    tensor([-1.3420, -0.4470,  0.4470,  1.3420])
    >>> norm(torch.ones(4, dtype=torch.bfloat16)).dtype  # fp32 weights, bf16 activations: bf16 out
    torch.bfloat16
    """

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True, memory_efficient: bool = False) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient  # accepted, no effect: torch decides what backward keeps


class FusedRMSNorm(nn.RMSNorm):
    """Apex's ``FusedRMSNorm(normalized_shape, eps=1e-5, elementwise_affine=True)``: ``nn.RMSNorm``, input dtype out.

    >>> norm = FusedRMSNorm(2)
    >>> norm(torch.tensor([3.0, 4.0], dtype=torch.bfloat16)).detach()
    tensor([0.8477, 1.1328], dtype=torch.bfloat16)
    """

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True, memory_efficient: bool = False) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w is None or w.dtype == input.dtype:
            return super().forward(input)
        # torch's rms_norm takes mixed dtypes only on a slow path that warns; normalise in fp32 instead.
        out = F.rms_norm(input.float(), self.normalized_shape, w.float(), self.eps)
        return out.to(input.dtype)


def _mixed_only_affine(cls: str, kwargs: dict[str, Any]) -> None:
    if not kwargs.pop("elementwise_affine", True):
        raise ValueError(f"{cls} always has weights (elementwise_affine=False is not supported, as in Apex); use FusedLayerNorm or FusedRMSNorm for a norm without them.")
    if kwargs:
        # Apex accepted and ignored any other keyword; refusing them would break code that ran there.
        log.warning("ampkit.apex %s: ignoring %s, which Apex ignored too.", cls, ", ".join(sorted(kwargs)))


def _compute_dtype(input: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    return torch.promote_types(input.dtype, weight.dtype)


class MixedFusedLayerNorm(FusedLayerNorm):
    """Apex's ``MixedFusedLayerNorm``: a LayerNorm whose output takes the dtype of its parameters.

    >>> norm = MixedFusedLayerNorm(4).bfloat16()
    >>> norm(torch.arange(8.0).view(2, 4)).dtype
    torch.bfloat16
    """

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, *, memory_efficient: bool = False, **kwargs: Any) -> None:
        _mixed_only_affine(type(self).__name__, kwargs)
        super().__init__(normalized_shape, eps=eps, elementwise_affine=True, memory_efficient=memory_efficient)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        dt = _compute_dtype(input, w)
        out = F.layer_norm(input.to(dt), self.normalized_shape, w.to(dt), None if b is None else b.to(dt), self.eps)
        return out.to(w.dtype)


class MixedFusedRMSNorm(FusedRMSNorm):
    """Apex's ``MixedFusedRMSNorm``: an RMSNorm whose output takes the dtype of its parameters.

    >>> norm = MixedFusedRMSNorm(2)
    >>> norm(torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16)).dtype
    torch.float32
    """

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, *, memory_efficient: bool = False, **kwargs: Any) -> None:
        _mixed_only_affine(type(self).__name__, kwargs)
        super().__init__(normalized_shape, eps=eps, elementwise_affine=True, memory_efficient=memory_efficient)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        w = self.weight
        dt = _compute_dtype(input, w)
        return F.rms_norm(input.to(dt), self.normalized_shape, w.to(dt), self.eps).to(w.dtype)
