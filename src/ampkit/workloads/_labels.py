"""Class labels checked against the model's classes before any policy trains on them.

A label past the model's last class fails deep in the loss (``IndexError: Target 7 is out of bounds``), once
per policy row when it sits in a later batch, or is read as a loss the user should replace when it sits in the
first. The default loss is cross-entropy of integer targets against the output's classes
(:func:`ampkit._util.model_io.default_loss`), so the number of classes is the output's class dimension, taken by
the same layout rule; every batch's labels are then checked once, at setup, naming the first bad one.

    >>> batches = [(torch.zeros(2, 4), torch.tensor([0, 2])), (torch.zeros(2, 4), torch.tensor([1, 7]))]
    >>> check_labels(torch.zeros(2, 3), torch.tensor([0, 2]), {"training": batches}, "--data d:f")
    Traceback (most recent call last):
    ...
    ValueError: --data d:f: training batch 1 has label 7, but the model outputs 3 classes (an output of shape (2, 3)); ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._util.model_io import batch_parts, prediction

__all__ = ["IGNORE_INDEX", "check_labels", "class_count"]

IGNORE_INDEX = -100
"""The label cross-entropy skips (torch's ``ignore_index`` default, a Hugging Face collator's padding)."""


def class_count(output: Any, target: Any) -> int | None:
    """How many classes ``output`` scores ``target``'s integer labels over, by :func:`default_loss`'s layout rule:
    classes second (``(N, C)``, ``(N, C, H, W)``), or last for ``(batch, time, classes)`` against ``(batch, time)``.
    None where the output has no logits, the targets are not integer labels, or no layout fits (the loss then
    says why); also for one output column, which a Hugging Face model reads as regression, not classes.

    >>> class_count(torch.zeros(2, 5, 7), torch.zeros(2, 5, dtype=torch.long)), class_count(torch.zeros(4, 3), torch.zeros(4))
    (7, None)
    """
    pred = _scores(output)
    if pred is None or not _are_labels(target):
        return None
    shape, labels = tuple(pred.shape), tuple(target.shape)
    if len(shape) > 2 and shape[:-1] == labels and shape[:1] + shape[2:] != labels:
        classes = shape[-1]
    elif len(shape) >= 2 and shape[:1] + shape[2:] == labels:
        classes = shape[1]
    else:
        return None
    return classes if classes > 1 else None


def check_labels(output: Any, target: Any, batches: Mapping[str, Sequence[Any]], where: str) -> None:
    """Raise ValueError naming the first label in ``batches`` (``{"training": [...], "eval": [...]}``) outside the
    classes that ``output`` (the model's output on the first batch, whose targets are ``target``) scores; ``where``
    names the data (``--data pkg.module:factory``). Labels of -100 are skipped, as cross-entropy does."""
    classes = class_count(output, target)
    if classes is None:
        return
    for what, group in batches.items():
        for i, batch in enumerate(group):
            labels = batch_parts(batch)[1]
            if not _are_labels(labels):
                continue
            bad = ((labels >= classes) | (labels < 0)) & (labels != IGNORE_INDEX)
            if bool(bad.any()):  # one read per batch, at setup: never on a training step
                label = int(labels[bad][0])
                shape = tuple(prediction(output).shape)
                raise ValueError(
                    f"{where}: {what} batch {i} has label {label}, but the model outputs {classes} classes (an output of shape "
                    f"{_shape_text(shape)}); labels must be 0 to {classes - 1} ({IGNORE_INDEX} skips a position): fix the labels, "
                    "or the model's number of outputs."
                )


def _scores(output: Any) -> torch.Tensor | None:
    """The output's logits (or the output, or a tuple's first tensor); None for one without."""
    try:
        return prediction(output)
    except TypeError:
        return None


def _are_labels(target: Any) -> bool:
    return isinstance(target, torch.Tensor) and not (target.is_floating_point() or target.is_complex() or target.dtype == torch.bool)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"
