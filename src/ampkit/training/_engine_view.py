"""What an :class:`~ampkit.training.Engine` lets its users and tools read: its settings, the parts setup()
built, where the run stands and how the last optimizer step went. All of it read-only.

The settings are fixed when the engine is built and the parts belong to their owners (the optimizer step owns the
scaler, the masters, the optimizers and the compiled steps); assigning one raises an AttributeError that names what
to write instead (:mod:`~ampkit.training._read_only`), a misspelt name included, which would otherwise change nothing.
``micro_batch_rows`` is the one to assign.

    >>> from ampkit import Engine
    >>> engine = Engine("16-mixed", clip_grad_norm=1.0)
    >>> engine.clip_grad_norm, type(engine.scaler).__name__
    (1.0, 'DynamicLossScaler')
    >>> engine.clip_grad_norm = 2.0
    Traceback (most recent call last):
    ...
    AttributeError: engine.clip_grad_norm is read-only: build the engine with it, Engine(..., clip_grad_norm=...); a run keeps the settings it was built with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from torch import nn

from ..policy import Policy
from ._compile import CompilePlan
from ._engine_setup import Run
from ._hooks import Hooks
from ._micro_batching import MicroBatcher
from ._optimizer_step import StepSettings
from ._read_only import WRITABLE, ReadOnly, refusal
from ._step_state import StepState

if TYPE_CHECKING:
    from ..numerics._sampler import NumericsSampler  # a layer up: Engine(numerics=N) takes the sampler

__all__ = ["EngineView"]

T = TypeVar("T")


def _read(get: Callable[[EngineView], T], doc: str) -> ReadOnly[EngineView, T]:
    # A ReadOnly of EngineView: ``get`` is type-checked against the engine's fields, and the attribute's type is
    # what ``get`` returns (engine.policy is a Policy to users' type checkers), stated nowhere else.
    return ReadOnly(get, doc)


class EngineView:
    """The read side of the engine (see the module docstring); :class:`~ampkit.training.Engine` fills it in."""

    _policy: Policy
    _accumulate: int
    _settings: StepSettings
    _batcher: MicroBatcher
    _compile_plan: CompilePlan | None
    _numerics: NumericsSampler | None
    _hooks: Hooks
    _state: StepState
    _run: Run

    def _require_setup(self, what: str) -> None:
        if not self._run.models:
            raise RuntimeError(f"engine.{what}() called before engine.setup(model, optimizer); call setup() first.")

    def __setattr__(self, name: str, value: Any) -> None:
        # The configuration is fixed once built and the parts belong to their owners: assigning one is refused, naming
        # the fix (read_only); private names are the engine's own bookkeeping.
        if not (name.startswith("_") or name in WRITABLE):
            raise refusal(name, known=hasattr(type(self), name))
        object.__setattr__(self, name, value)

    policy = _read(lambda e: e._policy, "The precision policy (a :class:`~ampkit.policy.Policy`).")
    accumulate = _read(lambda e: e._accumulate, "Micro-batches per optimizer step.")
    clip_grad_norm = _read(lambda e: e._settings.clip_grad_norm, "The total gradient norm the step clips to, or None.")
    clip_grad_value = _read(lambda e: e._settings.clip_grad_value, "The absolute gradient value the step clamps to, or None.")
    skip_nonfinite = _read(lambda e: e._settings.skip_nonfinite, "Whether a step whose gradients hold inf/NaN is skipped.")
    on_oom = _read(lambda e: e._batcher.on_oom, "What train_step does on an out-of-memory error: 'split' or 'raise'.")
    compile_plan = _read(lambda e: e._compile_plan, "What compile= asked for (a CompilePlan), or None.")
    numerics = _read(lambda e: e._numerics, "The numerics sampler numerics= built, or None.")
    hooks = _read(lambda e: e._hooks, "The step hooks (see ampkit.training._hooks); join one with add_hook().")
    strategy = _read(lambda e: e._run.strategy, "The strategy that spreads the model over the ranks (DDP, FSDP), or None.")
    device = _read(lambda e: e._run.device, "The device the models train on (after setup).")
    models = _read(lambda e: e._run.models, "The modules themselves (inside any DDP wrapper), after setup.")
    wrappers = _read(lambda e: e._run.wrappers, "What setup() returned and the loop calls: DDP wrappers, or the models.")
    compiled = _read(lambda e: e._run.compiled, "The regions compile= compiled after setup ('' for a whole model).")
    optimizer_step = _read(lambda e: e._run.step, "The optimizer step (an OptimizerStep): it owns the parts below.")
    optimizers = _read(lambda e: e._run.step.optimizers, "The optimizers setup() adopted (the policy's twins where it converts them).")
    schedulers = _read(lambda e: e._run.step.schedulers, "The LR schedulers setup() adopted.")
    scaler = _read(lambda e: e._run.step.scaler, "The loss scaler, or None without loss scaling.")
    masters = _read(lambda e: e._run.step.masters, "The fp32 master weights (MasterWeights) of a master-weight policy, or None.")
    fused_step = _read(lambda e: e._run.step.fused, "The compiled master-weight step (FusedMasterStep), or None.")
    library_step = _read(lambda e: e._run.step.library, "The compiled library step (FusedLibraryStep, bf16-true-sr), or None.")
    rounding = _read(lambda e: e._run.step.rounding, "The stochastic rounding's stream (bf16-true-sr), or None.")
    collapse = _read(lambda e: e._run.step.collapse, "The collapse watch: reports a collapsed loss scale once per episode.")

    @property
    def micro_batch_rows(self) -> int | None:
        """Most rows :meth:`train_step` feeds at once (None: the whole batch); learnt after an OOM. Assignable."""
        return self._batcher.rows

    @micro_batch_rows.setter
    def micro_batch_rows(self, rows: int | None) -> None:
        self._batcher.learn(rows)

    @property
    def micro_batches_pending(self) -> int:
        """Micro-batches accumulated since the last optimizer step; 0 at a window boundary. No sync.

        >>> import torch
        >>> from ampkit import Engine
        >>> model = nn.Linear(2, 1); engine = Engine(accumulate=3)
        >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> pending = []
        >>> for _ in range(4):
        ...     engine.backward(model(torch.ones(1, 2)).sum()); _ = engine.step(); pending.append(engine.micro_batches_pending)
        >>> pending
        [1, 2, 0, 1]
        """
        return self._state.pending(self._accumulate)

    @property
    def is_boundary(self) -> bool:
        """True when the next ``step()`` ends an accumulation window and updates the weights."""
        return self._state.window(self._accumulate)[1]

    @property
    def steps(self) -> int:
        """Optimizer steps taken (skipped ones included). No sync."""
        return self._state.steps

    @property
    def step_state(self) -> StepState:
        """Where the run stands: the counters a checkpoint keeps (``to_dict``) and the last step's outcome."""
        return self._state

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The models' parameters by the names checkpoints use (``"0.weight"`` with several models); after setup."""
        return list(self._run.named)

    def diagnose_collapse(self) -> str | None:
        """The message for a collapsed loss scale, naming the parameters whose gradients are not finite; else None."""
        return self._run.step.diagnose_collapse()

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped for non-finite gradients. May sync once."""
        self._run.step.resolve()
        return bool(self._state.found_host)  # None only before the first step, or right after a load

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped so far. Syncs (waits for the outcomes still on their way)."""
        self._run.step.resolve()
        return self._state.skipped

    @property
    def grad_norm(self) -> float | None:
        """Total norm of the unscaled gradients before clipping, at the last step (with clip_grad_norm). Syncs."""
        return float(self._state.norm.item()) if self._state.norm is not None else None

    @property
    def scale(self) -> float | None:
        """The current loss scale, or None without scaling. Syncs."""
        scaler = self._run.step.scaler
        return scaler.get_scale() if scaler is not None else None
