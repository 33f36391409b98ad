"""A ``datasets.Dataset`` from ``--data`` (or ``bench_model(model, dataset)``), collated into batches.

The rows are taken in order, :data:`DEFAULT_BATCH_SIZE` a batch unless ``--batch-size`` says otherwise, only whole
batches (a last partial one is left out, as ``drop_last=True`` would), up to the batches the run reads. Columns that
are not numbers or lists of numbers (the raw ``text``) are left out, with one log line naming them; a ``label`` column
becomes ``labels``, the name Hugging Face models take. The batches are made by transformers' own collators:

- Tokenized rows (an ``input_ids`` column) of one length: ``default_data_collator``; a causal LM without a label
  column gets its inputs as labels (padding, where ``attention_mask`` is 0, ignored as -100).
- Rows of different lengths are padded with the tokenizer of the model's folder (``--model hf:PATH``, or the folder
  a ``from_pretrained`` model was read from): ``DataCollatorWithPadding`` for one label a row,
  ``DataCollatorForTokenClassification`` for a label a token, ``DataCollatorForLanguageModeling(mlm=False)`` for a
  causal LM without labels. Without a tokenizer they are refused, naming the fixes.
- Feature columns and a label column (no ``input_ids``): a dict of keyword arguments when the model's ``forward``
  takes the columns by name (a Hugging Face model), else an ``(inputs, labels)`` pair of the one feature column.

A ``datasets.DatasetDict`` trains on its ``train`` split and scores its ``validation`` (else ``test``) split.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._util.framework_versions import require
from ._bench_data import BenchData
from ._frameworks import is_hf_dataset_dict, is_hf_model

__all__ = ["DEFAULT_BATCH_SIZE", "EVAL_BATCHES", "dataset_bench_data"]

log = logging.getLogger("ampkit")

DEFAULT_BATCH_SIZE = 8
"""Rows per batch without ``--batch-size``: Hugging Face Trainer's default ``per_device_train_batch_size``."""
EVAL_BATCHES = 32
"""Eval batches read from the eval split, at most."""

Tokenizer = Callable[[], Any]


def _splits(data: Any, where: str) -> tuple[Any, Any, str | None]:
    if not is_hf_dataset_dict(data):
        return data, None, None
    if "train" not in data:
        raise ValueError(f"{where} returned a DatasetDict without a 'train' split (it has {', '.join(data) or 'none'}); return dataset['<split>'] to train on.")
    name = next((s for s in ("validation", "test") if s in data), None)
    return data["train"], (data[name] if name else None), name


def _numeric(value: Any) -> bool:
    try:
        torch.as_tensor(value)  # a number or a (nested) list of numbers; a string is refused
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


def _columns(dataset: Any, where: str) -> list[str]:
    first = dataset[0]
    keep = [c for c in dataset.column_names if _numeric(first[c])]
    dropped = [c for c in dataset.column_names if c not in keep]
    if dropped:
        log.info("%s: columns left out of the batches (not numbers): %s", where, ", ".join(dropped))
    if not keep:
        raise ValueError(f"{where}: the dataset has no numeric column ({', '.join(dataset.column_names)}); tokenize it first (dataset.map(tokenizer)).")
    return keep


def _rows(dataset: Any, columns: list[str], start: int, stop: int) -> list[dict[str, Any]]:
    chunk = dataset[start:stop]
    names = ["labels" if c == "label" and "labels" not in columns else c for c in columns]
    return [dict(zip(names, values, strict=True)) for values in zip(*(chunk[c] for c in columns), strict=True)]


def _takes_by_name(model: nn.Module, names: list[str]) -> bool:
    parameters = inspect.signature(model.forward).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return True
    return set(names) <= {p.name for p in parameters}


def _is_causal_lm(model: nn.Module) -> bool:
    if not is_hf_model(model):
        return False
    from ._hf_folder import is_causal_lm

    return is_causal_lm(model)


