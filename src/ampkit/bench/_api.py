"""``ampkit bench`` from Python: your model and your data, the same runs and figures as the command line.

:func:`bench_model` takes the objects that ``--model``/``--data`` factories return and runs what
``ampkit bench --model ... --data ...`` runs; the :class:`~ampkit.bench.BenchResult` it returns is what
``results.json`` holds (``result.write_json(path)``), with a verdict per policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..policy import Policy
from ..policy._device import as_device
from ..workloads._device import default_device
from ..workloads._recipe import check_accumulate
from ..workloads._user import workload_from
from ._defaults import default_precisions, resolve_precisions
from ._results import BenchResult
from ._runner import run_bench

__all__ = ["bench_model"]


def bench_model(
    model: nn.Module,
    data: Any,
    precisions: str | Sequence[str | Policy] | None = None,
    *,
    steps: int = 100,
    warmup: int | None = None,
    device: torch.device | str | None = None,
    seed: int = 0,
    rounds: int = 5,
    tolerance: float | None = None,
    accumulate: int = 1,
    clip_grad_norm: float | None = 1.0,
    compile: Any = None,
    lr: float | None = None,
    batch_size: int | None = None,
) -> BenchResult:
    """Train ``model`` on ``data`` under each policy, from the same weights on the same batches, and compare.

    ``model``: an fp32 ``nn.Module`` (each policy trains a deep copy; ``model`` is left as it was); a
    LightningModule (its ``training_step`` is the loss, its ``configure_optimizers()`` the optimizer); or a model
    ``accelerate.Accelerator.prepare()`` returned (the plain fp32 module inside is benched).
    ``data``: a :class:`~ampkit.bench.BenchData`, or a list (or any iterable, e.g. a DataLoader) of batches:
    ``(inputs, targets)`` pairs or dicts of keyword arguments such as ``{"input_ids", "attention_mask",
    "labels"}`` (see :mod:`ampkit.workloads._user` for the contract); a ``datasets.Dataset`` (collated into
    batches of ``batch_size`` rows, default 8; a DatasetDict's validation split scores the eval); a
    LightningDataModule; None for a LightningModule's own ``train_dataloader()``/``val_dataloader()``.
    ``precisions``: names or aliases, a list or one comma-separated string, or Policy objects
    (``ampkit.get_policy("bf16", keep_fp32=["head"])``), run as given; ``32-true``, the reference, always runs
    first. Default: every policy ``device`` runs fast. ``steps`` counts optimizer steps per policy, ``warmup`` of them untimed (default: a tenth, at
    most 5). ``device``: default the GPU if there is one. ``tolerance``: as ``--tolerance``, how far a policy's
    eval metric may land from 32-true's (default: the metric's own). ``accumulate``: batches per optimizer step
    (a step then counts all of them); ``clip_grad_norm``: the total-norm clip, None for none; ``lr``: as ``--lr``,
    one learning rate for every policy's optimizer (default: the data's optimizer's own). ``compile``: as
    ``--compile``, what ``Engine(compile=...)`` takes (True, ``"regional"``, a dict of torch.compile options):
    each policy also runs compiled, its compile time apart (:mod:`ampkit.bench._recipe`). ``batch_size``: rows per
    batch of a ``datasets.Dataset`` (as ``--batch-size``). For the files ``--out`` writes:
    ``result.write_json(out / "results.json")`` and ``write_report(result, out, plots=write_plots(result, out))``
    from :mod:`ampkit.bench._report` and :mod:`ampkit.bench._plots`.

    >>> g = torch.Generator().manual_seed(0)
    >>> batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(3)]
    >>> result = bench_model(nn.Linear(8, 3), batches, "bf16", steps=4, warmup=1, rounds=1, device="cpu")
    >>> result.workload, [(r.precision, r.status, len(r.losses)) for r in result.runs]
    ('Linear', [('32-true', 'ok', 4), ('bf16-mixed', 'ok', 4)])
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"bench_model(steps={steps!r}): steps must be an int >= 2 (at least one warm-up and one timed step).")
    warmup = min(5, steps // 10) if warmup is None else warmup
    if steps <= warmup:
        raise ValueError(f"bench_model(steps={steps}, warmup={warmup}): steps must exceed warmup so some steps are timed.")
    dev = default_device() if device is None else as_device(device)
    # The edge: names become Policy objects here, once; the runner and the engine take them as they are.
    policies = default_precisions(dev)[0] if precisions is None else resolve_precisions(precisions, dev)
    check_accumulate(accumulate, "bench_model(accumulate=...)")  # before the data is read: K batches a step
    workload = workload_from(model, data, steps=steps, warmup=warmup, accumulate=accumulate, batch_size=batch_size)
    workload.clip_grad_norm = clip_grad_norm
    workload.lr = lr
    return run_bench(
        workload, policies, dev, seed=seed, rounds=rounds, settings={"batch_items": workload.items_per_batch, "unit": workload.unit},
        tolerance=tolerance, compile=compile,
    )
