"""CUDA's fused attention kernels, modelled on fake CPU tensors: what a GPU keeps for backward, not what the CPU keeps.

Without CUDA on this machine, :func:`~ampkit.memory.estimate` simulates a CUDA step on fake CPU tensors, and
``F.scaled_dot_product_attention`` then takes the CPU's kernels. With dropout (or whenever the CPU's flash
kernel declines) that is the math path: it materialises the ``B x H x T x T`` scores, their softmax and a
dropout mask, and keeps them for backward. On a GPU the same call runs flash or memory-efficient attention,
which keep only the output and a ``B x H x T`` logsumexp. :class:`CudaAttention` routes each call through the
kernel torch would pick on a GPU (their fake kernels give the right shapes and saved tensors on any device).

    >>> import torch.nn.functional as F
    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> with FakeTensorMode(), CudaAttention() as cuda:
    ...     q = torch.randn(8, 16, 1024, 64, dtype=torch.bfloat16, requires_grad=True)
    ...     out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True)
    >>> cuda.kernels, out.shape
    (Counter({'flash': 1}), torch.Size([8, 16, 1024, 64]))

Hand-written attention (``q @ k.transpose(-2, -1)``, softmax, ``@ v``) is left as it is: it keeps its scores on a
GPU too. Assumed: an Ampere or newer GPU (flash needs sm80+), torch's default kernel order (flash, then
memory-efficient, then math); cuDNN attention, when enabled, keeps what flash keeps.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["CudaAttention", "cuda_kernel"]

_HALF = (torch.float16, torch.bfloat16)


def cuda_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None) -> str:
    """The kernel ``F.scaled_dot_product_attention`` takes on a CUDA GPU (sm80+) for these inputs.

    ``flash`` for fp16/bf16 without an arbitrary mask and a head dim of at most 256; else ``efficient``
    (fp32 too, masks too) when the head dims are aligned for its GEMMs; else ``math``. Inputs are as the
    kernel sees them, after autocast's cast.

    >>> x16, x32 = torch.empty(2, 4, 8, 64, dtype=torch.bfloat16), torch.empty(2, 4, 8, 64)
    >>> cuda_kernel(x16, x16, x16), cuda_kernel(x32, x32, x32), cuda_kernel(x16, x16, x16, torch.ones(8, 8, dtype=torch.bool))
    ('flash', 'efficient', 'efficient')
    >>> cuda_kernel(*[torch.empty(2, 4, 8, 6)] * 3)   # a head dim of 6 fits no fused fp32 kernel
    'math'
    """
    tensors = (query, key, value)
    if any(t.dim() != 4 or t.is_nested for t in tensors) or len({t.dtype for t in tensors}) != 1:
        return "math"
    head, value_head = query.shape[-1], value.shape[-1]
    if query.dtype in _HALF and attn_mask is None and head == key.shape[-1] == value_head and head <= 256:
        return "flash"  # head dims that are not multiples of 8 are padded first, as torch does
    # The efficient kernel's GEMMs want rows of 16 bytes on sm80+: 8 halves or 4 floats.
    align = 8 if query.dtype in _HALF else 4
    if query.dtype in (*_HALF, torch.float32) and head == key.shape[-1] and head % align == 0 and value_head % align == 0:
        return "efficient"
    return "math"


def _sdpa_arguments(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], dict[str, Any]]:
    """``F.scaled_dot_product_attention``'s signature, to read its arguments however they were passed."""
    return (query, key, value), {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}


def _autocast_cast(tensors: list[Any]) -> list[Any]:
    # CUDA's autocast runs attention in 16 bits (it is on the lower-precision list); the simulation's autocast is
    # the CPU's, entered by the engine, whose dtype is the policy's.
    device = next(t.device.type for t in tensors if isinstance(t, torch.Tensor))
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    # As autocast's own cast: floating tensors only, and never fp64.
    return [t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 else t for t in tensors]


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: dict[str, Any]) -> torch.Tensor:
    head = q.shape[-1]
    pad = -head % 8  # torch pads the head dim to a multiple of 8 for flash (the padded copies are what it saves)
    if pad:
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
    scale = o["scale"] if o["scale"] is not None else 1 / math.sqrt(head)
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, o["dropout_p"], o["is_causal"], False, scale=scale)[0]
    return out[..., :head] if pad else out


def _efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: dict[str, Any]) -> torch.Tensor:
    mask = o["attn_mask"]
    if mask is not None and mask.dtype == torch.bool:
        # torch turns a boolean mask into an additive one (0 where kept, -inf where masked) for this kernel.
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(mask.logical_not(), -math.inf)
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, mask, grad, o["dropout_p"], o["is_causal"], scale=o["scale"])[0]


def _math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: dict[str, Any]) -> torch.Tensor:
    return torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, o["attn_mask"], o["dropout_p"], o["is_causal"], scale=o["scale"], enable_gqa=o["enable_gqa"]
    )[0]


_KERNELS = {"flash": _flash, "efficient": _efficient, "math": _math}


class CudaAttention(TorchFunctionMode):
    """While active, ``F.scaled_dot_product_attention`` runs the kernel a CUDA GPU would pick (see :func:`cuda_kernel`).

    ``kernels`` counts the calls per kernel. Every other function runs unchanged.
    """

    def __init__(self) -> None:
        super().__init__()
        self.kernels: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        (q, k, v), options = _sdpa_arguments(*args, **kwargs)
        q, k, v, options["attn_mask"] = _autocast_cast([q, k, v, options["attn_mask"]])
        if options["enable_gqa"] and q.shape[-3] != k.shape[-3]:
            kernel = "flash" if cuda_kernel(q, k, v, options["attn_mask"]) == "flash" else "math"  # efficient has no GQA
        else:
            kernel = cuda_kernel(q, k, v, options["attn_mask"])
        self.kernels[kernel] += 1
        # Autocast casts at the call and then steps aside, as it does on CUDA: the kernel itself runs uncast.
        with torch.autocast(q.device.type, enabled=False):
            return _KERNELS[kernel](q, k, v, options)

    def describe(self) -> str | None:
        """``flash``, ``efficient, math``...: the kernels the calls took, most used first (None if there was no call)."""
        return ", ".join(name for name, _ in self.kernels.most_common()) or None
