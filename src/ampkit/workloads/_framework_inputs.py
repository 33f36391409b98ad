"""The user's framework objects turned into what every tool takes: a plain module, batches, an optimizer.

One dispatch for :func:`~ampkit.workloads.workload_from` (so for ``--model``/``--data`` and every Python API
built on it) and for the tools that take a model and batches directly (``memory.estimate``, ``numerics.diagnose``):

- a model ``accelerate.Accelerator.prepare()`` returned: the plain fp32 module inside (:mod:`~ampkit.workloads._prepared`);
- a LightningModule: its step, its data and its optimizer (:mod:`~ampkit.workloads._lightning_module`);
- a ``datasets.Dataset``/``DatasetDict``: collated batches (:mod:`~ampkit.workloads._hf_datasets`);
- a Hugging Face model without data: the data :mod:`~ampkit.workloads._hf_default_data` can make honestly;
- anything else: as it was.

    >>> from torch import nn
    >>> plain = framework_inputs(nn.Linear(2, 2), [], count=1, where="model", data_where="data")
    >>> plain.optimizer, plain.facts, plain.data_text
    (None, {}, None)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._util.model_io import default_loss
from ._bench_data import BenchData
from ._frameworks import framework_facts, is_datamodule, is_hf_dataset, is_hf_dataset_dict, is_hf_model, is_lightning_module
from ._hf_datasets import dataset_bench_data
from ._hf_folder import HfFolder, folder_tokenizer
from ._lightning_module import hook_loaders, lightning_inputs, step_output_loss
from ._lightning_step import StepCall
from ._prepared import unwrap_prepared

__all__ = ["FrameworkInputs", "framework_inputs", "tool_inputs"]


@dataclass
class FrameworkInputs:
    """What :func:`framework_inputs` made of the user's objects."""

    model: nn.Module
    """The module the tools train (deep copies of it): plain torch, fp32."""
    data: Any
    """A BenchData or an iterable of batches, as ``workload_from`` reads them."""
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None
    """The user's optimizer as a factory ``params -> optimizer`` (a LightningModule's); None: the tools' default."""
    data_text: str | None = None
    """What the data is, where the user did not give it as batches (a Dataset, a module's own loaders, made data)."""
    facts: dict[str, Any] = field(default_factory=dict)
    """``Workload.extra`` entries: the framework (:func:`~ampkit.workloads._frameworks.framework_facts`)."""


def _batch_size_refused(batch_size: int, data_where: str) -> ValueError:
    return ValueError(
        f"--batch-size {batch_size} applies to a built-in workload's data (or a datasets.Dataset); your {data_where} makes "
        "its own batches: return batches of that many rows from it (or drop --batch-size)."
    )


def framework_inputs(
    model: Any, data: Any, *, count: int, where: str, data_where: str, batch_size: int | None = None, folder: HfFolder | None = None,
    seed: int = 0, optimizer: bool = True,
) -> FrameworkInputs:
    """``model`` and ``data`` as the tools take them; ``count`` training batches are needed. ``data`` None asks for
    the model's own (a LightningModule's loaders, an ``hf:`` folder's made data). ``where``/``data_where`` name them
    in errors (``--model X``, ``--data Y``); ``folder``: the ``hf:`` folder the model came from; ``optimizer``: False
    where the caller takes no optimizer from the model (a LightningModule's configure_optimizers is not called)."""
    model = unwrap_prepared(model, where)
    facts = framework_facts(model)
    if folder is not None:
        facts["hf_path"] = str(folder.path)
        facts["hf_weights"] = folder.weights or f"none: random initialisation from config.json (seed {seed})"
    if is_lightning_module(model) and not isinstance(model, StepCall):  # a step module's batches are step batches already
        step, bench, factory, text = lightning_inputs(
            model, data, count=count, where=where, data_where=data_where, batch_size=batch_size, optimizer=optimizer,
        )
        if batch_size is not None and not (is_hf_dataset(data) or is_hf_dataset_dict(data)):
            raise _batch_size_refused(batch_size, data_where if data is not None else f"{where}'s train_dataloader()")
        return FrameworkInputs(step, bench, factory, text, facts)
    if data is None:
        if not is_hf_model(model):
            raise ValueError(f"{where} needs data to train on: pass --data pkg.module:factory (or, from Python, the batches).")
        from ._hf_default_data import default_hf_data

        if batch_size is not None:
            raise _batch_size_refused(batch_size, "default data (made for the model)")
        bench, text = default_hf_data(model, folder, spec=where.removeprefix("--model "), count=count, seed=seed)
        return FrameworkInputs(model, bench, None, text, facts)
    if is_hf_dataset(data) or is_hf_dataset_dict(data):
        bench, text = dataset_bench_data(
            data, model, batch_size=batch_size, count=count, where=data_where, tokenizer=lambda: folder_tokenizer(model, folder),
        )
        return FrameworkInputs(model, bench, None, text, facts)
    if batch_size is not None:
        raise _batch_size_refused(batch_size, data_where)
    if is_datamodule(data):
        train, val = hook_loaders(data, data_where)
        return FrameworkInputs(model, BenchData(train=train, eval=val), None, f"the {type(data).__name__} (a LightningDataModule) from {data_where}", facts)
    return FrameworkInputs(model, data, None, None, facts)


def tool_inputs(model: Any, batches: Any, loss_fn: Any, *, count: int, what: str) -> tuple[nn.Module, Any, Any]:
    """For a tool that takes a model, batches and a loss directly (``memory.estimate``, ``numerics.diagnose``): the
    plain module, the batches in the form it calls (up to ``count`` of them where they had to be made) and the loss;
    ``what`` names the caller.

    A LightningModule's batches become step batches and its loss the step's (a ``loss_fn`` other than the default is
    refused: the step computes the loss); a Dataset becomes collated batches; other batches are taken as they are.
    """
    plain = unwrap_prepared(model, what)
    lightning = is_lightning_module(plain) and not isinstance(plain, StepCall)  # a workload's step module: adapted already
    if not (lightning or is_hf_dataset(batches) or is_hf_dataset_dict(batches)):
        return plain, batches, loss_fn
    if lightning and loss_fn is not default_loss:
        raise ValueError(f"{what}: a LightningModule's loss is its training_step's; drop loss_fn.")
    made = framework_inputs(plain, batches, count=count, where=what, data_where=f"{what}'s batches", optimizer=False)
    data = made.data.train if isinstance(made.data, BenchData) else made.data
    return made.model, list(itertools.islice(data, count)), step_output_loss if lightning else loss_fn
