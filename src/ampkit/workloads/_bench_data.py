"""What a ``--data`` factory may return when plain batches are not enough, and the eval metric of last resort.

:class:`BenchData` carries training and eval batches with their loss, metric and unit; :class:`EvalLoss` scores eval
batches by their mean loss where no metric is given. Both are the user's contract, shared by :mod:`ampkit.workloads._user`
(the factories) and the framework adapters (a LightningModule, a ``datasets.Dataset``, an ``hf:`` folder), which each
turn what they read into a BenchData.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ._workload import Batch, Metric

__all__ = ["BenchData", "EvalLoss"]


@dataclass(kw_only=True)
class BenchData:
    """What a ``--data`` factory may return when plain batches are not enough.

    >>> x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    >>> BenchData(train=[(x, y)], eval=[(x, y)], unit="samples").loss_fn is None
    True
    """

    train: Iterable[Batch]
    """Training batches, ``(inputs, targets)`` or dicts of keyword arguments; an iterable is read once, up to the
    number of steps."""
    eval: Iterable[Batch] = ()
    """Held-out batches for the eval metric."""
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    """``loss_fn(output, targets)``, given the output as the model returned it (a floating tensor in fp32) and the
    targets (a dict batch's ``labels``); default: the output's ``.loss``, else cross-entropy or MSE by the
    targets' dtype."""
    metric: Callable[[], Metric] | None = None
    """Factory of a fresh :class:`~ampkit.workloads.Metric`; default: mean eval loss."""
    unit: str | None = None
    """What throughput counts: ``samples`` or ``tokens``; default: ``tokens`` for dict batches with ``input_ids``,
    else ``samples``."""
    items_per_batch: int | None = None
    """Samples (or tokens) per training batch; default: the first batch's ``len(targets)``, or for a dict batch its
    rows (samples) or the ``numel()`` of its ``input_ids`` (tokens, padding included: what the model computes on)."""

    def __post_init__(self) -> None:
        for name in ("train", "eval"):
            value = getattr(self, name)
            if isinstance(value, (torch.Tensor, dict, str, bytes)) or not isinstance(value, Iterable):
                raise TypeError(
                    f"BenchData({name}=...) got {type(value).__name__}; {name} must be a list (or any iterable, e.g. a "
                    "DataLoader) of batches: (inputs, targets) pairs or dicts of model keyword arguments."
                )
        for name in ("loss_fn", "metric"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"BenchData({name}=...) got {type(value).__name__}; {name} must be a callable or None.")
        if self.unit is not None and (not isinstance(self.unit, str) or not self.unit):
            raise TypeError(f"BenchData(unit=...) got {self.unit!r}; unit must be a word such as 'samples' or 'tokens'.")
        n = self.items_per_batch
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"BenchData(items_per_batch=...) got {n!r}; it must be a positive int, or None to count len(targets).")


class EvalLoss:
    """The mean loss over eval batches: the metric of last resort, lower is better, within 0.02 counts as equal.

    The tolerance is in the loss's own units, not a fraction of it: a loss near zero (a classifier that fits its
    eval set) would make any fraction of it a gap far below the eval's noise. For a cross-entropy, 0.02 nats is
    the 2% of perplexity the ``gpt`` workload allows; for a loss on another scale (an MSE), set ``--tolerance``.
    """

    name = "eval_loss"
    higher_is_better = False
    tolerance = 0.02
    relative = False

    def __init__(self, loss_fn: Callable[[Any, Any], torch.Tensor]) -> None:
        self._loss_fn = loss_fn
        self._sum: torch.Tensor | None = None
        self._count = 0

    def update(self, output: Any, target: Any) -> None:
        loss = self._loss_fn(output, target).detach().float()  # the default loss_fn takes a ModelOutput's .loss
        self._sum = loss if self._sum is None else self._sum + loss
        self._count += 1

    def compute(self) -> dict[str, float]:
        return {self.name: float("nan") if self._sum is None else self._sum.item() / self._count}
