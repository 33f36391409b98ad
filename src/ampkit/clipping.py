"""Gradient clipping on unscaled gradients, dense and sparse alike."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["clip_grad_norm", "clip_grad_value"]


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip the gradients of ``params`` to a total 2-norm of ``max_norm``; return the norm before clipping.

    Under FSDP the norm is the global one, over every rank's shards (torch reduces it across the mesh).

    Dense gradients go through ``torch.nn.utils.clip_grad_norm_``; sparse ones (``nn.Embedding(sparse=True)``),
    which it rejects, are coalesced and clipped through their values with the same coefficient. No sync.

    >>> p = torch.nn.Parameter(torch.zeros(2)); p.grad = torch.tensor([3.0, 4.0])
    >>> clip_grad_norm([p], 1.0), p.grad
    (tensor(5.), tensor([0.6000, 0.8000]))
    """
    with_grad = [p for p in params if p.grad is not None]
    sparse = [p for p in with_grad if p.grad.is_sparse]
    if not sparse:
        total = torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
        # Sharded (FSDP) gradients give the global norm over every shard as a replicated DTensor.
        return total.full_tensor() if hasattr(total, "full_tensor") else total
    for p in sparse:
        p.grad = p.grad.coalesce()  # duplicate indices must be summed before their norm means anything
    tensors = [p.grad for p in with_grad if not p.grad.is_sparse] + [p.grad._values() for p in sparse]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t, dtype=torch.float32) for t in tensors]))
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
