"""Eval metrics for the built-in workloads beyond :class:`~ampkit.workloads.Accuracy`.

Both follow the :class:`~ampkit.workloads.Metric` protocol: ``update()`` only launches device work (no
``.item()``, no boolean indexing, nothing whose output size depends on the data), so an eval loop over many
batches never waits on the accelerator; ``compute()`` reads the totals back once.

    >>> m = SegmentationMetrics(num_classes=2)
    >>> m.update(torch.tensor([[[[0.9, 0.1]], [[0.1, 0.9]]]]), torch.tensor([[[0, 0]]]))
    >>> m.compute()
    {'mIoU': 0.25, 'pixel_accuracy': 0.5}
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

__all__ = ["LanguageModelMetrics", "SegmentationMetrics"]


class SegmentationMetrics:
    """Mean IoU and pixel accuracy of per-pixel class logits ``(B, C, H, W)`` against labels ``(B, H, W)``.

    A ``(C, C)`` confusion matrix (rows: target, columns: prediction) is summed on the device. mIoU averages
    ``TP / (TP + FP + FN)`` over the classes that occur in the targets or the predictions, so a class absent
    from the eval set does not count as a perfect (or a zero) score. Pixels labelled ``ignore_index`` are left
    out of both figures. Within 0.02 mIoU of fp32 counts as equal.

    >>> m = SegmentationMetrics(num_classes=3)
    >>> logits = F.one_hot(torch.tensor([[[0, 1, 1, 2]]]), 3).permute(0, 3, 1, 2).float()  # predicts 0 1 1 2
    >>> m.update(logits, torch.tensor([[[0, 1, 2, 2]]]))
    >>> m.compute()
    {'mIoU': 0.6666666666666666, 'pixel_accuracy': 0.75}
    """

    name = "mIoU"
    higher_is_better = True
    tolerance = 0.02
    relative = False

    def __init__(self, num_classes: int, ignore_index: int | None = None) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}.")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self._confusion: torch.Tensor | None = None

    def update(self, output: torch.Tensor, target: torch.Tensor) -> None:
        c = self.num_classes
        if output.dim() != target.dim() + 1 or output.shape[1] != c:
            raise ValueError(
                f"SegmentationMetrics expects logits (B, {c}, ...) and targets (B, ...); "
                f"got {tuple(output.shape)} and {tuple(target.shape)}."
            )
        pred = output.argmax(1).flatten()
        target = target.flatten().long()
        index = target * c + pred
        if self.ignore_index is not None:
            # Send ignored pixels to an extra bin dropped by compute(): masking them out would be a sync.
            index = torch.where(target == self.ignore_index, c * c, index)
        if self._confusion is None:
            self._confusion = torch.zeros(c * c + 1, dtype=torch.int64, device=output.device)
        # index_add_ into a fixed-size buffer rather than torch.bincount: bincount sizes its output from the
        # data (min/max read back to the host on CUDA), which would be one sync per eval batch.
        self._confusion.index_add_(0, index, torch.ones_like(index))

    def confusion(self) -> torch.Tensor:
        """The ``(C, C)`` confusion matrix so far (rows: target class, columns: predicted class)."""
        c = self.num_classes
        if self._confusion is None:
            return torch.zeros(c, c, dtype=torch.int64)
        return self._confusion[: c * c].view(c, c)

    def compute(self) -> dict[str, float]:
        cm = self.confusion().cpu().double()  # the one read-back
        total = cm.sum()
        if total == 0:
            return {self.name: float("nan"), "pixel_accuracy": float("nan")}
        tp = cm.diagonal()
        union = cm.sum(0) + cm.sum(1) - tp
        present = union > 0
        miou = (tp[present] / union[present]).mean()
        return {self.name: miou.item(), "pixel_accuracy": (tp.sum() / total).item()}


class LanguageModelMetrics:
    """Perplexity and mean token cross-entropy of next-token logits ``(B, T, V)`` against targets ``(B, T)``.

    Perplexity is ``exp`` of the mean cross-entropy over all eval tokens (not a mean of per-batch
    perplexities). Targets equal to ``ignore_index`` are left out, as in :func:`torch.nn.functional.cross_entropy`.
    Perplexity spans orders of magnitude over training, so the tolerance is relative: within 2% of fp32.

    >>> m = LanguageModelMetrics()
    >>> m.update(torch.zeros(1, 3, 4), torch.tensor([[0, 1, 2]]))  # uniform over 4 symbols
    >>> round(m.compute()["perplexity"], 6)
    4.0
    """

    name = "perplexity"
    higher_is_better = False
    tolerance = 0.02
    relative = True

    def __init__(self, ignore_index: int = -100) -> None:
        self.ignore_index = ignore_index
        self._loss_sum: torch.Tensor | None = None
        self._tokens: torch.Tensor | None = None

    def update(self, output: torch.Tensor, target: torch.Tensor) -> None:
        if output.dim() != 3 or output.shape[:2] != target.shape:
            raise ValueError(
                f"LanguageModelMetrics expects logits (B, T, V) and targets (B, T); "
                f"got {tuple(output.shape)} and {tuple(target.shape)}."
            )
        logits = output.reshape(-1, output.shape[-1]).float()  # the sum of many tokens wants fp32 at least
        flat = target.reshape(-1)
        loss = F.cross_entropy(logits, flat, ignore_index=self.ignore_index, reduction="sum")
        tokens = (flat != self.ignore_index).sum()  # counted on the device: no sync
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._tokens = tokens if self._tokens is None else self._tokens + tokens

    def compute(self) -> dict[str, float]:
        if self._loss_sum is None or self._tokens is None or self._tokens.item() == 0:
            return {self.name: float("nan"), "eval_loss": float("nan")}
        mean = self._loss_sum.item() / self._tokens.item()
        # exp of a diverged model's loss overflows a float; report inf rather than raise.
        perplexity = math.exp(mean) if mean < 709.0 else float("inf")
        return {self.name: perplexity, "eval_loss": mean}
