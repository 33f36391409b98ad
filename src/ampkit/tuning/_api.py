"""``ampkit.tune(model, data, ...)``: the tune of the user's own model and data, from Python."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..workloads import BenchData, Workload, default_device, workload_from
from ..workloads._framework_inputs import tool_inputs
from ..workloads._lightning_step import StepCall, step_loader
from ..workloads._optimizer_twin import optimizer_twin
from ..workloads._prepared import unwrap_optimizer
from ._result import TuneResult
from ._run import tune_workload
from ._trials import DEFAULT_WAVES, WaveSettings

__all__ = ["optimizer_factory", "tune"]


def optimizer_factory(optimizer: Any, model: nn.Module) -> Callable[[Any], torch.optim.Optimizer] | None:
    """What every trial builds its optimizer with: a factory ``params -> optimizer`` as given, or, for an optimizer
    of ``model``, one of the same class, groups and settings over a copy's parameters (the instance itself is never
    stepped, and its state is not copied: each trial starts as a fresh run does).

    >>> m = nn.Linear(2, 2)
    >>> opt = torch.optim.SGD([{"params": [m.weight], "lr": 0.5}, {"params": [m.bias]}], lr=0.1, momentum=0.9)
    >>> twin = optimizer_factory(opt, m)(nn.Linear(2, 2).parameters())  # a copy's parameters, in the model's order
    >>> [(g["lr"], g["momentum"]) for g in twin.param_groups]
    [(0.5, 0.9), (0.1, 0.9)]
    """
    if optimizer is None or (callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer)):
        return optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer={type(optimizer).__name__}: pass a torch.optim.Optimizer of the model, a factory params -> optimizer, or None.")
    return optimizer_twin(optimizer, model, "optimizer: it holds parameters that are not the model's; build it on this model's parameters, or pass "
                          "optimizer=lambda params: YourOptimizer(params, ...).")


def tune(
    model: nn.Module,
    data: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    optimizer: Any = None,
    *,
    device: torch.device | str | None = None,
    budget: float = 300.0,
    run_steps: int = 1000,
    out: Path | str | None = None,
    seed: int = 0,
    clip_grad_norm: float | None = 1.0,
    guard_steps: int | None = None,
    waves: WaveSettings = DEFAULT_WAVES,
    memory_budget: int | None = None,
    stages: Sequence[str] | None = None,
    precisions: Sequence[str] | None = None,
    progress: Callable[[str, float, float], None] | None = None,
) -> TuneResult:
    """The fastest training configuration of ``model`` on ``data`` that keeps fp32's accuracy, measured here.

    ``model``: the fp32 ``nn.Module`` as you train it (each trial trains a deep copy: ``model`` keeps its weights);
    a LightningModule (its ``training_step`` is the loss, its ``configure_optimizers()`` the optimizer) or a model
    ``accelerate.Accelerator.prepare()`` returned (its plain fp32 module is tuned) too.
    ``data``: what :func:`ampkit.bench.bench_model` takes: a list (or any iterable) of batches, ``(inputs,
    targets)`` pairs or dicts of keyword arguments (a Hugging Face batch with ``labels``: the model's ``.loss`` is
    the loss); a :class:`ampkit.workloads.BenchData` (with eval batches, the accuracy guard scores its metric);
    or a DataLoader, whose workers, pinning and prefetch are tuned too; a ``datasets.Dataset`` (collated, 8 rows a
    batch) or a LightningDataModule; None for a LightningModule's own ``train_dataloader()``.
    ``loss_fn(output, targets)``: default, the output's ``.loss``, else cross-entropy or MSE. ``optimizer``: an
    optimizer of ``model`` (copied, never stepped; an ``AcceleratedOptimizer``'s own) or a factory ``params ->
    optimizer``; default AdamW (a LightningModule's: its ``configure_optimizers()``). ``budget``: wall-clock seconds; ``run_steps``: the steps
    your real run trains, over which compile time is amortised; ``out``: a folder where trials are kept, so a
    killed tune resumes (write ``tune.json`` and ``report.md`` there with :func:`ampkit.tuning.write_files`).
    ``stages``: only these levers (:data:`ampkit.tuning.STAGES`); ``precisions``: only these policies (names or
    aliases; default: every policy the device runs fast). ``waves``, ``guard_steps``: the trials' and the accuracy
    guard's lengths; ``memory_budget``: bytes a step may use (default: what the device has free). The result
    holds the ranked table (:func:`ampkit.tuning.rows`) and the winner (:func:`ampkit.tuning.code`).

    >>> g = torch.Generator().manual_seed(0)
    >>> batches = [(torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)) for _ in range(4)]
    >>> result = tune(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), batches, device="cpu",
    ...               budget=60, guard_steps=6, stages=["precision"], precisions=["bf16-mixed"])  # doctest: +SKIP
    >>> result.winner.policy in ("32-true", "bf16-mixed")  # doctest: +SKIP
    True
    """
    dev = default_device() if device is None else torch.device(device)
    loader = data if isinstance(data, torch.utils.data.DataLoader) else None
    steps = max(guard_steps or 30, waves.steps)
    optimizer = unwrap_optimizer(optimizer)  # Accelerator.prepare()'s wrapper: the torch optimizer inside is the one to copy
    if loss_fn is not None:  # given before the data is read: the check of one forward and loss uses it
        model, data, loss_fn = tool_inputs(model, data, loss_fn, count=steps, what="tune()")  # a Dataset's batches made here
        data = dataclasses.replace(data, loss_fn=loss_fn) if isinstance(data, BenchData) else BenchData(train=data, loss_fn=loss_fn)
    workload: Workload = workload_from(model, data, steps=steps, warmup=min(5, steps // 10))
    factory = optimizer_factory(optimizer, model)
    if factory is not None:
        workload.optimizer = factory
    workload.clip_grad_norm = clip_grad_norm
    if loader is not None and isinstance(workload.model, StepCall):
        loader = step_loader(loader)  # the loader trials feed a LightningModule's training_step its own batches
    return tune_workload(
        workload, dev, budget=budget, run_steps=run_steps, out=out, seed=seed, waves=waves, guard_steps=guard_steps,
        memory_budget=memory_budget, loader=loader, stages=stages, precisions=precisions, progress=progress or (lambda what, elapsed, left: None),
    )
