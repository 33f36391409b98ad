"""What one training step dispatches: aten ops and host syncs, counted, to compare two loops without a clock.

A wrapper's overhead on a short step is mostly what it adds per step: kernel launches (each a dispatched op) and
host-device syncs (each a drained queue). Both are deterministic, so two loops over the same model and data can
be compared exactly on any machine, a CPU included, where timing them would take a GPU and many rounds.
:func:`count_step` runs a step once under a ``TorchDispatchMode`` that counts the aten ops (the backward's too:
autograd carries the mode to its threads) and a :class:`~ampkit.profile.SyncFinder` that counts the reads,
the library's own included.

    >>> model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> def step(x):
    ...     model(x).sum().backward(); opt.step(); opt.zero_grad()
    >>> counts = count_step(step, torch.ones(2, 4))
    >>> counts.syncs, counts.by_op["aten.addmm.default"]
    (0, 1)

Warm the step up first (``warmup``, default 1): a first step allocates optimizer state and initialises
scalers, which later steps do not repeat.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._syncs import SyncFinder

__all__ = ["StepCounts", "count_step"]


@dataclass(frozen=True)
class StepCounts:
    """The ops and syncs of one step.

    >>> StepCounts(ops=3, syncs=0, by_op=Counter({"aten.mul.Tensor": 2, "aten.add.Tensor": 1})) - StepCounts(ops=1, syncs=0, by_op=Counter({"aten.mul.Tensor": 1}))
    Counter({'aten.mul.Tensor': 1, 'aten.add.Tensor': 1})
    """

    ops: int
    """aten ops dispatched (views and other kernel-free ops included: each costs host time)."""
    syncs: int
    """Host reads of device values (``.item()``, ``bool(t)``, a copy to the CPU; on CUDA every synchronising call)."""
    by_op: Counter[str] = field(default_factory=Counter)
    """Ops by name (``aten.add.Tensor``), for finding where two steps differ."""

    def __sub__(self, other: StepCounts) -> Counter[str]:
        """The ops this step dispatches more often than ``other`` (by name, with the excess count)."""
        return self.by_op - other.by_op


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.by_op[str(func)] += 1
        return func(*args, **(kwargs or {}))


def count_step(step_fn: Callable[..., Any], *args: Any, warmup: int = 1, device: torch.device | str | None = None, **kwargs: Any) -> StepCounts:
    """Call ``step_fn(*args, **kwargs)`` ``warmup`` times, then once more counting its ops and host syncs.

    ``device``: where the step runs (for the sync count: a dispatch mode on the CPU, torch's sync debug mode on
    CUDA; see :class:`~ampkit.profile.SyncFinder`); default: the device of the first tensor among the
    arguments, else the CPU. Each sync is also counted as ops where it dispatches one (``.item()`` does).
    """
    for _ in range(warmup):
        step_fn(*args, **kwargs)
    if device is None:
        device = next((a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), torch.device("cpu"))
    with SyncFinder(device, library=True) as syncs, _OpCounter() as ops:
        step_fn(*args, **kwargs)
    return StepCounts(ops=sum(ops.by_op.values()), syncs=syncs.total, by_op=ops.by_op)
