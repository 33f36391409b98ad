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

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..distributed._agreement import world_size
from ..distributed._strategy import SingleProcess, Strategy
from ..policy import Policy
from ..scaling._protocol import StepScaler
from ._compile import (
    CompilePlan,
    apply_compile,
    check_compile_plan,
    unwrap_user_compiled,
)
from ._engine_args import adopt_schedulers, check_setup_args
from ._fused_library_step import build_library_step, check_library_step
from ._fused_master_step import build_fused_step, check_fused_step
from ._hooks import Hooks
from ._model_setup import prepare_models
from ._optimizer_step import OptimizerStep, StepSettings
from ._rounding_stream import rounding_stream
from ._step_state import StepState

__all__ = ["Run", "set_up"]

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
) -> tuple[Run, tuple[torch.optim.Optimizer, ...]]:
    """Prepare ``models`` and ``optimizers`` for ``policy`` and build the step; returns the run and the optimizers the
    loop steps (the policy's twins where it converts them). ``owner`` is what step hooks are called with."""
    given, plan = unwrap_user_compiled(check_setup_args(models, optimizers), plan)
    opts = tuple(policy.convert_optimizers(optimizers))
    check_compile_plan(given, plan)  # before the policy and the strategy change the models
    library = not policy.master_weights  # no master step to fuse: the library's step may be (bf16-true-sr's)
    if library:
        check_library_step(fused_spec, opts)
    else:
        check_fused_step(fused_spec, opts, True, untraceable=policy.master_store.untraceable)
    prepared = prepare_models(given, opts, policy, strategy)
    device, masters = prepared.device, prepared.masters
    # Each rank checks its own gradients for inf/NaN; the flags must be combined unless the gradients were all-reduced
    # already (DDP), or ranks would disagree on skipping and their weights drift apart.
    reduce_found_flags = world_size() > 1 and not prepared.parallel.grads_reduced
    names = {id(p): n for n, p in prepared.named}
    if masters is not None:
        names.update({id(m): n for n, m in zip(masters.names, masters.masters)})
    options = plan.options if plan is not None else None
    # FSDP's ranks each check their own shards; the fused step does not combine their flags.
    sharded = "each rank's overflow flag must be combined with the others' (FSDP)" if reduce_found_flags else None
    step = OptimizerStep(
        opts, adopt_schedulers(schedulers, opts), settings=settings, scaler=scaler, masters=masters,
        fused=None if library else build_fused_step(fused_spec, options, opts, masters, sharded),
        library=build_library_step(fused_spec, options, opts) if library else None,
        rounding=rounding_stream(opts, device),  # one stream for every replica (DDP)
        state=state, device=device, names=names, reduce_found_flags=reduce_found_flags, hooks=hooks, owner=owner,
        policy_name=policy.name,
    )
    compiled = apply_compile(prepared.models, plan) if plan is not None else []
    advice = policy.compile_advice(device.type, compiled=plan is not None)
    if advice is not None:
        log.warning("%s", advice)
    run = Run(step, prepared.strategy, prepared.parallel, device, prepared.models, prepared.wrappers, prepared.named, compiled)
    return run, opts
