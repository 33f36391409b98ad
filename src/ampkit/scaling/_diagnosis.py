"""The message a collapsed loss scale deserves: what happened, which parameters, what to change."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

__all__ = ["nonfinite_parameters", "collapse_message"]


def nonfinite_parameters(named_params: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Names of parameters whose gradient holds an inf or NaN.

    Runs one check per tensor and syncs, so it is called only when a collapse is diagnosed, never per step.

    >>> w = torch.nn.Parameter(torch.ones(2)); w.grad = torch.tensor([1.0, float("nan")])
    >>> nonfinite_parameters([("fc.weight", w)])
    ['fc.weight']
    """
    names = []
    for name, p in named_params:
        g = p.grad
        if g is None:
            continue
        values = g.coalesce()._values() if g.is_sparse else g
        if not bool(torch.isfinite(values).all()):
            names.append(name)
    return names


def collapse_message(reason: str, offenders: Sequence[str], policy: str) -> str:
    """Compose the diagnosis: the reason, the offending parameters and their modules, and the fixes."""
    modules = sorted({n.rsplit(".", 1)[0] if "." in n else n for n in offenders})
    shown = ", ".join(offenders[:10]) + (f" and {len(offenders) - 10} more" if len(offenders) > 10 else "")
    where = (
        f" Non-finite gradients in: {shown}."
        f" Keep their modules in fp32 with keep_fp32={modules!r}, or train in 'bf16-mixed', which needs no"
        " loss scaling."
        if offenders
        else " No gradient is non-finite now, so the overflow happened earlier in backward (check the loss and"
        " activations for inf/NaN)."
    )
    return (
        f"Loss scaling collapsed under policy {policy!r}: {reason}.{where}"
        " If the loss itself is inf/NaN, fix the model or the data: no loss scale can help."
    )
