"""The training-step engine: precision, loss scaling, accumulation, clipping and skipping, inside the user's loop.

    engine = Engine(precision="bf16-mixed", accumulate=4, clip_grad_norm=1.0)
    model, optimizer = engine.setup(model, optimizer)
    for x, y in loader:
        with engine.autocast():
            loss = criterion(model(x), y)
        engine.backward(loss)
        engine.step()            # updates the weights only at the accumulation boundary

The engine keeps the loop's side: the accumulation window and counters (a :class:`~ampkit.training.StepState`),
autocast and the scaled backward. What setup() builds is owned by its builders: the strategy's wrapping, and the
:class:`~ampkit.training.OptimizerStep`, which owns the scaler, masters, compiled steps, kernel guards, clipping and
collapse watch (no host-device sync beyond the one that decides whether to skip). Tools join through step hooks.
Settings and parts are read-only: assigning one raises an AttributeError naming what to do.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from ..distributed._strategy import Strategy, resolve_strategy
from ..policy import Policy, get_policy
from ..scaling import ScalerConfig, StepScaler
from ._compile import compile_plan
from ._engine_args import build_sampler, build_scaler, check_accumulate, check_loss, step_settings
from ._engine_setup import Run, StepParts, adopt_optimizers, set_up
from ._engine_state import engine_state
from ._engine_view import EngineView
from ._fused_master_step import check_fused_step_spec
from ._hooks import AnyHook, Hooks
from ._loaded_weights import MastersFollowLoads, follow_loaded
from ._micro_batching import MicroBatcher
from ._misuse import check_window_backward, guard_optimizers
from ._optimizer_step import OptimizerStep
from ._preemption import REQUEUE_EXIT_CODE, Extra, PreemptionWatch
from ._setup_checks import check_fp32_weights, no_optimizer_error
from ._step_state import StepState
from ._window_watch import WindowWatch

if TYPE_CHECKING:
    from ..numerics._sampler import NumericsSampler

__all__ = ["Engine"]

log = logging.getLogger("ampkit")


class Engine(EngineView):
    """Runs the precision-sensitive parts of a training step and leaves the loop to the user.

    Args:
        precision: a policy name or alias (``"bf16-mixed"``, ``"fp16"``, ``"O2"``) or a Policy.
        accumulate: micro-batches per optimizer step; the loss is divided accordingly.
        clip_grad_norm: clip the unscaled (master, where they exist) gradients to this total norm.
        clip_grad_value: clamp unscaled gradients to this absolute value (exclusive with clip_grad_norm).
        scaler: loss scaling; default: the policy's (dynamic for fp16, none otherwise); ``"dynamic"``, ``"none"``, a
            float (static), a ScalerConfig, or a scaler of your own with the members of :class:`~ampkit.scaling.StepScaler`.
        skip_nonfinite: skip a step whose loss or gradients hold inf/NaN, under every policy (default); counted in
            ``skipped_steps``; without a loss scaler a WARNING names it (the first three, then the 4th, 8th...). ``"raise"``:
            FloatingPointError instead; ``False``: no check (refused with a loss scaler).
        keep_fp32: module names or types that run in fp32, added to the policy's.
        micro_batch_rows: most samples :meth:`train_step` feeds through the model at once (default: the whole batch);
            learnt after an out-of-memory error and saved in checkpoints.
        on_oom: ``"split"`` (default): :meth:`train_step` splits a batch that runs out of memory; ``"raise"``.
        strategy: under torchrun, ``"ddp"`` or ``"fsdp"`` (or :class:`ampkit.distributed.DDP` / ``FSDP``): setup()
            wraps or shards the model; skipping, clipping, accumulation and checkpoints work across ranks.
        numerics: sample how gradients and activations fit fp16 every N optimizer steps (an int N, or a
            :class:`ampkit.numerics.NumericsSampler`, a step hook): kept as ``engine.numerics.last``; one
            host-device sync per sample, nothing on the other steps. Default: off.
        hooks: step hooks (:class:`ampkit.training.StepHook`), such as a :class:`~ampkit.memory.MemoryTracker`.
        compile: ``True`` compiles the model in place with torch.compile at setup (after the policy and the
            strategy), ``"regional"`` each repeated block, a dict passes options to torch.compile. A model the user
            compiled before setup is recognised. Default: off.
        fused_step: master-weight policies: unscale, inf check, clipping, fp32 update and 16-bit copy-back as one
            compiled region (default: on when ``compile`` is; ``True`` or torch.compile options insist; ``False``
            keeps the unfused step); one that fails to compile warns and the run goes on unfused
            (``engine.fused_step.failure`` says why). ``bf16-true-sr``: torchao's update as one region (default on).

    >>> model = nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> engine = Engine(precision="bf16-mixed", accumulate=2)
    >>> model, opt = engine.setup(model, opt)
    >>> for _ in range(2):
    ...     with engine.autocast():
    ...         loss = model(torch.ones(3, 4)).float().pow(2).mean()
    ...     engine.backward(loss)
    ...     stepped = engine.step()
    >>> stepped, engine.steps
    (True, 1)
    """

    def __init__(
        self,
        precision: str | int | Policy = "32-true",
        *,
        accumulate: int = 1,
        clip_grad_norm: float | None = None,
        clip_grad_value: float | None = None,
        scaler: StepScaler | ScalerConfig | str | float | None = None,
        skip_nonfinite: bool | Literal["raise"] | None = None,
        keep_fp32: Sequence[str | type[nn.Module]] = (),
        micro_batch_rows: int | None = None,
        on_oom: str = "split",
        strategy: str | Strategy | None = None,
        numerics: NumericsSampler | int | None = None,
        hooks: Sequence[AnyHook[Engine]] = (),
        compile: bool | str | dict[str, Any] | None = None,
        fused_step: bool | dict[str, Any] | None = None,
    ) -> None:
        self._policy = get_policy(precision, keep_fp32=keep_fp32)
        self._requested = resolve_strategy(strategy)
        self._accumulate = check_accumulate(accumulate)
        self._batcher = MicroBatcher(micro_batch_rows, on_oom)
        built = build_scaler(scaler, self._policy)
        self._settings = step_settings(clip_grad_norm, clip_grad_value, skip_nonfinite, scaled=built is not None)
        self._numerics = build_sampler(numerics)
        self._hooks = Hooks(([self._numerics] if self._numerics is not None else []) + list(hooks))
        self._compile_plan = compile_plan(compile)
        check_fused_step_spec(fused_step)
        self._fused_spec = fused_step
        self._warned_epoch_length = False  # a declared epoch cut short is named once per run
        # Accumulation position, step count and the last step's outcome; a checkpoint saves the counters through it.
        self._state = StepState()
        self._preemption: PreemptionWatch | None = None  # the active save_on_preemption() context
        self._watch = WindowWatch([])  # the window's gradients between the engine's calls (see _window_watch)
        # Before setup: no model, and a step that holds the scaler until setup() builds the real one.
        self._run = Run(OptimizerStep(settings=self._settings, scaler=built, state=self._state), strategy=self._requested)

    # ------------------------------------------------------------------------------------------ setup
    def setup(self, models: nn.Module | Sequence[nn.Module], *optimizers: torch.optim.Optimizer, schedulers: Any = None) -> Any:
        """Apply the policy to the model(s) and adopt the optimizers (and LR schedulers, stepped only on real steps).

        Build the optimizers on the fp32 model and pass them here; for master-weight policies the optimizers'
        parameters are swapped for fp32 masters. Returns ``(model, *optimizers)``, or the model alone.
        """
        return self._set_up(models, optimizers, schedulers, later=False)

    def setup_module(self, models: nn.Module | Sequence[nn.Module], *, device: torch.device | str | None = None) -> Any:
        """:meth:`setup` in two calls, as Lightning Fabric's ``setup_module`` / ``setup_optimizers``: the policy is
        applied to the model now, and the optimizers built on what this returns come to :meth:`setup_optimizers`.
        Master weights are then cloned from the fp32 values kept here, not from the rounded 16-bit ones. ``device``:
        where the model will train when a framework moves it there after this call (checked at setup_optimizers).
        Backward passes may run in between; a step may not.

        >>> engine = Engine("bf16-true-masters"); model = engine.setup_module(nn.Linear(2, 2))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1); model.weight.dtype
        torch.bfloat16
        >>> engine.setup_optimizers(opt)[0].param_groups[0]["params"][0].dtype
        torch.float32
        """
        return self._set_up(models, (), None, later=True, device=torch.device(device) if device is not None else None)

    def setup_optimizers(self, *optimizers: torch.optim.Optimizer, schedulers: Any = None) -> tuple[torch.optim.Optimizer, ...]:
        """Adopt optimizers built on the model :meth:`setup_module` prepared (see there); returns the ones to step."""
        self._require_setup("setup_optimizers")
        check_fp32_weights(self._policy, optimizers, self._run.models)
        parts = StepParts(policy=self._policy, settings=self._settings, scaler=self._run.step.scaler, plan=self._compile_plan,
                          fused_spec=self._fused_spec, state=self._state, hooks=self._hooks, owner=self)
        self._run, opts = adopt_optimizers(self._run, optimizers, schedulers, parts)
        self._guard(opts, foreign=False)
        return opts

    def _set_up(self, models: Any, optimizers: Sequence[torch.optim.Optimizer], schedulers: Any, *, later: bool, device: torch.device | None = None) -> Any:
        if self._run.models:
            raise RuntimeError("Engine.setup() was already called; create one Engine per training run.")
        check_fp32_weights(self._policy, optimizers, models)
        self._run, opts = set_up(
            models, optimizers, policy=self._policy, settings=self._settings, scaler=self._run.step.scaler,
            strategy=self._requested, plan=self._compile_plan, fused_spec=self._fused_spec, schedulers=schedulers,
            state=self._state, hooks=self._hooks, owner=self, later=later, device=device,
        )
        self._guard(opts, foreign=True)
        if self._policy.master_weights:
            follow = MastersFollowLoads(self._follow_loaded)  # weights loaded into the model after setup reach the fp32 masters
            for m in self._run.models:
                m.register_load_state_dict_post_hook(follow)  # type: ignore[no-untyped-call]  # no annotations in torch 2.13
        out_model = self._run.wrappers[0] if isinstance(models, nn.Module) else list(self._run.wrappers)
        return (out_model, *opts) if opts else out_model

    def _follow_loaded(self, module: nn.Module) -> None:
        run = self._run
        follow_loaded(module, run.models, run.step.masters, run.values)

    def _guard(self, opts: Sequence[torch.optim.Optimizer], *, foreign: bool) -> None:
        guard_optimizers(self, opts, foreign=foreign)  # an optimizer.step() of the user's own on the engine's gradients is refused
        self._watch.close()
        self._watch = WindowWatch.of(self._run.step.optimizers, self._run.step.masters)

    # ------------------------------------------------------------------------------------------ loop
    def autocast(self) -> AbstractContextManager[Any]:
        """The forward's context: autocast (mixed policies); under DDP also ``no_sync`` inside a window (DDP decides
        in the forward whether the backward all-reduces)."""
        run = self._run
        forward: AbstractContextManager[Any] = self._policy.forward_context(run.device.type)
        if run.parallel.has_forward_context:
            spread = run.parallel.forward_context(run.wrappers, self.is_boundary)
            if spread is not None:
                spread.enter_context(forward)  # type: ignore[attr-defined]  # DDP's no_sync: an ExitStack (the protocol says a context)
                forward = spread
        return self._hooks.wrap_forward(self, forward) if self._hooks.active else forward

    def start_epoch(self, num_micro_batches: int | None = None) -> None:
        """Declare the micro-batches of the coming epoch, so its last window may be short (``len(loader)``).

        Without it, windows of exactly ``accumulate`` micro-batches run across epochs. It comes at a window
        boundary: gradients still pending are refused with the fix, not carried into the new epoch. Right after
        :meth:`load` of a checkpoint saved inside a declared epoch, the call that starts that epoch again continues
        it where the checkpoint stopped, so a resumed loop that skips the batches trained before (the recipe in
        docs/getting-started.md) takes the uninterrupted run's windows.

        >>> model = nn.Linear(2, 1); engine = Engine(accumulate=3)
        >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> engine.start_epoch(5)
        >>> for _ in range(5):
        ...     engine.backward(model(torch.ones(1, 2)).sum()); _ = engine.step()
        >>> engine.steps, engine.micro_batches_pending  # windows of 3 and 2
        (2, 0)
        """
        warning = self._state.start_epoch(num_micro_batches, self._accumulate)
        if warning is not None and not self._warned_epoch_length:
            self._warned_epoch_length = True
            log.warning("%s", warning)

    def backward(self, loss: torch.Tensor, backward_fn: Callable[[torch.Tensor], None] | None = None, **kwargs: Any) -> None:
        """Backward of ``loss`` divided by the window size and multiplied by the loss scale.

        Call it once or several times (several losses) per micro-batch; ``kwargs`` go to ``Tensor.backward``.
        ``backward_fn(scaled_loss)`` runs the backward in place of ``scaled_loss.backward(**kwargs)``: a framework's
        own backward hook (``LightningModule.backward``).
        """
        self._require_setup("backward")
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward() takes the loss tensor, got {type(loss).__name__}.")
        check_loss(loss, kwargs)  # non-scalar, detached or no-grad: named, where torch's message names none
        run, hooks = self._run, self._hooks
        if run.step.unscaled_ahead:
            raise RuntimeError("engine.backward() after engine.unscale_() and before engine.step(): its gradients would join unscaled "
                               "ones. Unscale once per step, after the window's last backward.")
        size, boundary = self._state.window(self._accumulate)
        self._watch.check("engine.backward()", window=size, scaled=run.step.scaler is not None)
        if hooks.active:
            hooks.run("before_backward", self, loss)
        run.parallel.before_backward(run.models, boundary)
        if size > 1:
            loss = loss / size
        with self._policy.backward_context(run.device.type), self._watch:
            scaled = run.step.scale_loss(loss)
            if backward_fn is not None:
                backward_fn(scaled)
            else:
                scaled.backward(**kwargs)  # type: ignore[no-untyped-call]  # Tensor.backward has no annotations (torch 2.13)
        self._state.note_backward()  # gradients of the engine's making: an optimizer.step() of the user's own is refused
        if hooks.active:
            hooks.run("after_backward", self)

    def train_step(self, loss_fn: Callable[[Any], torch.Tensor], batch: Any, *optimizers: torch.optim.Optimizer, reduction: str = "mean") -> torch.Tensor:
        """Forward (under :meth:`autocast`), backward and :meth:`step` of ``batch``; split into smaller passes on OOM.

        ``loss_fn(rows)`` returns the scalar loss of the rows it is given (a slice of every tensor in ``batch``
        along its first dimension). On an out-of-memory error the engine frees the attempt, halves the rows per
        pass (kept as ``micro_batch_rows`` for later steps) and goes on where it failed; every sample counts
        once, each pass weighted by its share of rows, so the gradients are the unsplit step's. Returns the
        batch's loss (detached, on the device: no sync). See :mod:`ampkit.training._micro_batching` for the limits.

        >>> model = nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> engine = Engine(micro_batch_rows=2); model, opt = engine.setup(model, opt)
        >>> x, y = torch.ones(5, 4), torch.zeros(5, 1)
        >>> loss = engine.train_step(lambda b: nn.functional.mse_loss(model(b[0]), b[1]), (x, y))  # 3 passes: 2, 2, 1 rows
        >>> engine.steps
        1
        """
        self._require_setup("train_step")
        self._watch.check("engine.train_step()", window=self._state.window(self._accumulate)[0], scaled=self.scaler is not None)
        with self._watch.trusting():  # its out-of-memory retry zeroes the gradients of a window it began itself
            return self._batcher.train_step(self, loss_fn, batch, optimizers, reduction)

    def grad(self, outputs: torch.Tensor, inputs: Sequence[torch.Tensor], create_graph: bool = True) -> tuple[torch.Tensor, ...]:
        """Unscaled gradients of ``outputs`` w.r.t. ``inputs`` for gradient penalties (double backward).

        The gradients are computed on the scaled loss, so they do not underflow in fp16, then divided by the
        scale; an overflow shows up as inf in the penalty and the step is skipped. No sync.
        """
        self._require_setup("grad")
        step = self._run.step
        with self._policy.backward_context(self._run.device.type):
            grads = torch.autograd.grad(step.scale_loss(outputs), list(inputs), create_graph=create_graph)
        return step.unscaled(grads)

    def step(self, *optimizers: torch.optim.Optimizer) -> bool:
        """End a micro-batch; at the window's end, unscale, clip, step (or skip) and zero the gradients.

        Steps the given optimizers (default: all from setup) and updates the loss scale once. Returns True
        when this call ended a window; whether that step was skipped for overflow is ``step_was_skipped``.
        Each call ends one micro-batch: to update several optimizers together, pass them in one call (the
        default); separate calls (a GAN's discriminator, then its generator) each count as a micro-batch.

        ``clip_grad_norm`` clips by the total norm over every optimizer of the call, so an overflow skips them all;
        without it each optimizer skips on its own overflow only, as with ``GradScaler``.
        """
        self._require_setup("step")
        step = self._run.step
        opts = self._stepping("step", optimizers)
        # unscale_() ended this step's window already, and counted the step: its hooks saw the step's number.
        ended = True if step.unscaled_ahead else self._end_micro_batch("engine.step()")
        if ended:
            self._watch.forget()  # the step takes the window's gradients (and zeroes them, even where it then raises)
            step.step(opts)
        if self._preemption is not None:
            self._preemption.check(boundary=ended)  # after the micro-batch in flight: saves and exits if preempted
        return ended

    def unscale_(self, *optimizers: torch.optim.Optimizer) -> None:
        """Unscale (and copy to the masters) the gradients of ``optimizers`` (default: all) before :meth:`step`, to read
        or clip them yourself, as with ``GradScaler.unscale_``; the step then takes them as they are. At a window's end
        only (after its last backward). No sync. Framework plugins call it before their gradient hooks."""
        self._require_setup("unscale_")
        step = self._run.step
        opts = self._stepping("unscale_", optimizers)
        if not step.unscaled_ahead:
            if not self.is_boundary:
                raise RuntimeError("engine.unscale_() inside an accumulation window: later backward passes would add scaled gradients "
                                   "to unscaled ones. Call it after the window's last engine.backward(), when engine.is_boundary is True.")
            self._end_micro_batch("engine.unscale_()")  # the step begins here: step hooks run now, with engine.steps counting it
        step.unscale_(opts)

    def _stepping(self, what: str, optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
        step = self._run.step
        if not step.optimizers:
            raise no_optimizer_error(what, later=self._run.values is not None)
        return step.stepping(optimizers)

    def _end_micro_batch(self, what: str) -> bool:
        """Count the micro-batch that ends; True when it ends a window (an optimizer step is due)."""
        state = self._state
        size, boundary = state.window(self._accumulate)
        if boundary and state.backwards:  # what the user's code did to the window's gradients, refused before the step
            self._watch.check(what, window=size, scaled=self._run.step.scaler is not None)
        if boundary and not state.backwards:
            check_window_backward(self, size)  # no engine.backward() in the window: refused where it trains wrong
        return state.end_micro_batch(boundary)

    def add_hook(self, hook: AnyHook[Engine]) -> None:
        """Join a step hook (:class:`ampkit.training.StepHook`) to this engine's steps from now on."""
        self._hooks.add(hook)

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Engine state for exact resume: policy, counters, scaler, masters, pending gradients."""
        return engine_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (after setup, with the same policy)."""
        from ..checkpoint import load_engine_state

        load_engine_state(self, state)
        self._watch.record()  # the gradients a load put back are the window's

    def save(self, path: Any, extra: dict[str, Any] | None = None) -> None:
        """Write models, optimizers, schedulers, engine state and RNG atomically to ``path``."""
        from ..checkpoint import save_training_state

        save_training_state(self, path, extra)

    def save_on_preemption(self, path: str | os.PathLike[str], *, signals: Sequence[signal.Signals | int] = (signal.SIGTERM,),
                           exit_code: int = REQUEUE_EXIT_CODE, extra: Extra = None) -> PreemptionWatch:
        """A context in which ``signals`` end the run with :meth:`save` to ``path`` and exit code ``exit_code``
        (75: requeue me), after the micro-batch in flight; the handler it replaces is chained. ``extra``: a dict, or a
        function called at the save. Every rank under torchrun saves the same micro-batch. Example and details:
        :class:`ampkit.training.PreemptionWatch` and docs/guides/preemption.md."""
        return PreemptionWatch(self, self.save, self._attach_preemption, path, signals=signals, exit_code=exit_code, extra=extra)

    def _attach_preemption(self, watch: PreemptionWatch | None) -> None:
        if watch is not None and self._preemption is not None:
            raise RuntimeError("save_on_preemption() is active already on this engine; enter it once, around the whole loop.")
        self._preemption = watch

    def load(self, path: Any) -> dict[str, Any] | None:
        """Restore everything :meth:`save` wrote; returns its ``extra``. Nothing changes if the file is bad."""
        from ..checkpoint import load_training_state

        extra = load_training_state(self, path)
        self._watch.record()  # the gradients a load put back are the window's
        return extra
