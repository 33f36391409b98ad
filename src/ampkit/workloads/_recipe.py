"""The training recipe of a workload, as every tool trains it: micro-batches per step, the clip, the learning rate.

A :class:`~ampkit.workloads.Workload` carries its recipe (``accumulate``, ``clip_grad_norm``, ``lr``); the
bench, the profile and the coming tune all train it the same way, so the rules live here, once:

- ``accumulate``: micro-batches per optimizer step (``Engine(accumulate=K)``), an int >= 1;
- ``clip_grad_norm``: the total-norm clip of every policy's gradients, a positive finite number, or None (off);
- ``lr``: one learning rate for every param group of the optimizer (None: the optimizer's own).

    >>> opt = with_lr(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1), 1e-4)
    >>> opt.param_groups[0]["lr"]
    0.0001
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._util.values import check_lr, clip_from
from ._workload import Workload

__all__ = ["check_accumulate", "check_lr", "check_recipe", "clip_from", "with_lr"]


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
    """``optimizer`` with every param group's learning rate set to ``lr`` (None: unchanged), before any step."""
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    return optimizer
