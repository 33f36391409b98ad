"""The training-step engine: precision, loss scaling, accumulation, clipping and skipping, inside the user's loop.

    engine = Engine(precision="bf16-mixed", accumulate=4, clip_grad_norm=1.0)
    model, optimizer = engine.setup(model, optimizer)
    for x, y in loader:
        with engine.autocast():
            loss = criterion(model(x), y)
        engine.backward(loss)
        engine.step()            # updates the weights only at the accumulation boundary

What differs across ranks belongs to the strategy (:mod:`ampkit.distributed.strategy`), the optimizer step to
:mod:`~ampkit.training.optimizer_step` (no host-device sync beyond the one that decides whether to skip), where
the run stands to a :class:`~ampkit.training.step_state.StepState`, and tools join through step hooks
(:mod:`~ampkit.training.hooks`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..distributed.agreement import world_size
from ..distributed.strategy import SingleProcess, Strategy, resolve_strategy
from ..policy import Policy, get_policy
from .collapse import CollapseWatch
from .compile import (
    apply_compile,
    check_compile_plan,
    compile_plan,
    unwrap_user_compiled,
)
from .engine_args import (
    adopt_schedulers,
    build_sampler,
    build_scaler,
    check_engine_args,
    check_setup_args,
)
from .engine_state import engine_state
from .fused_library_step import FusedLibraryStep, build_library_step, check_library_step
from .fused_master_step import (
    FusedMasterStep,
    build_fused_step,
    check_fused_step,
    check_fused_step_spec,
)
from .hooks import Hooks
from .kernel_guards import guard_optimizer
from .masters import MasterWeights
from .misuse import DirectStepGuard, check_window_backward
from .model_setup import prepare_models
from .optimizer_step import optimizer_step, resolve_outcome
from .rounding_stream import RoundingStream, rounding_stream
from .step_state import StepState

if TYPE_CHECKING:
    from ..numerics.sampler import NumericsSampler

__all__ = ["Engine"]

log = logging.getLogger("ampkit")


class Engine:
    """Runs the precision-sensitive parts of a training step and leaves the loop to the user.

    Args:
        precision: a policy name or alias (``"bf16-mixed"``, ``"fp16"``, ``"O2"``) or a Policy.
        accumulate: micro-batches per optimizer step; the loss is divided accordingly.
        clip_grad_norm: clip the unscaled (master, where they exist) gradients to this total norm.
        clip_grad_value: clamp unscaled gradients to this absolute value (exclusive with clip_grad_norm).
        scaler: loss scaling; default: the policy's (dynamic for fp16, none otherwise).
        skip_nonfinite: skip steps whose gradients hold inf/NaN; default: on when the loss is scaled.
        keep_fp32: module names or types that run in fp32, added to the policy's.
        micro_batch_rows: most samples :meth:`train_step` feeds through the model at once (default: the whole batch);
            learnt after an out-of-memory error and saved in checkpoints.
        on_oom: ``"split"`` (default): :meth:`train_step` splits a batch that runs out of memory; ``"raise"``.
        strategy: under torchrun, ``"ddp"`` or ``"fsdp"`` (or :class:`ampkit.distributed.DDP` / ``FSDP`` with
            options): setup() wraps or shards the model, and skipping, clipping, accumulation and checkpoints
            work across ranks (see :mod:`ampkit.distributed.strategy`). Default: none, or what a model wrapped
            by the user implies.
        numerics: sample how gradients and activations fit fp16 every N optimizer steps (an int N, or a
            :class:`ampkit.numerics.sampler.NumericsSampler`): logged, kept as ``engine.numerics.last``; one
            host-device sync per sample and nothing on the other steps. Default: off. (A step hook: the same
            as passing the sampler in ``hooks``.)
        hooks: step hooks (see :mod:`ampkit.training.hooks`): tools called around backward and the optimizer
            step, such as a :class:`~ampkit.memory.tracker.MemoryTracker`. More with :meth:`add_hook`.
        compile: ``True`` compiles the model with torch.compile at setup (after the policy and the strategy are
            applied), ``"regional"`` each repeated block, a dict passes options to torch.compile (see
            :mod:`ampkit.training.compile`). In place: checkpoint keys stay plain. A model the user compiled
            before setup is recognised: the engine trains the module inside it and compiles that in place.
            Default: off.
        fused_step: master-weight policies: the unscale, inf check, clipping, fp32 update and 16-bit
            copy-back as one compiled region (see :mod:`ampkit.training.fused_master_step`). Default: on when
            ``compile`` is, where the optimizer allows; ``True`` (or a dict of torch.compile options) insists,
            ``False`` keeps the unfused step. A region that fails to compile is never fatal: the run goes on
            unfused after one warning (``engine.fused_step.failure`` says why). ``bf16-true-sr``: torchao's
            update of every parameter as one compiled region instead of one compiled call per parameter (see
            :mod:`ampkit.training.fused_library_step`). Default: on; ``False`` keeps torchao's own step.

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
        scaler: Any = None,
        skip_nonfinite: bool | None = None,
        keep_fp32: Sequence[str | type[nn.Module]] = (),
        micro_batch_rows: int | None = None,
        on_oom: str = "split",
        strategy: str | Strategy | None = None,
        numerics: NumericsSampler | int | None = None,
        hooks: Sequence[Any] = (),
        compile: bool | str | dict[str, Any] | None = None,
        fused_step: bool | dict[str, Any] | None = None,
    ) -> None:
        self.policy = get_policy(precision, keep_fp32=keep_fp32)
        self.strategy: Strategy | None = resolve_strategy(strategy)
        check_engine_args(accumulate, clip_grad_norm, clip_grad_value, micro_batch_rows, on_oom)
        self.micro_batch_rows = micro_batch_rows
        self.on_oom = on_oom
        self.accumulate = accumulate
        self.clip_grad_norm = clip_grad_norm
        self.clip_grad_value = clip_grad_value
        self.scaler = build_scaler(scaler, self.policy)
        if self.scaler is not None and skip_nonfinite is False:
            raise ValueError("A scaled loss must skip steps whose gradients overflowed; drop skip_nonfinite=False or pass scaler='none'.")
        self.skip_nonfinite = self.scaler is not None or bool(skip_nonfinite)
        self.numerics = build_sampler(numerics)
        self.hooks = Hooks(([self.numerics] if self.numerics is not None else []) + list(hooks))
        self.compile_plan = compile_plan(compile)
        self.compiled: list[str] = []  # the compiled regions after setup ('' for a whole model)
        check_fused_step_spec(fused_step)
        self._fused_step_spec = fused_step
        self.fused_step: FusedMasterStep | None = None  # built at setup, where the policy keeps masters
        self.library_step: FusedLibraryStep | None = None  # built at setup, where a library optimizer steps (bf16-true-sr)
        self.rounding: RoundingStream | None = None  # built at setup, where an optimizer rounds at random (bf16-true-sr)

        self.device = torch.device("cpu")
        self.models: list[nn.Module] = []  # the modules themselves (inside any DDP wrapper): names, state, params
        self.wrappers: list[nn.Module] = []  # what setup() returned and the loop calls: DDP wrappers or the models
        self.reduce_found_flags = False  # combine the ranks' overflow flags before deciding to skip (set by setup)
        self.optimizers: list[torch.optim.Optimizer] = []
        self.schedulers: list[Any] = []
        self.masters: MasterWeights | None = None
        self.collapse = CollapseWatch()
        self._parallel: Strategy | SingleProcess = SingleProcess()  # what runs: the strategy, or the do-nothing one
        self._param_names: dict[int, str] = {}
        self._named: list[tuple[str, nn.Parameter]] = []
        self._warned_epoch_length = False  # a declared epoch cut short is named once per run
        # Accumulation position, step count and the last step's outcome; a checkpoint saves the counters through it.
        self._state = StepState()

    # ------------------------------------------------------------------------------------------ setup
    def setup(self, models: nn.Module | Sequence[nn.Module], *optimizers: torch.optim.Optimizer, schedulers: Any = None) -> Any:
        """Apply the policy to the model(s) and adopt the optimizers (and LR schedulers, stepped only on real steps).

        Build the optimizers on the fp32 model and pass them here; for master-weight policies the optimizers'
        parameters are swapped for fp32 masters. Returns ``(model, *optimizers)``, or the model alone.
        """
        if self.models:
            raise RuntimeError("Engine.setup() was already called; create one Engine per training run.")
        given, plan = unwrap_user_compiled(check_setup_args(models, optimizers), self.compile_plan)
        optimizers = tuple(self.policy.convert_optimizers(optimizers))  # bf16-true-kahan/-sr: the libraries' twins
        check_compile_plan(given, plan)  # before the policy and the strategy change the models
        library = not self.policy.master_weights  # no master step to fuse: the library's step may be (bf16-true-sr's)
        if library:
            check_library_step(self._fused_step_spec, optimizers)
        else:
            check_fused_step(self._fused_step_spec, optimizers, self.policy.master_weights, remainders=self.policy.master_remainders)
        prepared = prepare_models(given, optimizers, self.policy, self.strategy)
        self.strategy, self._parallel, self.device = prepared.strategy, prepared.parallel, prepared.device
        self.masters, self.wrappers, self._named = prepared.masters, prepared.wrappers, prepared.named
        model_list = prepared.models
        # Each rank checks its own gradients for inf/NaN; the flags must be combined unless the gradients were
        # all-reduced already (DDP), or ranks would disagree on skipping and their weights drift apart.
        self.reduce_found_flags = world_size() > 1 and not self._parallel.grads_reduced
        self._param_names = {id(p): n for n, p in self._named}
        if self.masters is not None:
            self._param_names.update({id(m): n for n, m in zip(self.masters.names, self.masters.masters)})

        for opt in optimizers:
            guard_optimizer(opt)  # known torch kernel defects, once the parameters' dtypes and devices are final
        self.schedulers = adopt_schedulers(schedulers, optimizers)
        self.rounding = rounding_stream(optimizers, self.device)  # one stream for every replica (DDP)
        # FSDP's ranks each check their own shards; the fused step does not combine their flags.
        sharded = "each rank's overflow flag must be combined with the others' (FSDP)" if self.reduce_found_flags else None
        compile_options = plan.options if plan is not None else None
        if library:
            self.library_step = build_library_step(self._fused_step_spec, compile_options, optimizers)
        else:
            self.fused_step = build_fused_step(self._fused_step_spec, compile_options, optimizers, self.masters, sharded)
        if self.scaler is not None:
            self.scaler.to(self.device)
        self.models, self.optimizers = model_list, list(optimizers)
        guard = DirectStepGuard(self)  # an optimizer.step() of the user's own on the engine's gradients is refused
        for opt in optimizers:
            opt.register_step_pre_hook(guard)
        self.compiled = apply_compile(model_list, plan) if plan is not None else []
        if self.policy.needs_compile and plan is None and self.device.type == "cuda":
            log.warning("%s without torch.compile runs each fp8 cast as kernels of its own: expect it slower than bf16-mixed. "
                        "Pass Engine(compile=True).", self.policy.name)
        out_model = self.wrappers[0] if isinstance(models, nn.Module) else list(self.wrappers)
        return (out_model, *optimizers) if optimizers else out_model

    # ------------------------------------------------------------------------------------------ loop
    def autocast(self) -> AbstractContextManager[Any]:
        """The context for the forward pass and the loss (autocast for mixed policies, a no-op otherwise).

        Under DDP it also runs the forward of a micro-batch that does not end its accumulation window under
        ``no_sync``, since DDP decides during the forward whether the coming backward all-reduces.
        """
        forward: AbstractContextManager[Any] = self.policy.forward_context(self.device.type)
        if self._parallel.has_forward_context:
            spread = self._parallel.forward_context(self.wrappers, self.is_boundary)
            if spread is not None:
                spread.enter_context(forward)  # type: ignore[attr-defined]
                forward = spread
        return self.hooks.wrap_forward(self, forward) if self.hooks.active else forward

    def start_epoch(self, num_micro_batches: int | None = None) -> None:
        """Declare the micro-batches of the coming epoch, so its last window may be short (``len(loader)``).

        Without it, windows of exactly ``accumulate`` micro-batches run across epochs. It comes at a window
        boundary: gradients still pending are refused with the fix, not carried into the new epoch. Right after
        :meth:`load` of a checkpoint saved inside a declared epoch, the call that starts that epoch again continues
        it where the checkpoint stopped, so a resumed loop that skips the batches trained before (the README's
        recipe) takes the uninterrupted run's windows.

        >>> model = nn.Linear(2, 1); engine = Engine(accumulate=3)
        >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> engine.start_epoch(5)
        >>> for _ in range(5):
        ...     engine.backward(model(torch.ones(1, 2)).sum()); _ = engine.step()
        >>> engine.steps, engine.micro_batches_pending  # windows of 3 and 2
        (2, 0)
        """
        if num_micro_batches is not None and (isinstance(num_micro_batches, bool) or not isinstance(num_micro_batches, int) or num_micro_batches < 1):
            raise ValueError(f"num_micro_batches must be a positive int (e.g. len(loader)), got {num_micro_batches!r}.")
        warning = self._state.start_epoch(num_micro_batches, self.accumulate)
        if warning is not None and not self._warned_epoch_length:
            self._warned_epoch_length = True
            log.warning("%s", warning)

    @property
    def micro_batches_pending(self) -> int:
        """Micro-batches accumulated since the last optimizer step; 0 at a window boundary. No sync.

        >>> model = nn.Linear(2, 1); engine = Engine(accumulate=3)
        >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> pending = []
        >>> for _ in range(4):
        ...     engine.backward(model(torch.ones(1, 2)).sum()); _ = engine.step(); pending.append(engine.micro_batches_pending)
        >>> pending
        [1, 2, 0, 1]
        """
        return self._state.pending(self.accumulate)

    @property
    def is_boundary(self) -> bool:
        """True when the next ``step()`` ends an accumulation window and updates the weights."""
        return self._state.window(self.accumulate)[1]

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward of ``loss`` divided by the window size and multiplied by the loss scale.

        Call it once or several times (several losses) per micro-batch; ``kwargs`` go to ``Tensor.backward``.
        """
        self._require_setup("backward")
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward() takes the loss tensor, got {type(loss).__name__}.")
        size, boundary = self._state.window(self.accumulate)
        if self.hooks.active:
            self.hooks.run("before_backward", self, loss)
        self._parallel.before_backward(self.models, boundary)
        if size > 1:
            loss = loss / size
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        with self.policy.backward_context(self.device.type):
            loss.backward(**kwargs)
        self._state.backwards += 1  # gradients of the engine's making: an optimizer.step() of the user's own is refused
        if self.hooks.active:
            self.hooks.run("after_backward", self)

    def train_step(self, loss_fn: Callable[[Any], torch.Tensor], batch: Any, *optimizers: torch.optim.Optimizer, reduction: str = "mean") -> torch.Tensor:
        """Forward (under :meth:`autocast`), backward and :meth:`step` of ``batch``; split into smaller passes on OOM.

        ``loss_fn(rows)`` returns the scalar loss of the rows it is given (a slice of every tensor in ``batch``
        along its first dimension). On an out-of-memory error the engine frees the attempt, halves the rows per
        pass (kept as ``micro_batch_rows`` for later steps) and goes on where it failed; every sample counts
        once, each pass weighted by its share of rows, so the gradients are the unsplit step's. Returns the
        batch's loss (detached, on the device: no sync). See :mod:`ampkit.training.micro_batching` for the limits.

        >>> model = nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> engine = Engine(micro_batch_rows=2); model, opt = engine.setup(model, opt)
        >>> x, y = torch.ones(5, 4), torch.zeros(5, 1)
        >>> loss = engine.train_step(lambda b: nn.functional.mse_loss(model(b[0]), b[1]), (x, y))  # 3 passes: 2, 2, 1 rows
        >>> engine.steps
        1
        """
        from .micro_batching import train_step

        self._require_setup("train_step")
        return train_step(self, loss_fn, batch, optimizers, reduction)

    def grad(self, outputs: torch.Tensor, inputs: Sequence[torch.Tensor], create_graph: bool = True) -> tuple[torch.Tensor, ...]:
        """Unscaled gradients of ``outputs`` w.r.t. ``inputs`` for gradient penalties (double backward).

        The gradients are computed on the scaled loss, so they do not underflow in fp16, then divided by the
        scale; an overflow shows up as inf in the penalty and the step is skipped. No sync.
        """
        self._require_setup("grad")
        scaled = self.scaler.scale(outputs) if self.scaler is not None else outputs
        with self.policy.backward_context(self.device.type):
            grads = torch.autograd.grad(scaled, list(inputs), create_graph=create_graph)
        if self.scaler is None:
            return grads
        return tuple(torch._foreach_mul(list(grads), self.scaler.inv_scale()))

    def step(self, *optimizers: torch.optim.Optimizer) -> bool:
        """End a micro-batch; at the window's end, unscale, clip, step (or skip) and zero the gradients.

        Steps the given optimizers (default: all from setup) and updates the loss scale once. Returns True
        when this call ended a window; whether that step was skipped for overflow is ``step_was_skipped``.
        Each call ends one micro-batch: to update several optimizers together, pass them in one call (the
        default); separate calls (a GAN's discriminator, then its generator) each count as a micro-batch.

        ``clip_grad_norm`` clips by the total norm over every optimizer stepped in the call (a model split over
        two optimizers is clipped as one); since that norm is inf when any gradient is, an overflow then skips
        every optimizer of the call. Without clipping by norm, each optimizer skips on its own overflow only,
        as with ``GradScaler``.
        """
        self._require_setup("step")
        opts = list(optimizers) or self.optimizers
        unknown = [type(o).__name__ for o in opts if not any(o is s for s in self.optimizers)]
        if unknown:
            raise ValueError(f"Optimizer(s) {unknown} were not passed to engine.setup(); pass them there first.")
        state = self._state
        size, boundary = state.window(self.accumulate)
        if boundary and not state.backwards:
            check_window_backward(self, size)  # no engine.backward() in the window: refused where it trains wrong
        state.micro += 1
        state.resumed = False  # a micro-batch has ended since any load
        if not boundary:
            return False
        if state.epoch_len is not None and state.micro >= state.epoch_len:
            state.micro, state.epoch_len = 0, None  # the declared epoch is over
        state.steps += 1
        state.backwards = 0  # this step takes them: the optimizers' guard sees none pending while it runs
        optimizer_step(self, opts)
        return True

    def _require_setup(self, what: str) -> None:
        if not self.models:
            raise RuntimeError(f"engine.{what}() called before engine.setup(model, optimizer); call setup() first.")

    # ------------------------------------------------------------------------------------------ outcome
    @property
    def steps(self) -> int:
        """Optimizer steps taken (skipped ones included). No sync."""
        return self._state.steps

    @steps.setter
    def steps(self, value: int) -> None:
        self._state.steps = value

    @property
    def step_state(self) -> StepState:
        """Where the run stands: the counters a checkpoint keeps (``to_dict``) and the last step's outcome."""
        return self._state

    @step_state.setter
    def step_state(self, state: StepState) -> None:
        self._state = state

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The models' parameters by the names checkpoints use (``"0.weight"`` with several models); after setup."""
        return list(self._named)

    def add_hook(self, hook: Any) -> None:
        """Join a step hook (see :mod:`ampkit.training.hooks`) to this engine's steps from now on."""
        self.hooks.add(hook)

    def diagnose_collapse(self) -> str | None:
        """The message for a collapsed loss scale, naming the parameters whose gradients are not finite; else None."""
        named = [(self._param_names.get(id(p), "?"), p) for o in self.optimizers for g in o.param_groups for p in g["params"]]
        return self.collapse.diagnose(self.scaler, named, self.policy.name)

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped for non-finite gradients. May sync once."""
        resolve_outcome(self)
        return bool(self._state.found_host)  # None only before the first step, or right after a load

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped so far. Syncs (waits for the outcomes still on their way)."""
        resolve_outcome(self)
        return self._state.skipped

    @property
    def grad_norm(self) -> float | None:
        """Total norm of the unscaled gradients before clipping, at the last step (with clip_grad_norm). Syncs."""
        return float(self._state.norm.item()) if self._state.norm is not None else None

    @property
    def scale(self) -> float | None:
        """The current loss scale, or None without scaling. Syncs."""
        return self.scaler.get_scale() if self.scaler is not None else None

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Engine state for exact resume: policy, counters, scaler, masters, pending gradients."""
        return engine_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (after setup, with the same policy)."""
        from ..checkpoint import load_engine_state

        load_engine_state(self, state)

    def save(self, path: Any, extra: dict[str, Any] | None = None) -> None:
        """Write models, optimizers, schedulers, engine state and RNG atomically to ``path``."""
        from ..checkpoint import save_training_state

        save_training_state(self, path, extra)

    def load(self, path: Any) -> dict[str, Any] | None:
        """Restore everything :meth:`save` wrote; returns its ``extra``. Nothing changes if the file is bad."""
        from ..checkpoint import load_training_state

        return load_training_state(self, path)
