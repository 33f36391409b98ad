"""What a workload is: a model, deterministic batches, a loss, an eval metric and the unit of throughput.

Built-in workloads (:mod:`ampkit.workloads._registry`) and user factories (``--model``/``--data``) both end up as a
:class:`Workload`, so the runner treats them alike. Every policy's run gets a deep copy of the same
``model`` and walks the same ``train_batches`` in the same order, which is what makes the comparison fair.

    >>> import torch
    >>> from torch import nn
    >>> batches = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(4)]
    >>> w = Workload(name="toy", model=nn.Linear(4, 3), train_batches=batches, eval_batches=batches[:1],
    ...              metric=Accuracy, items_per_batch=8, unit="samples")
    >>> w.steps, w.loss_fn is nn.functional.cross_entropy
    (100, True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from .._util.model_io import call_model, output_as_float

__all__ = ["SIZES", "Accuracy", "Batch", "Metric", "Workload", "call_model", "default_optimizer", "output_as_float"]

Batch = tuple[Any, torch.Tensor] | Mapping[str, Any]
"""One step's ``(inputs, targets)``, ``inputs`` a tensor (or a tuple passed as ``model(*inputs)``, a dict as
``model(**inputs)``); or a dict of keyword arguments, ``model(**batch)``, whose targets are its ``labels``
(see :mod:`ampkit._util.model_io`)."""

SIZES = ("tiny", "small", "large")
"""``tiny``: seconds, for tests; ``small``: the CPU default (<= 2 minutes on 2 cores); ``large``: a GPU."""


class Metric(Protocol):
    """An eval metric accumulated over eval batches on the device (no host sync per batch).

    ``name`` is the headline figure ``compute()`` must return; ``compute()`` may add more (pixel accuracy, eval
    loss). ``tolerance`` is how far from the 32-true figure a policy may land and still count as "within":
    absolute, or a fraction of the reference when ``relative`` is True.
    """

    name: str
    higher_is_better: bool
    tolerance: float
    relative: bool

    def update(self, output: torch.Tensor, target: torch.Tensor) -> None: ...

    def compute(self) -> dict[str, float]: ...


class Accuracy:
    """Top-1 accuracy of class logits ``(N, C)`` against labels ``(N,)``; within 2 points of fp32 counts as equal.

    >>> m = Accuracy(); m.update(torch.tensor([[2.0, 1.0], [0.0, 1.0]]), torch.tensor([0, 0])); m.compute()
    {'accuracy': 0.5}
    """

    name = "accuracy"
    higher_is_better = True
    tolerance = 0.02
    relative = False

    def __init__(self) -> None:
        self._correct: torch.Tensor | None = None
        self._total = 0

    def update(self, output: torch.Tensor, target: torch.Tensor) -> None:
        correct = (output.argmax(1) == target).sum()  # stays on the device until compute()
        self._correct = correct if self._correct is None else self._correct + correct
        self._total += target.numel()

    def compute(self) -> dict[str, float]:
        if self._correct is None or self._total == 0:
            return {self.name: float("nan")}
        return {self.name: self._correct.item() / self._total}


def default_optimizer(params: Any, lr: float = 1e-3) -> torch.optim.Optimizer:
    """AdamW with torch's fused kernel where it exists (CUDA; CPU since torch 2.4): the fast optimizer step."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, fused=True)


@dataclass(kw_only=True)
class Workload:
    """Everything the bench runner needs to train and evaluate one model under several policies.

    Tensors in the batches may live on the CPU; the runner moves them to the device once, before timing.
    """

    name: str
    """Short name shown in tables: ``digits``, ``segment``, ``gpt``, ``resnet``, or the class name of a --model's module."""
    model: nn.Module
    """The fp32 model with its initial weights; each policy's run trains a deep copy."""
    train_batches: Sequence[Batch]
    """The training batches in order; step ``i`` uses ``train_batches[i % len(train_batches)]``."""
    eval_batches: Sequence[Batch] = ()
    """Held-out batches for ``metric``; empty for throughput-only workloads."""
    metric: Callable[[], Metric] | None = None
    """Factory of a fresh metric per run; None: no eval metric (throughput and memory only)."""
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy
    """``loss_fn(output, target)``; the runner passes the model's output cast to fp32."""
    optimizer: Callable[[Any], torch.optim.Optimizer] = default_optimizer
    """``optimizer(params)``; the same kind and settings for every policy."""
    items_per_batch: int
    """Samples (or tokens) per training batch, for throughput."""
    unit: str = "samples"
    """What throughput counts: ``samples`` or ``tokens``."""
    steps: int = 100
    """Optimizer steps per policy (warm-up included)."""
    warmup: int = 3
    """Leading steps excluded from timing (kernel selection, allocator growth, optimizer state creation)."""
    clip_grad_norm: float | None = 1.0
    """Gradient clipping (max total norm) applied identically under every policy; None: off."""
    lr: float | None = None
    """The learning rate of every param group of every policy's optimizer (``--lr``); None: the optimizer's own."""
    accumulate: int = 1
    """Micro-batches (consecutive ``train_batches``) per optimizer step; a bench step is one optimizer update."""
    channels_last: bool = False
    """Convert model and 4-D inputs to channels_last (what makes CPU bf16 convolutions fast)."""
    description: str = ""
    """One line for the report: model, data, sizes."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Workload facts worth recording in results.json (parameter count, sequence length, image size...)."""
    samples: torch.utils.data.Dataset[Any] | None = None
    """The per-sample dataset ``train_batches`` are collated from, ``items_per_batch`` samples at a time and in
    order, where the workload has one (``ampkit profile`` then loads it through a DataLoader whose settings it
    tries); None: the batches themselves are the data."""

    def __post_init__(self) -> None:
        if not self.train_batches:
            raise ValueError(f"workload {self.name!r} has no training batches; give it at least one (inputs, targets) pair.")
        if self.steps <= self.warmup:
            raise ValueError(f"workload {self.name!r}: steps={self.steps} must exceed warmup={self.warmup} so some steps are timed.")
        if self.items_per_batch < 1:
            raise ValueError(f"workload {self.name!r}: items_per_batch must be >= 1, got {self.items_per_batch}.")
        if self.samples is not None and self.unit != "samples":
            raise ValueError(f"workload {self.name!r}: a per-sample dataset needs unit='samples' (items_per_batch is its batch size).")
        if self.eval_batches and self.metric is None:
            raise ValueError(f"workload {self.name!r} has eval batches but no metric; pass metric= (e.g. Accuracy).")

    def batch(self, step: int) -> Batch:
        """The batch for training step ``step`` (identical under every policy)."""
        return self.train_batches[step % len(self.train_batches)]
