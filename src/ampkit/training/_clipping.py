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
    # Each pass below reads p.grad into g again, tested for None: a type checker does not carry the filter above.
    sparse = [(p, g) for p in with_grad if (g := p.grad) is not None and g.is_sparse]
    # Sharded (DTensor) fp16 gradients stay on torch's path, the one that reduces their norm across the mesh.
    # The set comprehension first: the common case (no fp16 gradient) pays one cheap pass and no generator.
    fp16 = torch.float16 in {g.dtype for p in with_grad if (g := p.grad) is not None} and any(
        g.dtype == torch.float16 and not hasattr(g, "full_tensor") for p in with_grad if (g := p.grad) is not None
    )
    if not sparse and not fp16:
        total = torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
        # Sharded (FSDP) gradients give the global norm over every shard as a replicated DTensor.
        return total.full_tensor() if hasattr(total, "full_tensor") else total
    tensors = [g for p in with_grad if (g := p.grad) is not None and not g.is_sparse]
    for p, g in sparse:
        p.grad = coalesced = g.coalesce()  # duplicate indices must be summed before their norm means anything
        tensors.append(coalesced._values())
    # One foreach launch per device and dtype, each norm accumulated and returned in fp32.
    # A typed local: torch declares no type for torch.linalg.vector_norm (made by _add_docstr, 2.13).
    norm: torch.Tensor = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)))
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(tensors, coef)
    return norm


def clip_grad_value(params: Sequence[torch.Tensor], clip_value: float) -> None:
    """Clamp every gradient element of ``params`` to ``[-clip_value, clip_value]`` (torch's clip_grad_value_)."""
    torch.nn.utils.clip_grad_value_([p for p in params if p.grad is not None and not p.grad.is_sparse], clip_value)
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            p.grad = p.grad.coalesce()
            p.grad._values().clamp_(-clip_value, clip_value)
