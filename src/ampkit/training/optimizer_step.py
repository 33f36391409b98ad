"""One optimizer step at an accumulation window's end: unscale, check, clip, step or skip, update the scale.

Per step this adds no host-device sync beyond the one that decides whether to skip (none at all with a fused
optimizer and no engine-managed scheduler: the overflow flag reaches the host through a copy that is read once it
has landed, see :mod:`~ampkit.training.step_state`), and no per-tensor kernel loop: unscaling, master-gradient
copies and clipping are single foreach launches. Under ``16-mixed`` with a fused optimizer and clipping, the step
dispatches three ops fewer than torch's ``GradScaler`` loop (unscale_, clip_grad_norm_, step, update) for the same
work, and six more for what that loop lacks: the scale's clamp to its floor and ceiling, four for the collapse
counters and the flag's copy to the host (``tests/unit/training/test_optimizer_step.py`` counts them).
:meth:`ampkit.training.engine.Engine.step` calls :func:`optimizer_step` at each window's end; the engine's doctests
show it at work.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import torch

from .._compat import step_supports_amp_scaling
from ..distributed.agreement import any_rank
from ..errors import LossScaleCollapseError
from ..scaling.kernels import grads_of, unscale_grads_
from .clipping import clip_grad_norm, clip_grad_value
from .fused_step_compile import FusedStepFailed
from .kernel_guards import first_step_pending

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["optimizer_step", "resolve_outcome"]

log = logging.getLogger("ampkit")


def optimizer_step(engine: Engine, opts: list[torch.optim.Optimizer]) -> None:
    """Step (or skip) ``opts`` with the gradients of the window that has just ended, and zero those gradients."""
    state, scaler = engine.step_state, engine.scaler
    if state.deferred is not None:
        # Whatever earlier flags have landed, read without waiting; the oldest waited for only when the host runs
        # so far ahead that every slot is taken.
        resolve_outcome(engine, wait=1 if state.ring_full else 0)
    # A collapse learnt late is diagnosed on the gradients at hand, before they are unscaled or zeroed, and
    # reported once this step is complete.
    late_collapse = engine.diagnose_collapse() if state.diagnose_late else None
    state.diagnose_late = False
    if engine.hooks.active:
        engine.hooks.run("before_optimizer_step", engine)  # the 16-bit gradients as the backward left them
    fused_step = engine.fused_step
    if fused_step is not None and fused_step.ready(opts):
        inv_scale = scaler.inv_scale() if scaler is not None else None
        try:
            found, state.norm = fused_step.step(opts, inv_scale, engine.clip_grad_norm, engine.clip_grad_value, engine.skip_nonfinite)
        except FusedStepFailed as failed:
            # Nothing of the step was taken: take it unfused. Should that fail too, the error is the training's own
            # (a state of the wrong shape, say, which tracing reports wrapped) and propagates, the region left on.
            try:
                _unfused_step(engine, opts, late_collapse)
            except LossScaleCollapseError:
                fused_step.turn_off(failed)  # raised once the step is complete: the unfused step did succeed
                raise
            fused_step.turn_off(failed)
            return
        # The region skipped what overflowed without asking the host; only schedulers need the answer now.
        host_found = _read_flags(found) if engine.schedulers else None
        _finish(engine, opts, found, host_found, late_collapse, copied_back=True)
        return
    _unfused_step(engine, opts, late_collapse)


def _unfused_step(engine: Engine, opts: list[torch.optim.Optimizer], late_collapse: str | None) -> None:
    """The step as separate foreach passes: gradients to the masters, unscale and check, clip, step or skip."""
    state, scaler, dev = engine.step_state, engine.scaler, engine.device
    if engine.masters is not None:
        engine.masters.copy_grads_to_masters()
    params = [[p for g in o.param_groups for p in g["params"]] for o in opts]
    found = [torch.zeros((), dtype=torch.float32, device=dev) for _ in opts] if engine.skip_nonfinite else []
    # A fused SGD with momentum must not see found_inf before its first real step (see kernel_guards).
    fused = [scaler is not None and step_supports_amp_scaling(o) and not first_step_pending(o) for o in opts]
    clipping = engine.clip_grad_norm is not None or engine.clip_grad_value is not None
    unscaled = scaler is not None and (clipping or not all(fused))
    if engine.skip_nonfinite:
        for i, ps in enumerate(params):
            grads = grads_of(ps)
            if unscaled:
                scaler.unscale_(grads, found[i])  # type: ignore[union-attr]
            elif scaler is not None:
                scaler.check_(grads, found[i])  # a fused optimizer unscales inside its own kernel
            else:
                unscale_grads_(grads, torch.ones((), device=dev), found[i])  # check only
        if engine.reduce_found_flags:
            found = any_rank(found)  # one all-reduce for all optimizers; no host sync
    state.norm = None
    if engine.clip_grad_norm is not None:
        # One total norm over everything stepped together, as clip_grad_norm_(model.parameters()) would.
        state.norm = clip_grad_norm([p for ps in params for p in ps], engine.clip_grad_norm)
        if len(found) > 1:
            # That norm is inf if any gradient is, and it has just scaled every gradient: one overflow poisons
            # the whole update, so every optimizer of the call skips.
            found = [torch.stack(found).amax()] * len(found)
    elif engine.clip_grad_value is not None:
        clip_grad_value([p for ps in params for p in ps], engine.clip_grad_value)

    # The one sync: a non-fused optimizer (or a scheduler) has to know on the host whether to step. Fused
    # optimizers skip on the device, and the flag is sent to the host to be read once it lands (see
    # StepState.record_outcome), keeping the step free of syncs: on the CPU too, so that the ops counted there are
    # an accelerator's.
    sync_now = not all(fused) or bool(engine.schedulers)
    host_found = _read_flags(found) if sync_now else None
    for i, opt in enumerate(opts):
        if fused[i]:
            opt.grad_scale = None if unscaled else scaler.scale_tensor  # type: ignore[attr-defined,union-attr]
            opt.found_inf = found[i]  # type: ignore[attr-defined]
            try:
                opt.step()
            finally:
                del opt.grad_scale, opt.found_inf  # type: ignore[attr-defined]
        elif host_found is None or not host_found[i]:
            # bf16-true-sr rounds with the run's own stream, the same on every replica (see rounding_stream).
            with engine.rounding.drawing(opt) if engine.rounding is not None else contextlib.nullcontext():
                if engine.library_step is not None:
                    engine.library_step.step(opt)  # bf16-true-sr: torchao's update of every parameter as one compiled region
                else:
                    opt.step()
    _finish(engine, opts, found, host_found, late_collapse, copied_back=False)


def _read_flags(found: list[torch.Tensor]) -> list[bool] | None:
    """Each optimizer's overflow flag on the host (the one sync); None without flags."""
    if not found:
        return None
    return [bool(found[0].item())] if len(found) == 1 else [bool(v) for v in torch.stack(found).tolist()]


