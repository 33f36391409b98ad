"""The unfused optimizer step, as separate foreach passes: check (or unscale) the gradients, combine the ranks'
flags, clip, then step each optimizer or skip it.

:class:`~ampkit.training.OptimizerStep` owns the parts these passes use and calls :func:`unfused_step` where its
compiled master-weight region does not take the step; the function keeps nothing and writes no attribute of its
caller: it returns the flags, their host copy and the norm. One host-device sync at most, :func:`read_flags`, and
only where a non-fused optimizer, a scheduler or ``skip_nonfinite='raise'`` has to know on the host whether to step.

    >>> from torch import nn
    >>> from ampkit.scaling import StaticLossScaler
    >>> from ampkit.training._step_records import StepSettings
    >>> model = nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> scaler = StaticLossScaler(4.0)
    >>> scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    >>> found, host_found, norm = unfused_step([opt], [False], [None], scaler=scaler, settings=StepSettings(skip_nonfinite=True, clip_grad_norm=10.0))
    >>> host_found, float(norm), model.bias.grad  # unscaled by 4, checked, clipped (within the norm), stepped
    ([False], 1.7320507764816284, tensor([1.]))
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from .._compat import step_supports_amp_scaling
from ..distributed._agreement import any_rank
from ..scaling._kernels import grads_of, unscale_grads_
from ..scaling._protocol import StepScaler
from ._clipping import clip_grad_norm, clip_grad_value
from ._fused_library_step import FusedLibraryStep
from ._kernel_guards import first_step_pending
from ._rounding_stream import RoundingStream
from ._step_records import StepSettings

__all__ = ["check_grads", "read_flags", "unfused_step"]


def check_grads(grads: list[torch.Tensor], found: torch.Tensor, scaler: StepScaler | None, device: torch.device, *, unscale: bool = True) -> None:
    """Record in ``found`` whether ``grads`` hold an inf or NaN; divide them by the loss scale too, unless ``unscale``
    is False (a fused optimizer unscales inside its own kernel). Without a scaler, only checks. No sync."""
    if scaler is None:
        unscale_grads_(grads, torch.ones((), device=device), found)  # check only
    elif unscale:
        scaler.unscale_(grads, found)
    else:
        scaler.check_(grads, found)


def unfused_step(
    opts: Sequence[torch.optim.Optimizer],
    ahead: Sequence[bool],
    taken: Sequence[torch.Tensor | None],
    *,
    scaler: StepScaler | None,
    settings: StepSettings,
    device: torch.device | None = None,
    reduce_found_flags: bool = False,
    rounding: RoundingStream | None = None,
    library: FusedLibraryStep | None = None,
    read_host: str = "",
) -> tuple[list[torch.Tensor], list[bool] | None, torch.Tensor | None]:
    """Step or skip ``opts`` on their gradients (the masters' where there are masters: copied there already).

    ``ahead[i]``: ``unscale_()`` took optimizer ``i``'s gradients already (unscaled and checked), its flag in
    ``taken[i]`` (None where nothing was checked). ``read_host``: why to read the flags on the host even if every
    optimizer is fused ('' for no such reason: a scheduler steps only after a real step; ``skip_nonfinite='raise'``
    stops at the step). Returns each optimizer's overflow flag on the device (empty
    without ``skip_nonfinite``), the flags on the host (None where not read), and the total norm before clipping
    (None without ``clip_grad_norm``).
    """
    dev = device if device is not None else torch.device("cpu")
    params = [[p for g in o.param_groups for p in g["params"]] for o in opts]
    found = [t if t is not None else torch.zeros((), dtype=torch.float32, device=dev) for t in taken] if settings.skip_nonfinite else []
    # A fused optimizer (AdamW/Adam/SGD(fused=True)) takes the flag and skips on the device, scaled or not; a fused
    # SGD with momentum must not see found_inf before its first real step (see kernel_guards).
    fused = [settings.skip_nonfinite and step_supports_amp_scaling(o) and not first_step_pending(o) for o in opts]
    clipping = settings.clip_grad_norm is not None or settings.clip_grad_value is not None
    unscaled = scaler is not None and (clipping or not all(fused) or any(ahead))
    # Without a scale to divide by, the total norm that clipping computes anyway is inf or NaN exactly when a gradient
    # is (or when finite fp32 gradients sum their squares past 3.4e38, a step no run should take): it is the check,
    # and no pass over the gradients is added to the step.
    from_norm = settings.skip_nonfinite and scaler is None and settings.clip_grad_norm is not None and not any(ahead)
    if settings.skip_nonfinite and not from_norm:
        for i, ps in enumerate(params):
            if not ahead[i]:
                check_grads(grads_of(ps), found[i], scaler, dev, unscale=unscaled)
        if reduce_found_flags:
            found = any_rank(found)  # one all-reduce for all optimizers; no host sync
    norm = None
    if settings.clip_grad_norm is not None:
        # One total norm over everything stepped together, as clip_grad_norm_(model.parameters()) would.
        norm = clip_grad_norm([p for ps in params for p in ps], settings.clip_grad_norm)
        if from_norm:
            check_grads([norm.float()], found[0], None, dev)  # multiplies the norm by one: it keeps its value
            found = any_rank(found[:1]) if reduce_found_flags else found[:1]  # a rank's own norm where ranks hold their own gradients
            found = found * len(opts)
        elif len(found) > 1:
            # That norm is inf if any gradient is, and it has just scaled every gradient: one overflow poisons
            # the whole update, so every optimizer of the call skips.
            found = [torch.stack(found).amax()] * len(found)
    elif settings.clip_grad_value is not None:
        clip_grad_value([p for ps in params for p in ps], settings.clip_grad_value)

    # The one sync, once per optimizer step (never per micro-batch): a non-fused optimizer (a foreach or plain
    # one: torch's step takes no flag), a scheduler, or skip_nonfinite='raise' has to know on the host whether to
    # step. Fused optimizers skip on the device, and the flag is sent to the host to be read once it lands (see
    # StepState.record_outcome), keeping the step free of syncs: on the CPU too, so that the ops counted there
    # are an accelerator's.
    if found and not all(fused):
        # The reason is worded only where ampkit.profile asks for it: a closure per step, not a string.
        host_found = read_flags(found, lambda: _why_unfused(opts, fused))
    else:
        host_found = read_flags(found, read_host) if read_host else None
    for i, opt in enumerate(opts):
        if fused[i]:
            # torch's fused optimizers read these attributes (GradScaler sets them too); torch's Optimizer does not declare them.
            opt.grad_scale = None if unscaled or scaler is None else scaler.scale_tensor  # type: ignore[attr-defined]
            opt.found_inf = found[i]  # type: ignore[attr-defined]
            try:
                opt.step()
            finally:
                del opt.grad_scale, opt.found_inf  # type: ignore[attr-defined]
        elif host_found is None or not host_found[i]:
            # bf16-true-sr rounds with the run's own stream, the same on every replica (see rounding_stream).
            with rounding.drawing(opt) if rounding is not None else contextlib.nullcontext():
                if library is not None:
                    library.step(opt)  # bf16-true-sr: torchao's update of every parameter as one compiled region
                else:
                    opt.step()
    return found, host_found, norm


def _why_unfused(opts: Sequence[torch.optim.Optimizer], fused: Sequence[bool]) -> str:
    """Why the step reads its flags on the host: an optimizer that takes no flag, or a fused SGD's guarded first step."""
    plain = sorted({type(o).__name__ for o, f in zip(opts, fused, strict=True) if not f and not step_supports_amp_scaling(o)})
    if plain:
        return f"{' and '.join(plain)} {'takes' if len(plain) == 1 else 'take'} no found_inf flag (not fused)"
    return "a fused SGD with momentum is kept from skipping its first step (torch's kernel is wrong after one)"


def read_flags(found: list[torch.Tensor], why: str | Callable[[], str] = "") -> list[bool] | None:
    """Each optimizer's overflow flag on the host (the one sync); None without flags.

    ``why``: the reason the step must know on the host, or a function that words it. It is not used here:
    ampkit.profile's sync table, which finds this function's frame under the read, names it beside the user's line.

    >>> read_flags([torch.zeros(()), torch.ones(())]), read_flags([])
    ([False, True], None)
    """
    if not found:
        return None
    return [bool(found[0].item())] if len(found) == 1 else [bool(v) for v in torch.stack(found).tolist()]
