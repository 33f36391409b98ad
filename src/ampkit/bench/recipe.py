"""The training recipe a bench runs: accumulation, clipping, torch.compile, and what results.json records of it.

A bench should measure the recipe a user trains with, not only the workload's defaults. The batch size is the
workload's to build (:func:`ampkit.bench.workloads.get_workload`); the rest is set here on a
:class:`~ampkit.bench.workload.Workload` or handed to the runner:

- ``accumulate``: micro-batches per optimizer step (``Engine(accumulate=K)``). A bench *step* is then one
  optimizer update over ``K`` consecutive batches, so its time and throughput count all ``K`` of them.
- ``lr``: one learning rate for every param group of every policy's optimizer (None: the optimizer's own). A
  smaller one shows which 16-bit policies lose updates: bf16 drops an update below half an ulp of its weight.
- ``clip_grad_norm``: the total-norm clip of every policy's gradients; None turns clipping off.
- ``compile``: each policy also runs compiled (``Engine(compile=...)``), as its *compiled twin*, in the same
  interleaved rounds; the twin's compile time is kept apart from its step time.

    >>> runs_to_build(["32-true", "bf16-mixed"], "regional")
    [('32-true', None), ('32-true', 'regional'), ('bf16-mixed', None), ('bf16-mixed', 'regional')]
    >>> compile_mode({"backend": "aot_eager"}), compile_mode(None)
    ('model', None)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .._util.values import check_lr, clip_from
from ..training.compile import compile_plan
from .workload import Workload

__all__ = ["check_accumulate", "check_lr", "check_recipe", "clip_from", "compile_mode", "recipe_settings", "runs_to_build", "with_lr"]


def compile_mode(spec: Any) -> str | None:
    """What ``Engine(compile=spec)`` compiles: ``"model"``, ``"regional"`` (each repeated block), or None.

    Bad input raises ValueError naming the accepted forms (those of :func:`ampkit.training.compile.compile_plan`).
    """
    plan = compile_plan(spec)
    if plan is None:
        return None
    return "regional" if plan.regional else "model"


def runs_to_build(precisions: Sequence[str], compile: Any = None) -> list[tuple[str, str | None]]:
    """``(policy, compile mode)`` of every run, in table order: each policy, then its compiled twin when ``compile``."""
    mode = compile_mode(compile)
    return [(p, m) for p in precisions for m in ((None,) if mode is None else (None, mode))]


def check_accumulate(k: Any, option: str = "--accumulate") -> int:
    """``k`` as micro-batches per optimizer step: an int >= 1, else a ValueError naming ``option``."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{option} {k!r}: gradient accumulation takes an int >= 1 (micro-batches per optimizer step).")
    return k


def check_recipe(workload: Workload) -> None:
    """Refuse an accumulation or a clip the engine cannot run, naming the option that sets it."""
    check_accumulate(workload.accumulate, "accumulate (--accumulate)")
    if workload.lr is not None:
        check_lr(workload.lr, "lr (--lr)")
    clip = workload.clip_grad_norm
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not math.isfinite(clip) or clip <= 0):
        raise ValueError(f"clip_grad_norm (--clip) {clip!r}: the gradient-norm clip must be a positive finite number, or None (--clip none) for no clipping.")


def with_lr(optimizer: torch.optim.Optimizer, lr: float | None) -> torch.optim.Optimizer:
    """``optimizer`` with every param group's learning rate set to ``lr`` (None: unchanged), before any step.

    >>> opt = with_lr(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1), 1e-4)
    >>> opt.param_groups[0]["lr"]
    0.0001
    """
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    return optimizer


def recipe_settings(workload: Workload, compile: Any, tolerance: float | None, batch_size: int | None) -> dict[str, Any]:
    """What results.json's ``settings`` records of the recipe, so the table can be reproduced.

    ``compile`` is kept as given when it is JSON data (True, ``"regional"``, a dict of plain options).
    """
    return {
        "batch_size": batch_size,
        "accumulate": workload.accumulate,
        "step_items": workload.items_per_batch * workload.accumulate,
        "clip_grad_norm": workload.clip_grad_norm,
        "lr": workload.lr,
        "tolerance": tolerance,
        "compile": compile if compile is None or isinstance(compile, (bool, str, dict)) else repr(compile),
    }
