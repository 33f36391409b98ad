"""The fused master step's region: the code torch.compile traces, as one graph, for
:class:`~ampkit.training._fused_master_step.FusedMasterStep` (which gathers its arguments each step).

Run as it is, it is the same step uncompiled (one bf16 parameter, its fp32 master, clipped to norm 1):

    >>> model = torch.ones(2, dtype=torch.bfloat16); model.grad = torch.full((2,), 2.0, dtype=torch.bfloat16)
    >>> master = torch.nn.Parameter(torch.ones(2)); master.grad = torch.empty(2)  # the gradient's fp32 buffer
    >>> opt = torch.optim.SGD([master], lr=0.25)
    >>> found, norm = step_region([[model]], [[master]], [opt], [model], [master], None, 1.0, None, True)
    >>> master.detach(), model, found, norm
    (tensor([0.8232, 0.8232]), tensor([0.8242, 0.8242], dtype=torch.bfloat16), [tensor(0.)], tensor(2.8284))
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["step_region", "traced_step"]


def step_region(*args: Any) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """What torch.compile is given (a copy with its own code, see :func:`ampkit._compat.own_code`): the traced
    step under no_grad, entered here rather than by a decorator, whose wrapper's code every copy would share."""
    with torch.no_grad():
        return traced_step(*args)


def traced_step(
    sources: list[list[torch.Tensor]],
    stepped: list[list[torch.Tensor]],
    opts: list[torch.optim.Optimizer],
    model_params: list[torch.Tensor],
    masters: list[torch.Tensor],
    inv_scale: torch.Tensor | None,
    clip_grad_norm: float | None,
    clip_grad_value: float | None,
    skip_nonfinite: bool,
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The traced step. Per optimizer: fp32 gradients, unscaled; a found-inf flag; one norm over all of them; the
    update, undone where the flag is set; then the 16-bit copy of every master."""
    # Unscaled after the cast to fp32, so gradients that fp16 held only while scaled are not flushed to zero.
    grads = [[_grad(p).to(torch.float32) for p in ps] for ps in sources]
    if inv_scale is not None:
        grads = [[g * inv_scale for g in gs] for gs in grads]
    found = [_any_nonfinite(gs) for gs in grads] if skip_nonfinite else []
    norm = None
    flat = [g for gs in grads for g in gs]
    if clip_grad_norm is not None and flat:
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in flat]))
        coef = (clip_grad_norm / (norm + 1e-6)).clamp(max=1.0)
        if found:
            # An overflow anywhere poisons the norm, so every optimizer skips (as the unfused step does); the
            # gradients are then left as they are, for the diagnosis of which parameters overflowed.
            found = [torch.stack(found).any()] * len(found)
            coef = torch.where(found[0], 1.0, coef)
        grads = [[g * coef for g in gs] for gs in grads]
    elif clip_grad_value is not None:
        grads = [[g.clamp(-clip_grad_value, clip_grad_value) for g in gs] for gs in grads]
    for i, (ps, gs, opt) in enumerate(zip(stepped, grads, opts)):
        torch._foreach_copy_([_grad(p) for p in ps], gs)
        # What the update writes: the parameters and every tensor of their state (moments, step counts, buffers).
        written = [*ps, *(t for p in ps for t in opt.state[p].values() if isinstance(t, torch.Tensor))]
        before = [t.clone() for t in written] if found else []
        inspect.unwrap(type(opt).step)(opt)  # torch's update, traced; the wrapper only graph-breaks and runs hooks
        for t, old in zip(written, before):
            t.copy_(torch.where(found[i], old, t))
    torch._foreach_copy_(model_params, masters)
    return [f.to(torch.float32) for f in found], norm


def _grad(p: torch.Tensor) -> torch.Tensor:
    """``p``'s gradient. The region is handed only parameters that have one (FusedMasterStep.step leaves out the
    rest); compiled, this test is decided while tracing (dynamo guards on each gradient), so the step pays nothing."""
    grad = p.grad
    if grad is None:
        raise RuntimeError("the fused master step was handed a parameter without a gradient (a bug in ampkit)")
    return grad


def _any_nonfinite(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([~torch.isfinite(g).all() for g in grads]).any()