def _finish(
    engine: Engine, opts: list[torch.optim.Optimizer], found: list[torch.Tensor], host_found: list[bool] | None, late_collapse: str | None, *, copied_back: bool
) -> None:
    """After the update: the loss scale, the outcome (``host_found``: the flags read already, or None to defer),
    the 16-bit copy-back, schedulers, zeroed gradients, hooks."""
    state, scaler = engine.step_state, engine.scaler
    any_found = None if not found else found[0] if len(found) == 1 else torch.stack(found).amax()
    if scaler is not None:
        scaler.update(any_found)  # type: ignore[arg-type]
    if host_found is not None and state.deferred is not None:
        resolve_outcome(engine)  # the read above drained the device's queue: these flags have landed, nothing waits
    state.record_outcome(any_found, host_found)
    if state.deferred is not None and reads_are_free(engine.device):
        state.poll()  # a CPU "device" is the host: the copy is done, and the outcome is known at once
    if state.found_host:
        log.debug("step %d skipped: non-finite gradients", state.steps)
    # Diagnose while the offending gradients still exist, but finish the step before raising, so a caller that
    # catches the error holds a consistent model, optimizer and gradient state.
    collapse = engine.diagnose_collapse() if state.found_host else None
    if engine.masters is not None and not copied_back:
        engine.masters.copy_masters_to_model()
    for s in engine.schedulers:
        if not state.found_host and any(s.optimizer is o for o in opts):
            s.step()
    _zero_grad(engine, opts)
    message = collapse or late_collapse
    if message is None and state.found_host is False:
        engine.collapse.clean_step()  # a clean step ends the episode; warn again on the next one
    if engine.hooks.active:
        engine.hooks.run("after_optimizer_step", engine)
    if message is not None:
        engine.collapse.report(message, raise_error=getattr(getattr(scaler, "config", None), "on_collapse", "raise") == "raise")


def resolve_outcome(engine: Engine, wait: int | None = None) -> None:
    """Read the outcomes of earlier (fused, unsynced) steps still on their way, waiting for the oldest ``wait`` of
    them (default: all, which syncs; 0 never waits). A skip among them is diagnosed at the next optimizer step
    (``diagnose_late``); a clean one ends a collapse episode."""
    state = engine.step_state
    if state.deferred is None:
        return
    outcomes = state.poll(wait)
    if any(outcomes):
        state.diagnose_late = True
    if not all(outcomes):
        engine.collapse.clean_step()


def reads_are_free(device: torch.device) -> bool:
    """On the CPU the "device" is the host: reading a flag costs no sync, so a step's outcome is known at once."""
    return device.type == "cpu"


def _zero_grad(engine: Engine, opts: list[torch.optim.Optimizer]) -> None:
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    if engine.masters is not None:
        # Only the 16-bit gradients of what was stepped: another optimizer's pending gradients must survive.
        engine.masters.zero_model_grads({id(p) for o in opts for g in o.param_groups for p in g["params"]})