def _collator(rows: list[dict[str, Any]], model: nn.Module, tokenizer: Tokenizer | None, where: str) -> tuple[Callable[[list[Any]], Any], str]:
    """The transformers collator for these rows and its name."""
    import transformers

    if "input_ids" not in rows[0] or len({len(r["input_ids"]) for r in rows}) == 1:
        return transformers.default_data_collator, "default_data_collator"
    tok = tokenizer() if tokenizer is not None else None
    if tok is None:
        raise ValueError(
            f"{where}: the rows' input_ids differ in length and there is no tokenizer to pad them with; pad them in the "
            "dataset (tokenizer(..., padding='max_length', max_length=N)), pass --model hf:FOLDER with the tokenizer saved "
            "in it, or return a DataLoader with your collator."
        )
    labels = rows[0].get("labels")
    if labels is None and _is_causal_lm(model):
        return transformers.DataCollatorForLanguageModeling(tok, mlm=False), "DataCollatorForLanguageModeling(mlm=False)"
    if isinstance(labels, (list, tuple)):
        return transformers.DataCollatorForTokenClassification(tok), "DataCollatorForTokenClassification"
    return transformers.DataCollatorWithPadding(tok), "DataCollatorWithPadding"


def _as_batch(collated: Any, form: str, feature: str | None, causal: bool) -> Any:
    batch = dict(collated)
    if causal and "labels" not in batch and "input_ids" in batch:
        mask = batch.get("attention_mask")
        labels = batch["input_ids"].clone()
        batch["labels"] = labels if mask is None else labels.masked_fill(mask == 0, -100)
    if form == "pair":
        return batch[feature], batch["labels"]
    return batch


def _form(names: list[str], model: nn.Module, where: str, dict_batches: bool) -> tuple[str, str | None]:
    """``("kwargs", None)``: dict batches, ``model(**batch)``; ``("pair", column)``: ``(batch[column], labels)``."""
    features = [n for n in names if n != "labels"]
    if dict_batches or "input_ids" in names or _takes_by_name(model, features + (["labels"] if "labels" in names else [])):
        return "kwargs", None
    if "labels" not in names:
        raise ValueError(f"{where}: the dataset has no label column ('label' or 'labels') and {type(model).__name__} does not take its columns by name; add the labels.")
    if len(features) != 1:
        raise ValueError(
            f"{where}: {len(features)} feature columns ({', '.join(features)}) and {type(model).__name__}.forward does not take "
            "them by name; put the features in one column, or return a DataLoader of (inputs, labels) batches."
        )
    return "pair", features[0]


def _batches(
    dataset: Any, columns: list[str], size: int, count: int, model: nn.Module, tokenizer: Tokenizer | None, where: str, dict_batches: bool,
) -> tuple[list[Any], str]:
    stop = min(len(dataset), count * size) // size * size
    rows = _rows(dataset, columns, 0, stop)
    collate, name = _collator(rows, model, tokenizer, where)
    form, feature = _form(list(rows[0]), model, where, dict_batches)
    causal = "labels" not in rows[0] and _is_causal_lm(model)
    return [_as_batch(collate(rows[i:i + size]), form, feature, causal) for i in range(0, stop, size)], name


def dataset_bench_data(
    data: Any, model: nn.Module, *, batch_size: int | None, count: int, where: str, tokenizer: Tokenizer | None = None,
    dict_batches: bool = False,
) -> tuple[BenchData, str]:
    """``count`` training batches of ``data`` (a Dataset or DatasetDict) for ``model``, its eval split's batches, and a
    line saying what they are. ``tokenizer()`` gives the tokenizer that pads rows of different lengths (or None);
    ``dict_batches``: always dicts of columns (a LightningModule's step takes the batch as it is)."""
    require("datasets", where)
    require("transformers", f"{where} (its collators)")
    size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    train, held, split = _splits(data, where)
    if len(train) < size:
        raise ValueError(f"{where}: the dataset has {len(train)} rows, fewer than one batch of {size}; give more rows or a smaller --batch-size.")
    columns = _columns(train, where)
    train_batches, collator = _batches(train, columns, size, count, model, tokenizer, where, dict_batches)
    eval_batches: list[Any] = []
    if held is not None and len(held) >= size:
        eval_batches, _ = _batches(held, [c for c in columns if c in held.column_names], size, EVAL_BATCHES, model, tokenizer, where, dict_batches)
    what = (
        f"datasets.Dataset of {len(train):,} rows ({', '.join(columns)}): {len(train_batches)} batches of {size} rows "
        f"({'--batch-size' if batch_size else 'the default'}), collated by {collator}; "
        + (f"eval: {len(eval_batches)} batches of the '{split}' split" if eval_batches else "no eval split")
    )
    return BenchData(train=train_batches, eval=eval_batches), what
