"""Gradient clipping on unscaled gradients, dense and sparse alike."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["clip_grad_norm", "clip_grad_value"]


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip the gradients of ``params`` to a total 2-norm of ``max_norm``; return the norm before clipping.

    Under FSDP the norm is the global one, over every rank's shards (torch reduces it across the mesh).

    Dense gradients go through ``torch.nn.utils.clip_grad_norm_``. Two cases it gets wrong take another path with
    the same coefficient: sparse gradients (``nn.Embedding(sparse=True)``), which it rejects, are coalesced and
    clipped through their values; and fp16 gradients, whose norm it computes in fp16, where a finite gradient of
    norm above 65504 gives inf and a coefficient of 0 that silently zeroes the whole update. There the norm is
    accumulated and returned in fp32 (not yet for sharded fp16 gradients, which torch reduces). No sync.

    >>> p = torch.nn.Parameter(torch.zeros(2)); p.grad = torch.tensor([3.0, 4.0])
    >>> clip_grad_norm([p], 1.0), p.grad
    (tensor(5.), tensor([0.6000, 0.8000]))
    """
    with_grad = [p for p in params if p.grad is not None]
    sparse = [p for p in with_grad if p.grad.is_sparse]
    # Sharded (DTensor) fp16 gradients stay on torch's path, the one that reduces their norm across the mesh.
    # The set comprehension first: the common case (no fp16 gradient) pays one cheap pass and no generator.
    fp16 = torch.float16 in {p.grad.dtype for p in with_grad} and any(
        p.grad.dtype == torch.float16 and not hasattr(p.grad, "full_tensor") for p in with_grad
    )
    if not sparse and not fp16:
        total = torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
        # Sharded (FSDP) gradients give the global norm over every shard as a replicated DTensor.
        return total.full_tensor() if hasattr(total, "full_tensor") else total
    for p in sparse:
        p.grad = p.grad.coalesce()  # duplicate indices must be summed before their norm means anything
    tensors = [p.grad for p in with_grad if not p.grad.is_sparse] + [p.grad._values() for p in sparse]
    # One foreach launch per device and dtype, each norm accumulated and returned in fp32.
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)))
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(tensors, coef)
    return total


def clip_grad_value(params: Sequence[torch.Tensor], clip_value: float) -> None:
    """Clamp every gradient element of ``params`` to ``[-clip_value, clip_value]`` (torch's clip_grad_value_)."""
    torch.nn.utils.clip_grad_value_([p for p in params if p.grad is not None and not p.grad.is_sparse], clip_value)
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            p.grad = p.grad.coalesce()
            p.grad._values().clamp_(-clip_value, clip_value)
