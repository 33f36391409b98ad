"""Gradient unscaling and non-finite checks on torch's fused kernels.

One ``torch._amp_foreach_non_finite_check_and_unscale_`` launch per device, as in ``torch.amp.GradScaler``;
the Python loop here only gathers references (what torch's own optimizers do), never one kernel per tensor.
Sparse gradients are handled through their values, coalescing fp16 ones first so duplicate indices cannot
hide an overflow, exactly as GradScaler does.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch < 2.5, or a build without distributed
    from torch.distributed._tensor import DTensor  # type: ignore[no-redef]

__all__ = ["unscale_grads_", "grads_of"]


def grads_of(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The dense tensors to unscale for ``params``: each present grad, or the values of a sparse one.

    A sharded (DTensor) gradient contributes this rank's shard, which the fused kernels update in place.
    """
    out: list[torch.Tensor] = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            out.append(g._local_tensor)  # the shard itself (to_local() would return an autograd alias)
            continue
        if g.is_sparse:
            if g.dtype == torch.float16 and not g.is_coalesced():
                p.grad = g = g.coalesce()
            g = g._values()
        out.append(g)
    return out


def unscale_grads_(grads: list[torch.Tensor], inv_scale: torch.Tensor, found_inf: torch.Tensor) -> torch.Tensor:
    """Multiply ``grads`` by ``inv_scale`` in place (a tensor of 1.0 only checks) and set ``found_inf`` on inf/NaN.

    ``found_inf`` is a float32 0-dim tensor on the scaler's device; no host-device sync happens here.

    >>> g = [torch.tensor([2.0, float("inf")])]
    >>> unscale_grads_(g, torch.tensor(0.5), torch.zeros(()))
    tensor(1.)
    """
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g)
    for device, group in by_device.items():
        local_found = found_inf if device == found_inf.device else torch.zeros((), device=device)
        local_inv = inv_scale.to(device, non_blocking=True)
        torch._amp_foreach_non_finite_check_and_unscale_(group, local_found, local_inv)
        if local_found is not found_inf:
            found_inf.add_(local_found.to(found_inf.device, non_blocking=True))
    return found_inf
