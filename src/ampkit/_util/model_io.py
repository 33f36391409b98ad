"""How a model is called on a user's batch and how its output becomes a loss: one rule for every tool.

bench, memory (estimate, recompute) and the doctor all run a model on batches they did not build, so they
share these few functions rather than each guessing the batch's form:

- A batch is ``(inputs, targets)``: ``inputs`` a tensor (``model(inputs)``), a tuple or list
  (``model(*inputs)``) or a dict (``model(**inputs)``). Or a batch is a dict of keyword arguments, as a
  Hugging Face tokenizer or collator returns it (``input_ids``, ``attention_mask``, ``labels``): it is passed as
  ``model(**batch)`` and its targets are ``batch["labels"]`` (None when it has none).
- The default loss (:func:`default_loss`) takes the model's own ``.loss`` when its output carries one (a
  ``transformers`` ``ModelOutput`` given labels, a dict or dataclass with a ``loss``); otherwise cross-entropy
  (integer targets) or mean squared error (floating ones) of the output's ``.logits``, or of a tuple's first
  tensor (a dict or dataclass with neither ``loss`` nor ``logits`` is refused, naming its keys).
  A ``loss_fn`` of your own gets the output as the model returned it.

    >>> import torch
    >>> from torch import nn
    >>> class WithLoss(nn.Module):
    ...     def forward(self, input_ids, labels):
    ...         return {"loss": (input_ids - labels).float().pow(2).mean(), "logits": input_ids.float()}
    >>> batch_loss(WithLoss(), {"input_ids": torch.ones(2, 3), "labels": torch.zeros(2, 3)}, default_loss)
    tensor(1.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["call_model", "batch_parts", "run_batch", "batch_loss", "default_loss", "output_as_float", "prediction", "to_device", "LOSS_FN_HINT", "OutputError"]

_PASS_LOSS_FN = "pass a loss function that takes this output: BenchData(loss_fn=...) for --data (loss_fn= in Python)"
LOSS_FN_HINT = f"{_PASS_LOSS_FN}, e.g. loss_fn=lambda out, y: F.cross_entropy(out.logits.flatten(0, 1), y.flatten())"
"""How to fix a model output the default loss cannot use, for the errors that meet one."""


class OutputError(TypeError):
    """A model output the default loss cannot read; the message names its fields and the fix, whole."""


def call_model(model: nn.Module, inputs: Any) -> Any:
    """Run ``model`` on a batch's inputs: ``model(**inputs)`` for a dict, ``model(*inputs)`` for a tuple or list,
    ``model(inputs)`` otherwise.

    >>> call_model(nn.Identity(), torch.ones(1))
    tensor([1.])
    """
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)


def batch_parts(batch: Any) -> tuple[Any, Any]:
    """``(inputs, targets)`` of a batch: the pair itself, or for a dict batch the dict and its ``labels`` (or None).

    >>> batch_parts({"input_ids": 1, "labels": 2})
    ({'input_ids': 1, 'labels': 2}, 2)
    """
    if isinstance(batch, Mapping):
        return batch, batch.get("labels")
    inputs, target = batch
    return inputs, target


def output_as_float(output: Any) -> Any:
    """A floating output in fp32 (other outputs unchanged): the loss is computed in fp32 whatever the policy
    computes in, so every policy optimises the same function.

    >>> output_as_float(torch.ones(1, dtype=torch.bfloat16)).dtype
    torch.float32
    """
    return output.float() if isinstance(output, torch.Tensor) and output.is_floating_point() else output


def run_batch(model: nn.Module, batch: Any) -> tuple[Any, Any]:
    """The model's output on ``batch`` (in fp32 when it is a floating tensor) and the batch's targets."""
    inputs, target = batch_parts(batch)
    return output_as_float(call_model(model, inputs)), target


def batch_loss(model: nn.Module, batch: Any, loss_fn: Callable[[Any, Any], torch.Tensor]) -> torch.Tensor:
    """``loss_fn(output, targets)`` of ``model`` on ``batch``: the one way every tool turns a batch into a loss."""
    return loss_fn(*run_batch(model, batch))


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping):  # a ModelOutput is a dict too; its unset fields are absent, not None
        return output.get(name)
    if dataclasses.is_dataclass(output) or hasattr(type(output), name):
        return getattr(output, name, None)
    return None


def _model_loss(output: Any) -> torch.Tensor | None:
    loss = _field(output, "loss")
    return loss if isinstance(loss, torch.Tensor) else None


def prediction(output: Any) -> torch.Tensor:
    """The tensor a default loss compares with the targets: the output itself, its ``.logits``, or a tuple's first tensor.

    A dict (a ``ModelOutput`` too) or dataclass without ``logits`` is refused, naming its keys: which of its
    named tensors is the prediction cannot be told, and training on the wrong one (a hidden state) runs silently.

    >>> prediction((torch.zeros(2), "aux"))
    tensor([0., 0.])
    >>> prediction({"hidden": torch.zeros(2), "scores": torch.zeros(2)})
    Traceback (most recent call last):
    ...
    ampkit._util.model_io.OutputError: the model returned a dict with keys 'hidden', 'scores' and neither 'loss' nor 'logits': ...
    """
    if isinstance(output, torch.Tensor):
        return output
    logits = _field(output, "logits")
    if isinstance(logits, torch.Tensor):
        return logits
    named = _named_fields(output)
    if named is not None:
        keys = ", ".join(repr(k) for k in named) or "none"
        # The example reads the last field: a head's output usually comes after the hidden states it is computed from.
        last = named[-1] if named else "scores"
        read = f"out[{last!r}]" if isinstance(output, Mapping) else f"out.{last}"
        raise OutputError(
            f"the model returned a {type(output).__name__} with keys {keys} and neither 'loss' nor 'logits': which is the "
            f"prediction cannot be told; return 'logits' (or 'loss'), or {_PASS_LOSS_FN}, e.g. "
            f"loss_fn=lambda out, y: F.cross_entropy({read}, y) if {last!r} is the prediction."
        )
    values: Any = output if isinstance(output, (tuple, list)) else ()
    first = next((v for v in values if isinstance(v, torch.Tensor)), None)
    if first is None:
        raise TypeError(f"the model returned {type(output).__name__}, with no .loss, .logits or tensor to compute a loss from; {LOSS_FN_HINT}.")
    return first


def _named_fields(output: Any) -> list[str] | None:
    """The field names of a dict or dataclass output (its keys), None for any other output."""
    if isinstance(output, Mapping):
        return [str(k) for k in output]
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return [f.name for f in dataclasses.fields(output)]
    return None


def default_loss(output: Any, target: Any) -> torch.Tensor:
    """The model's own loss if its output is one (a ``.loss``, or a bare scalar); else cross-entropy for integer
    targets, mean squared error for floating ones, of :func:`prediction` in fp32.

    >>> default_loss(torch.zeros(2, 4), torch.tensor([0, 3])).item() == torch.log(torch.tensor(4.0)).item()
    True
    >>> default_loss({"logits": torch.zeros(2, 5, 4)}, torch.zeros(2, 5, dtype=torch.long)).item() == torch.log(torch.tensor(4.0)).item()
    True
    >>> default_loss(torch.tensor(0.25), torch.zeros(2, 5, dtype=torch.long))
    tensor(0.2500)
    """
    loss = _model_loss(output)
    if loss is not None:
        return loss.float()
    if isinstance(output, torch.Tensor) and output.dim() == 0 and output.is_floating_point():
        return output.float()  # a model that computes its own loss (from labels in the batch) and returns it bare
    if target is None:
        raise TypeError(
            f"the batch has no targets (a dict batch without 'labels') and the model's output ({type(output).__name__}) has "
            f"no .loss; put the labels in the batch, or {LOSS_FN_HINT}."
        )
    pred = prediction(output).float()
    if target.is_floating_point():
        return nn.functional.mse_loss(pred, target)
    if pred.dim() > 2 and pred.shape[:-1] == target.shape and pred.shape[:1] + pred.shape[2:] != target.shape:
        # Sequence models put the classes last ((batch, time, vocab) logits for (batch, time) labels), where
        # cross_entropy wants them second; an unambiguous layout is flattened rather than refused.
        return nn.functional.cross_entropy(pred.flatten(0, -2), target.flatten())
    return nn.functional.cross_entropy(pred, target)


def to_device(value: Any, device: torch.device, channels_last: bool = False, *, non_blocking: bool = True) -> Any:
    """``value`` (a batch: a tensor, or tuples, lists and dicts of them) with every tensor on ``device``, 4-D
    floating tensors in channels_last when asked; other values as they are. No copy for tensors already there.
    ``non_blocking`` is ``Tensor.to``'s: a copy from pinned memory returns before it completes.

    >>> to_device({"x": torch.ones(1, 2), "n": 3}, torch.device("cpu"))
    {'x': tensor([[1., 1.]]), 'n': 3}
    """
    if isinstance(value, torch.Tensor):
        value = value.to(device, non_blocking=non_blocking)
        if channels_last and value.dim() == 4 and value.is_floating_point():
            value = value.contiguous(memory_format=torch.channels_last)
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device, channels_last, non_blocking=non_blocking) for v in value)
    if isinstance(value, Mapping):  # a dict batch (input_ids, attention_mask, labels) or dict inputs
        return {k: to_device(v, device, channels_last, non_blocking=non_blocking) for k, v in value.items()}
    return value
