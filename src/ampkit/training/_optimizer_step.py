"""The optimizer step as a component: built at setup, it owns what one step at a window's end is made of.

:class:`OptimizerStep` holds the loss scaler, the fp32 master weights, the compiled steps (the master-weight region
and the library region), the stochastic rounding's stream, the kernel guards, the clipping settings and the
collapse watch; nothing else writes them. :meth:`ampkit.training.Engine.step` calls :meth:`OptimizerStep.step`
at each window's end, which unscales, checks, clips, steps or skips, updates the scale and returns a
:class:`StepOutcome`; a checkpoint takes the component's state through :meth:`OptimizerStep.state_dict` (the
scaler's, the masters', the stream's, under the keys checkpoints have always used). What it is given and returns
are records of their own (:mod:`~ampkit.training._step_records`); the unfused step's foreach passes, which keep
nothing, are :func:`~ampkit.training._step_passes.unfused_step`.

Per step this adds no host-device sync beyond the one that decides whether to skip (none at all with a fused
optimizer and no engine-managed scheduler: the overflow flag reaches the host through a copy that is read once it
has landed, see :mod:`~ampkit.training._step_state`), and no per-tensor kernel loop: unscaling, master-gradient
copies and clipping are single foreach launches. Under ``16-mixed`` with a fused optimizer and clipping, the step
dispatches three ops fewer than torch's ``GradScaler`` loop (unscale_, clip_grad_norm_, step, update) for the same
work, and six more for what that loop lacks: the scale's clamp to its floor and ceiling, four for the collapse
counters and the flag's copy to the host (``tests/unit/training/test_optimizer_step.py`` counts them).

    >>> from torch import nn
    >>> from ampkit.scaling import StaticLossScaler
    >>> model = nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> step = OptimizerStep([opt], settings=StepSettings(skip_nonfinite=True), scaler=StaticLossScaler(4.0))
    >>> step.scale_loss(model(torch.ones(1, 2)).sum()).backward()
    >>> step.step([opt])
    StepOutcome(skipped=False, fused=False)
    >>> model.weight.grad is None  # the step zeroes what it took
    True
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from .._errors import LossScaleCollapseError
from ..policy._masters import MasterWeights
from ..scaling._kernels import grads_of
from ..scaling._protocol import StepScaler
from ._collapse import CollapseWatch
from ._fused_library_step import FusedLibraryStep
from ._fused_master_step import FusedMasterStep
from ._fused_step_compile import FusedStepFailed
from ._hooks import HookPoint, Hooks
from ._kernel_guards import guard_optimizer
from ._rounding_stream import RoundingStream
from ._schedule_watch import ScheduleWatch
from ._step_passes import check_grads, read_flags, unfused_step
from ._step_records import StepOutcome, StepSettings
from ._step_state import StepState

__all__ = ["OptimizerStep", "StepOutcome", "StepSettings"]

log = logging.getLogger("ampkit")


class OptimizerStep:
    """Steps (or skips) the optimizers at a window's end; owns the parts a step is made of (see the module docstring).

    Args:
        optimizers: the optimizers it may step; their kernel guards are applied here, once.
        schedulers: LR schedulers stepped after each real (not skipped) step of their optimizer.
        settings: clipping and skipping.
        scaler: the loss scaler (moved to ``device`` here), or None.
        masters: fp32 master weights the optimizers step in place of the 16-bit model, or None.
        fused: the compiled master-weight region, or None; ``library``: the compiled library step, or None.
        rounding: the stochastic rounding's stream, or None.
        state: where the outcome is recorded (the engine's :class:`~ampkit.training.StepState`).
        device: the training device; ``names``: parameter names by ``id`` (collapse messages name them).
        reduce_found_flags: combine the ranks' overflow flags before deciding (FSDP, or no DDP).
        hooks: the step hooks, called with ``owner`` before and after the step.
        owner: what the hooks are called with (the engine).
        policy_name: named in a collapse message.
    """

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer] = (),
        schedulers: Sequence[Any] = (),
        *,
        settings: StepSettings = StepSettings(),  # noqa: B008 - a frozen dataclass: one shared default is safe
        scaler: StepScaler | None = None,
        masters: MasterWeights | None = None,
        fused: FusedMasterStep | None = None,
        library: FusedLibraryStep | None = None,
        rounding: RoundingStream | None = None,
        state: StepState | None = None,
        device: torch.device | None = None,
        names: dict[int, str] | None = None,
        reduce_found_flags: bool = False,
        hooks: Hooks | None = None,
        owner: Any = None,
        policy_name: str = "",
    ) -> None:
        if scaler is not None and not settings.skip_nonfinite:
            raise ValueError("A scaled loss must skip steps whose gradients overflowed; drop skip_nonfinite=False or pass scaler='none'.")
        self.optimizers = list(optimizers)
        self.schedulers = list(schedulers)
        self.settings = settings
        device = device if device is not None else torch.device("cpu")
        if scaler is not None:
            scaler.to(device)  # in place; what to() returns is not the scaler (a user's may return None)
        self.scaler = scaler
        self.masters, self.fused, self.library, self.rounding = masters, fused, library, rounding
        self.collapse = CollapseWatch()
        self.reduce_found_flags = reduce_found_flags
        self.device = device
        self._state = state if state is not None else StepState()
        self._names = dict(names or {})
        self._hooks, self._owner, self._policy_name = hooks, owner, policy_name
        # The window's gradients taken ahead of the step by unscale_(): each such optimizer's overflow flag (None
        # where nothing is checked), whether the masters hold their copy, whether the hooks have seen them.
        self._unscaled: dict[int, torch.Tensor | None] = {}
        self._masters_copied = False
        self._hooks_ran = False
        self.schedule_watch = ScheduleWatch()  # schedulers stepped by hand, or decaying on skipped steps
        self.schedule_watch.note(self.schedulers)
        for opt in self.optimizers:
            guard_optimizer(opt)  # known torch kernel defects, once the parameters' dtypes and devices are final

    # ------------------------------------------------------------------------------------------ the loss side
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the loss scale (``loss`` itself without scaling). No sync."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscaled(self, grads: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Gradients of a scaled output (``Engine.grad``) divided by the scale. No sync."""
        if self.scaler is None:
            return tuple(grads)
        return tuple(torch._foreach_mul(list(grads), self.scaler.inv_scale()))

    def stepping(self, optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
        """The optimizers a step call names (all of them by default); refuses one this step was not built with."""
        if not optimizers:
            return self.optimizers
        unknown = [type(o).__name__ for o in optimizers if not any(o is s for s in self.optimizers)]
        if unknown:
            raise ValueError(f"Optimizer(s) {unknown} were not passed to engine.setup(); pass them there first.")
        return list(optimizers)

    # ------------------------------------------------------------------------------------------ the step
    @property
    def unscaled_ahead(self) -> bool:
        """Whether :meth:`unscale_` has taken gradients that no step has taken since (no backward may add to them)."""
        return bool(self._unscaled)

    def unscale_(self, opts: Sequence[torch.optim.Optimizer]) -> None:
        """Unscale and check the gradients of ``opts`` now, ahead of :meth:`step`: ``GradScaler.unscale_``'s protocol,
        for code that reads or clips gradients between the backward and the step (a framework's gradient-norm
        logging, its own clipping). Where there are masters, the gradients are copied there first: the optimizers'
        parameters hold the unscaled fp32 gradients. The step then takes these gradients and flags as they are. No sync.

        >>> from torch import nn
        >>> from ampkit.scaling import StaticLossScaler
        >>> model = nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> step = OptimizerStep([opt], settings=StepSettings(skip_nonfinite=True), scaler=StaticLossScaler(4.0))
        >>> step.scale_loss(model(torch.ones(1, 2)).sum()).backward(); step.unscale_([opt])
        >>> model.bias.grad  # 4.0 before
        tensor([1.])
        """
        again = [type(o).__name__ for o in opts if id(o) in self._unscaled]
        if again:
            raise RuntimeError(f"unscale_() was called already on {again} since its last step; call it once per step, before reading or clipping the gradients.")
        if not self._hooks_ran:
            self._run_hooks("before_optimizer_step")  # the gradients as the backward left them, before they change
            self._hooks_ran = True
        self._copy_to_masters()
        scaler, dev = self.scaler, self.device
        for opt in opts:
            found = torch.zeros((), dtype=torch.float32, device=dev) if self.settings.skip_nonfinite else None
            if found is not None:
                check_grads(grads_of([p for g in opt.param_groups for p in g["params"]]), found, scaler, dev)
            self._unscaled[id(opt)] = found

    def _copy_to_masters(self) -> None:
        """The 16-bit gradients to the fp32 masters, once per step (unscale_() may have done it)."""
        if self.masters is not None and not self._masters_copied:
            self.masters.copy_grads_to_masters()
            self._masters_copied = True

    def step(self, opts: Sequence[torch.optim.Optimizer]) -> StepOutcome:
        """Step (or skip) ``opts`` with the gradients of the window that has just ended, and zero those gradients.

        Raises :class:`~ampkit.LossScaleCollapseError` once the step is complete, when the scale has
        collapsed and the scaler says to raise.
        """
        state, scaler, settings = self._state, self.scaler, self.settings
        # Before anything changes: an adopted scheduler stepped by hand is refused, and after a skipped step a
        # learning rate that moved without the engine is named (one compare per scheduler; nothing read otherwise).
        self.schedule_watch.check(self.schedulers)
        self.schedule_watch.check_lrs(state.steps)
        if state.deferred is not None:
            # Whatever earlier flags have landed, read without waiting; the oldest waited for only when the host runs
            # so far ahead that every slot is taken.
            self.resolve(wait=1 if state.ring_full else 0)
        # A collapse learnt late is diagnosed on the gradients at hand, before they are unscaled or zeroed, and
        # reported once this step is complete.
        late_collapse = self.diagnose_collapse() if state.diagnose_late else None
        state.diagnose_late = False
        if not self._hooks_ran:
            self._run_hooks("before_optimizer_step")  # the 16-bit gradients as the backward left them
        fused = self.fused
        if fused is not None and fused.ready(opts) and not self._unscaled:
            inv_scale = scaler.inv_scale() if scaler is not None else None
            try:
                found, state.norm = fused.step(opts, inv_scale, settings.clip_grad_norm, settings.clip_grad_value, settings.skip_nonfinite)
            except FusedStepFailed as failed:
                # Nothing of the step was taken: take it unfused. Should that fail too, the error is the training's own
                # (a state of the wrong shape, say, which tracing reports wrapped) and propagates, the region left on.
                try:
                    outcome = self._unfused(opts, late_collapse)
                except LossScaleCollapseError:
                    fused.turn_off(failed)  # raised once the step is complete: the unfused step did succeed
                    raise
                fused.turn_off(failed)
                return outcome
            # The region skipped what overflowed without asking the host; only schedulers (or 'raise') need the answer now.
            host_found = read_flags(found, self._read_host) if self._read_host else None
            return self._finish(opts, found, host_found, late_collapse, fused=True)
        return self._unfused(opts, late_collapse)

    def _unfused(self, opts: Sequence[torch.optim.Optimizer], late_collapse: str | None) -> StepOutcome:
        """The step as separate foreach passes (:func:`~ampkit.training._step_passes.unfused_step`): gradients to the
        masters, unscale and check, clip, step or skip."""
        self._copy_to_masters()
        # Optimizers whose gradients unscale_() took already: their flags stand, their gradients are unscaled.
        ahead = [id(o) in self._unscaled for o in opts]
        taken = [self._unscaled.pop(id(o), None) for o in opts]
        found, host_found, self._state.norm = unfused_step(
            opts, ahead, taken, scaler=self.scaler, settings=self.settings, device=self.device,
            reduce_found_flags=self.reduce_found_flags, rounding=self.rounding, library=self.library,
            read_host=self._read_host,
        )  # fmt: skip
        return self._finish(opts, found, host_found, late_collapse, fused=False)

    def _finish(
        self, opts: Sequence[torch.optim.Optimizer], found: list[torch.Tensor], host_found: list[bool] | None, late_collapse: str | None, *, fused: bool
    ) -> StepOutcome:
        """After the update: the loss scale, the outcome (``host_found``: the flags read already, or None to defer),
        the 16-bit copy-back (the fused region made it), schedulers, zeroed gradients, hooks."""
        state, scaler = self._state, self.scaler
        self._masters_copied = self._hooks_ran = False  # the next step's gradients come from the next backward
        any_found = None if not found else found[0] if len(found) == 1 else torch.stack(found).amax()
        if scaler is not None and any_found is not None:  # a scaler comes with the checks (see __init__)
            scaler.update(any_found)
        if host_found is not None and state.deferred is not None:
            self.resolve()  # the read above drained the device's queue: these flags have landed, nothing waits
        state.record_outcome(any_found, host_found)
        if state.deferred is not None and reads_are_free(self.device):
            state.poll()  # a CPU "device" is the host: the copy is done, and the outcome is known at once
        # Diagnose while the offending gradients still exist, but finish the step before raising, so a caller that
        # catches the error holds a consistent model, optimizer and gradient state.
        collapse = self.diagnose_collapse() if state.found_host else None
        if self.masters is not None and not fused:
            self.masters.copy_masters_to_model()
        for s in self.schedulers:
            if not state.found_host and any(s.optimizer is o for o in opts):
                s.step()
        if self.schedulers:
            self.schedule_watch.note(self.schedulers)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        if self.masters is not None:
            # Only the 16-bit gradients of what was stepped: another optimizer's pending gradients must survive.
            self.masters.zero_model_grads({id(p) for o in opts for g in o.param_groups for p in g["params"]})
        message = collapse or late_collapse
        if message is None and state.found_host is False:
            self.collapse.clean_step()  # a clean step ends the episode; warn again on the next one
        self._run_hooks("after_optimizer_step")
        self._report_skips()  # skip_nonfinite='raise': raised here, once the step is complete
        if message is not None:
            self.collapse.report(message, raise_error=scaler is None or scaler.on_collapse == "raise")
        return StepOutcome(skipped=state.found_host, fused=fused, found=any_found, norm=state.norm)

    @property
    def _read_host(self) -> str:
        """Why every step reads its flag on the host, fused or not ('' where none does): a scheduler steps only after
        a real step, and skip_nonfinite='raise' stops at the step itself (one sync per optimizer step, on an
        accelerator). The reason is what ampkit.profile names at the read."""
        if self.schedulers:
            return "a scheduler given to setup() steps only after a step that was taken"
        if self.settings.on_nonfinite == "raise":
            return "skip_nonfinite='raise' stops at the step itself"
        return ""

    def _report_skips(self) -> None:
        """Report the skipped steps the host has learnt of: quietly under a loss scaler (an overflow is its work), else
        a WARNING naming them (the first three skipped steps, then the 4th, 8th, 16th...), or FloatingPointError (``skip_nonfinite='raise'``). A flag read late (a fused optimizer
        on an accelerator, which the step never waits for) is reported when it is read: at a later step, or at
        ``engine.skipped_steps`` / ``step_was_skipped``."""
        steps = self._state.take_skipped()
        if not steps:
            return
        self.schedule_watch.after_skip(self.optimizers, self.schedulers)
        which = f"step {steps[0]}" if len(steps) == 1 else "steps " + ", ".join(map(str, steps))
        if self.settings.on_nonfinite == "quiet":
            log.debug("%s skipped: non-finite gradients (the loss scaler lowers its scale)", which)
            return
        message = (
            f"Optimizer {which} skipped: the loss or the gradients held inf/NaN under {self._policy_name or 'this policy'} (no loss "
            f"scaler), so the weights, the optimizer's state and the engine's schedulers were left as they were "
            f"({self._state.skipped} step(s) skipped so far: engine.skipped_steps)."
        )
        if self.settings.on_nonfinite == "raise":
            raise FloatingPointError(f"{message} Engine(skip_nonfinite='raise') stops here; look for the first inf/NaN in the batch, the loss or the model's forward (`ampkit doctor` finds the layer).")
        total = self._state.skipped
        # Each of the first three, then the 4th, 8th, 16th...: a run that skips every step (a broken model) says so
        # in a few lines, not one per step.
        if not any(n <= 3 or n & (n - 1) == 0 for n in range(total - len(steps) + 1, total + 1)):
            log.debug("%s", message)
            return
        if total >= 3:
            message += f" The next such WARNING comes at {1 << total.bit_length()} skipped steps."
        log.warning(
            "%s A non-finite loss comes from the batch, the loss or the model's forward (`ampkit doctor` finds the layer); "
            "pass Engine(skip_nonfinite='raise') to stop at such a step, or skip_nonfinite=False to let it reach the weights.",
            message,
        )

    def _run_hooks(self, point: HookPoint) -> None:
        if self._hooks is not None and self._hooks.active:
            self._hooks.run(point, self._owner)

    # ------------------------------------------------------------------------------------------ outcomes
    def resolve(self, wait: int | None = None) -> None:
        """Read the outcomes of earlier (fused, unsynced) steps still on their way, waiting for the oldest ``wait`` of
        them (default: all, which syncs; 0 never waits). A skip among them is diagnosed at the next optimizer step
        (``diagnose_late``); a clean one ends a collapse episode."""
        state = self._state
        if state.deferred is None:
            return
        outcomes = state.poll(wait)
        if any(outcomes):
            state.diagnose_late = True
            self._report_skips()
        if not all(outcomes):
            self.collapse.clean_step()

    def diagnose_collapse(self) -> str | None:
        """The message for a collapsed loss scale, naming the parameters whose gradients are not finite; else None."""
        named = [(self._names.get(id(p), "?"), p) for o in self.optimizers for g in o.param_groups for p in g["params"]]
        return self.collapse.diagnose(self.scaler, named, self._policy_name)

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The state a checkpoint keeps of the step: the scaler's, the masters' and the rounding stream's (None where
        there is none), and the skipped steps (which waits for the outcomes still on their way)."""
        self.resolve()
        return {
            "skipped_steps": self._state.skipped,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "masters": self.masters.state_dict() if self.masters is not None else None,
            "rounding": self.rounding.state_dict() if self.rounding is not None else None,  # bf16-true-sr's stream
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back :meth:`state_dict` (validated by the caller; the skipped count goes with the counters). A
        checkpoint without a ``"rounding"`` entry (written before there was one) leaves the stream as it is."""
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        if self.masters is not None:
            self.masters.load_state_dict(state["masters"])
        if self.rounding is not None and state.get("rounding") is not None:
            self.rounding.load_state_dict(state["rounding"])


def reads_are_free(device: torch.device) -> bool:
    """On the CPU the "device" is the host: reading a flag costs no sync, so a step's outcome is known at once."""
    return device.type == "cpu"

