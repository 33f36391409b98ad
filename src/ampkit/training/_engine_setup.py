"""What ``Engine.setup()`` builds: the run (:class:`Run`: models, wrappers, device, strategy, compiled regions) and
its optimizer step (:class:`~ampkit.training.OptimizerStep`, which owns the scaler, the masters and
the compiled steps).

Everything that can be refused is checked before anything changes (the optimizers, the compile plan, a fused step
that is insisted on); then the policy converts the optimizers (bf16-true-kahan/-sr: the libraries' twins), the
strategy spreads and the policy casts the models (:mod:`~ampkit.training._model_setup`), and the step is built on
the result.

    >>> from torch import nn
    >>> from ampkit.policy import get_policy
    >>> model = nn.Linear(2, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> run, optimizers = set_up([model], [opt], policy=get_policy("O2"), settings=StepSettings(skip_nonfinite=True))
    >>> run.device, type(run.step.masters).__name__, optimizers[0] is opt
    (device(type='cpu'), 'MasterWeights', True)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..distributed._agreement import world_size
from ..distributed._strategy import SingleProcess, Strategy
from ..policy import Policy
from ..policy._islands import retarget_islands
from ..policy._masters import MasterWeights
from ..scaling._protocol import StepScaler
from ._compile import (
    CompilePlan,
    apply_compile,
    check_compile_plan,
    unwrap_user_compiled,
)
from ._engine_args import adopt_schedulers, check_optimizer_params, check_setup_args
from ._fused_library_step import build_library_step, check_library_step
from ._fused_master_step import build_fused_step, check_fused_step
from ._hooks import Hooks
from ._model_setup import prepare_models
from ._optimizer_step import OptimizerStep, StepSettings
from ._rounding_stream import rounding_stream
from ._step_state import StepState

__all__ = ["Run", "StepParts", "adopt_optimizers", "set_up"]

log = logging.getLogger("ampkit")


@dataclass(frozen=True)
class Run:
    """What setup() made of the models it was given; before setup, an empty run on the CPU."""

    step: OptimizerStep
    """The optimizer step, with the optimizers, schedulers, scaler and masters it owns."""
    strategy: Strategy | None = None
    """The strategy that runs (None for a single process)."""
    parallel: Strategy | SingleProcess = field(default_factory=SingleProcess)
    """The same, or the do-nothing strategy."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    models: list[nn.Module] = field(default_factory=list)
    """The modules themselves (inside any DDP wrapper): names, state, parameters."""
    wrappers: list[nn.Module] = field(default_factory=list)
    """What setup() returned and the loop calls: DDP wrappers, or the models."""
    named: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    """Every parameter by the name checkpoints use."""
    compiled: list[str] = field(default_factory=list)
    """The regions torch.compile compiled ('' for a whole model)."""
    values: dict[int, torch.Tensor] | None = None
    """After ``setup_module``: the fp32 values the masters of optimizers still to come are cloned from (empty for a
    policy without masters); None once the optimizers are set up, or after a one-call setup."""


@dataclass(frozen=True, kw_only=True)
class StepParts:
    """What building the optimizer step takes besides the optimizers: the engine's settings and parts."""

    policy: Policy
    settings: StepSettings
    scaler: StepScaler | None = None
    plan: CompilePlan | None = None
    fused_spec: bool | dict[str, Any] | None = None
    state: StepState | None = None
    hooks: Hooks | None = None
    owner: Any = None


def set_up(
    models: nn.Module | Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    *,
    policy: Policy,
    settings: StepSettings,
    scaler: StepScaler | None = None,
    strategy: Strategy | None = None,
    plan: CompilePlan | None = None,
    fused_spec: bool | dict[str, Any] | None = None,
    schedulers: Any = None,
    state: StepState | None = None,
    hooks: Hooks | None = None,
    owner: Any = None,
    later: bool = False,
    device: torch.device | None = None,
) -> tuple[Run, tuple[torch.optim.Optimizer, ...]]:
    """Prepare ``models`` and ``optimizers`` for ``policy`` and build the step; returns the run and the optimizers the
    loop steps (the policy's twins where it converts them). ``owner`` is what step hooks are called with.

    ``later``: the optimizers are built on the prepared models and come in :func:`adopt_optimizers` (``optimizers``
    is empty): the fp32 values their masters need are kept; ``device`` is where a framework will move the models (the
    casts are made for it, and it is checked once the optimizers come).
    """
    parts = StepParts(policy=policy, settings=settings, scaler=scaler, plan=plan, fused_spec=fused_spec, state=state, hooks=hooks, owner=owner)
    given, plan = unwrap_user_compiled(check_setup_args(models, optimizers), plan)
    parts = dataclasses.replace(parts, plan=plan)
    opts = _converted(optimizers, parts) if not later else ()
    check_compile_plan(given, plan)  # before the policy and the strategy change the models
    prepared = prepare_models(given, opts, policy, strategy, keep_values=later, device=device)
    step = _build_step(opts, schedulers, parts, prepared.device, prepared.masters, prepared.named, prepared.parallel)
    compiled = apply_compile(prepared.models, plan) if plan is not None else []
    advice = policy.compile_advice(prepared.device.type, compiled=plan is not None)
    if advice is not None and not later:  # said once the device is known for sure (adopt_optimizers)
        log.warning("%s", advice)
    run = Run(
        step, prepared.strategy, prepared.parallel, prepared.device, prepared.models, prepared.wrappers, prepared.named, compiled,
        values=prepared.values if later else None,
    )
    return run, opts


