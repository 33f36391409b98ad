"""The training recipe a bench runs: accumulation, clipping, torch.compile, and what results.json records of it.

A bench should measure the recipe a user trains with, not only the workload's defaults. The batch size is the
workload's to build (:func:`ampkit.workloads.get_workload`); the rest is set on a
:class:`~ampkit.workloads.Workload` (its rules: :mod:`ampkit.workloads._recipe`) or handed to the runner:

- ``accumulate``: micro-batches per optimizer step (``Engine(accumulate=K)``). A bench *step* is then one
  optimizer update over ``K`` consecutive batches, so its time and throughput count all ``K`` of them.
- ``lr``: one learning rate for every param group of every policy's optimizer (None: the optimizer's own). A
  smaller one shows which 16-bit policies lose updates: bf16 drops an update below half an ulp of its weight.
- ``clip_grad_norm``: the total-norm clip of every policy's gradients; None turns clipping off.
- ``compile``: each policy also runs compiled (``Engine(compile=...)``), as its *compiled twin*, in the same
  interleaved rounds; the twin's compile time is kept apart from its step time.

    >>> from ampkit.policy import get_policy
    >>> [(p.name, mode) for p, mode in runs_to_build([get_policy("32-true"), get_policy("bf16-mixed")], "regional")]
    [('32-true', None), ('32-true', 'regional'), ('bf16-mixed', None), ('bf16-mixed', 'regional')]
    >>> compile_mode({"backend": "aot_eager"}), compile_mode(None)
    ('model', None)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..policy import Policy
from ..training._compile import compile_plan
from ..workloads import Workload

__all__ = ["compile_mode", "recipe_settings", "runs_to_build"]


def compile_mode(spec: Any) -> str | None:
    """What ``Engine(compile=spec)`` compiles: ``"model"``, ``"regional"`` (each repeated block), or None.

    Bad input raises ValueError naming the accepted forms (those of :func:`ampkit.training._compile.compile_plan`).
    """
    plan = compile_plan(spec)
    if plan is None:
        return None
    return "regional" if plan.regional else "model"


def runs_to_build(policies: Sequence[Policy], compile: Any = None) -> list[tuple[Policy, str | None]]:
    """``(policy, compile mode)`` of every run, in table order: each policy, then its compiled twin when ``compile``."""
    mode = compile_mode(compile)
    return [(p, m) for p in policies for m in ((None,) if mode is None else (None, mode))]


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
        "channels_last": workload.channels_last,  # the memory format every run trained in: part of what to paste
    }
