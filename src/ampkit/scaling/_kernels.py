"""Gradient unscaling and non-finite checks on torch's fused kernels.

One ``torch._amp_foreach_non_finite_check_and_unscale_`` launch per (device, dtype), as in
``torch.amp.GradScaler``: the CUDA kernel dispatches on the first tensor's dtype, so a mixed list must never
reach it. The Python loop here only gathers references (what torch's own optimizers do), never one kernel per
tensor. Sparse gradients are handled through their values, coalescing fp16 ones first so duplicate indices
cannot hide an overflow, exactly as GradScaler does.

Where the kernel lacks a dtype (torch's CUDA kernel has no bfloat16 overload), the same result comes from two
foreach launches: an fp32-accumulated 1-norm per tensor (inf or NaN when an element is) and a multiply
in fp32 rounded once to the gradient's dtype, as the kernel computes it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .._compat import DTensor, amp_non_finite_check_and_unscale_

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
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    for (device, dtype), group in groups.items():
        local_found = found_inf if device == found_inf.device else torch.zeros((), dtype=torch.float32, device=device)
        local_inv = inv_scale.to(device, non_blocking=True)
        if (device.type, dtype) in _KERNEL_LACKS:
            _check_and_unscale_foreach_(group, local_found, local_inv)
        else:
            try:
                amp_non_finite_check_and_unscale_(group, local_found, local_inv)
            except NotImplementedError:
                # Raised by the dtype dispatch before any tensor is touched; remembered, so it is paid once.
                _KERNEL_LACKS.add((device.type, dtype))
                _check_and_unscale_foreach_(group, local_found, local_inv)
        if local_found is not found_inf:
            found_inf.add_(local_found.to(found_inf.device, non_blocking=True))
    return found_inf


_KERNEL_LACKS: set[tuple[str, torch.dtype]] = set()
"""(device type, dtype) pairs torch's fused unscale kernel refuses (found at the first call)."""


def _check_and_unscale_foreach_(group: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """The fused kernel's effect with foreach ops, for dtypes it lacks. Same device and dtype throughout; no sync."""
    # A 1-norm accumulated in fp32 is inf or NaN when some element is; finite gradients overflow it only when
    # their magnitudes sum past fp32's 3.4e38, gradients a backoff is right to shrink anyway.
    norms = torch._foreach_norm(group, 1, dtype=torch.float32)
    found_inf.clamp_(min=(~torch.stack(norms).isfinite().all()).float())  # set to 1.0 as the kernel does
    torch._foreach_mul_(group, inv_scale)