def adopt_optimizers(run: Run, optimizers: Sequence[torch.optim.Optimizer], schedulers: Any, parts: StepParts) -> tuple[Run, tuple[torch.optim.Optimizer, ...]]:
    """Give ``run`` (set up by ``set_up(..., later=True)``) the optimizers built on its prepared models; returns the run
    with its optimizer step built on them, and the optimizers the loop steps.

    The models may have moved since (a framework puts them on their device after the policy cast them): the device is
    read from them now and checked, the fp32 islands are pointed at it, and the masters are cloned there from the
    fp32 values kept at setup. May be called again with optimizers not adopted yet (a second model's, or a GAN's
    second optimizer, met at its first step), except under bf16-true-remainder, whose masters are one flat store.
    """
    if run.values is None:
        raise RuntimeError("setup_optimizers() follows setup_module(model); after setup(model, optimizer) the optimizers are set.")
    check_setup_args(run.models, optimizers)
    held = run.step.optimizers
    again = [type(o).__name__ for o in optimizers if any(o is h for h in held)]
    if again:
        raise ValueError(f"setup_optimizers(): {again} were set up already; pass each optimizer once.")
    policy = parts.policy
    if held and run.step.masters is not None and not type(run.step.masters).mergeable:
        raise ValueError(
            f"setup_optimizers() called again under {policy.name!r}, whose master weights are one flat store: set up every "
            "optimizer in one setup_optimizers(opt_a, opt_b) call (or one setup(model, opt_a, opt_b))."
        )
    first = next((p for m in run.models for p in m.parameters()), None)
    device = first.device if first is not None else run.device
    policy.check_device(device)
    opts = _converted(optimizers, parts)
    check_optimizer_params(opts, {id(p) for _, p in run.named})
    if device.type != run.device.type:
        for m in run.models:
            retarget_islands(m, device.type)
    scheds = [*run.step.schedulers, *adopt_schedulers(schedulers, opts)]
    masters = policy.build_masters(run.models, run.named, opts, values=run.values)
    if run.step.masters is not None and masters is not None:
        masters = run.step.masters.merged(masters)
    elif masters is None:
        masters = run.step.masters
    step = _build_step((*held, *opts), scheds, parts, device, masters, run.named, run.parallel, adopted=True)
    advice = policy.compile_advice(device.type, compiled=parts.plan is not None)
    if advice is not None and not held:
        log.warning("%s", advice)
    # The values are an fp32 copy of the model: keep only those a later optimizer may still need (trainable
    # parameters no optimizer holds yet); a frozen layer's would be held for nothing.
    adopted = {id(p) for o in opts for g in o.param_groups for p in g["params"]} | {id(p) for p in (masters.model_params if masters else [])}
    left = {id(p) for _, p in run.named if p.requires_grad and id(p) not in adopted}
    values = {k: v for k, v in run.values.items() if k in left}
    return dataclasses.replace(run, step=step, device=device, values=values), opts


def _converted(optimizers: Sequence[torch.optim.Optimizer], parts: StepParts) -> tuple[torch.optim.Optimizer, ...]:
    """The optimizers the policy steps in place of ``optimizers`` (its library twins), once the fused step that is
    insisted on is known to run with them: refused before anything changes."""
    policy = parts.policy
    opts = tuple(policy.convert_optimizers(optimizers))
    if not policy.master_weights:  # no master step to fuse: the library's step may be (bf16-true-sr's)
        check_library_step(parts.fused_spec, opts)
    else:
        check_fused_step(parts.fused_spec, opts, True, untraceable=policy.master_store.untraceable)
    return opts


def _build_step(
    opts: Sequence[torch.optim.Optimizer], schedulers: Any, parts: StepParts, device: torch.device, masters: MasterWeights | None,
    named: Sequence[tuple[str, nn.Parameter]], parallel: Strategy | SingleProcess, *, adopted: bool = False,
) -> OptimizerStep:
    """The optimizer step of ``opts`` (``schedulers``: LR schedulers, or already adopted ones when ``adopted``)."""
    policy = parts.policy
    # Each rank checks its own gradients for inf/NaN; the flags must be combined unless the gradients were all-reduced
    # already (DDP), or ranks would disagree on skipping and their weights drift apart.
    reduce_found_flags = world_size() > 1 and not parallel.grads_reduced
    names = {id(p): n for n, p in named}
    if masters is not None:
        names.update({id(m): n for n, m in zip(masters.names, masters.masters)})
    options = parts.plan.options if parts.plan is not None else None
    # FSDP's ranks each check their own shards; the fused step does not combine their flags.
    sharded = "each rank's overflow flag must be combined with the others' (FSDP)" if reduce_found_flags else None
    library = not policy.master_weights and bool(opts)
    return OptimizerStep(
        opts, schedulers if adopted else adopt_schedulers(schedulers, opts), settings=parts.settings, scaler=parts.scaler,
        masters=masters,
        fused=build_fused_step(parts.fused_spec, options, opts, masters, sharded) if policy.master_weights and opts else None,
        library=build_library_step(parts.fused_spec, options, opts) if library else None,
        rounding=rounding_stream(opts, device),  # one stream for every replica (DDP)
        state=parts.state, device=device, names=names, reduce_found_flags=reduce_found_flags, hooks=parts.hooks, owner=parts.owner,
        policy_name=policy.name,
    )
