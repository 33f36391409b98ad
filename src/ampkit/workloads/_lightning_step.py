"""A LightningModule as the tools call a model: its ``training_step`` is the forward that returns the loss.

Every tool runs ``model(**batch)`` and takes a loss from the output (:mod:`ampkit._util.model_io`). For a
LightningModule the loss is what ``training_step(batch, batch_idx)`` returns, and its ``forward`` is only what the
step calls. :func:`step_module` gives the tools a module that keeps both: a shallow copy of the user's module
whose class is the user's class with :class:`StepCall` ahead of it. A tool's batch, ``{"ampkit_batch": batch,
"ampkit_batch_idx": i}`` (:func:`step_batch`), runs the step as the module's forward (every hook and cast the tools put
on the module's call applies to it: a ``*-true`` policy casts the batch, as Lightning's ``bf16-true`` does); any other
call (``self(x)`` inside the step) is the module's own ``forward``.

Why a copy of the same class rather than a wrapper module: parameter and module names stay the user's own
(``net.0.weight``, not ``module.net.0.weight``), so the modules a report names to keep in fp32 are the names the
user pastes into their own code; ``self.training``, ``self.device`` and Lightning's dtype tracking follow
``.train()``/``.to()`` as they do in a Trainer. The copy shares the weights (the tools train deep copies of it)
and has its own attribute dict, so the user's module is not changed.

In eval mode (the bench's eval batches) the step is ``validation_step`` when the module defines one that returns a
loss (a tensor, or a dict with ``"loss"``); otherwise ``training_step``'s loss scores the batch.

``self.log``/``self.log_dict`` do nothing in the copy: outside a Trainer, Lightning warns at every call (and
pytest turns warnings into errors); a method that returns at once costs the step nothing.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["BATCH_KEY", "INDEX_KEY", "StepCall", "StepCollate", "step_batch", "step_loader", "step_loss", "step_module"]

log = logging.getLogger("ampkit")

BATCH_KEY = "ampkit_batch"
INDEX_KEY = "ampkit_batch_idx"
_KEYS = frozenset({BATCH_KEY, INDEX_KEY})


def step_batch(batch: Any, index: int) -> dict[str, Any]:
    """The tools' batch that runs ``training_step(batch, index)``: a dict, so every tool's ``model(**batch)`` (and
    its moves to the device, splits and fake copies, which walk dicts, tuples and lists) reaches the batch inside."""
    return {BATCH_KEY: batch, INDEX_KEY: index}


def step_loss(output: Any, step: str, module: nn.Module) -> torch.Tensor:
    """The loss a Lightning step returned: a tensor, or a dict's ``"loss"``; anything else is refused, naming the step."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"]
    raise ValueError(
        f"{type(module).__name__}.{step} returned {type(output).__name__}; the tools train on the loss it returns: "
        "return the loss tensor (or a dict with 'loss')."
    )


class StepCall:
    """Put ahead of a LightningModule's class: a tool's batch runs the step, and logging is a no-op."""

    _ampkit_eval_step: str | None = None
    """The step eval batches run: None until the first eval batch decides (validation_step if it returns a loss)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # Reached through nn.Module.__call__, so what the tools put on the module's call applies to the step as to any
        # model's forward: a *-true policy's cast of the inputs (the batch) and of the output (the loss, to fp32), as
        # Lightning's own bf16-true casts the batch; a compiled region. The step's own self(x) is the module's forward.
        if args or kwargs.keys() != _KEYS:
            return super().forward(*args, **kwargs)  # type: ignore[misc]  # the module's own forward
        batch, index = kwargs[BATCH_KEY], kwargs[INDEX_KEY]
        if self.training:  # type: ignore[attr-defined]
            return step_loss(self.training_step(batch, index), "training_step", self)  # type: ignore[attr-defined, arg-type]
        if self._ampkit_eval_step is None:
            return self._first_eval(batch, index)
        return step_loss(getattr(self, self._ampkit_eval_step)(batch, index), self._ampkit_eval_step, self)  # type: ignore[arg-type]

    def _first_eval(self, batch: Any, index: int) -> torch.Tensor:
        own = type(self).validation_step is not _base_validation_step(type(self))  # type: ignore[attr-defined]
        output = self.validation_step(batch, index) if own else None  # type: ignore[attr-defined]
        if isinstance(output, torch.Tensor) or (isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor)):
            self._ampkit_eval_step = "validation_step"
            return step_loss(output, "validation_step", self)  # type: ignore[arg-type]
        self._ampkit_eval_step = "training_step"
        if own:
            log.info("%s.validation_step returns no loss: eval batches are scored by training_step's loss", type(self).__name__)
        return step_loss(self.training_step(batch, index), "training_step", self)  # type: ignore[attr-defined, arg-type]

    def log(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: there is no Trainer to log to (Lightning would warn at every step)."""

    def log_dict(self, *args: Any, **kwargs: Any) -> None:
        """Nothing, as :meth:`log`."""


def _base_validation_step(cls: type) -> Any:
    """The ``validation_step`` Lightning's own hooks class defines (a no-op), for telling an override from it."""
    for klass in reversed(cls.__mro__):
        if "validation_step" in vars(klass):
            return vars(klass)["validation_step"]
    return None


_CLASSES: dict[type, type] = {}


def _step_class(cls: type) -> type:
    if cls not in _CLASSES:
        # The same name, module and qualname: tables and reports name the model by its class, as for any module.
        _CLASSES[cls] = type(cls.__name__, (StepCall, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    return _CLASSES[cls]


def step_module(module: nn.Module) -> nn.Module:
    """A copy of the LightningModule ``module`` sharing its weights, whose call on :func:`step_batch` runs the step."""
    if isinstance(module, StepCall):
        return module
    clone = copy.copy(module)  # its own attribute dict; parameters, buffers and submodules shared
    clone.__class__ = _step_class(type(module))
    return clone


class StepCollate:
    """A DataLoader's ``collate_fn`` whose batches are step batches (``batch_idx`` 0: a tool that times the loader's
    settings needs the step's cost, not its index). A class, not a closure: worker processes pickle it."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, samples: Any) -> dict[str, Any]:
        return step_batch(self.collate(samples), 0)


def step_loader(loader: torch.utils.data.DataLoader[Any]) -> torch.utils.data.DataLoader[Any]:
    """``loader`` with the same dataset, batching, order and settings, yielding step batches: what a tool that reads
    the user's own DataLoader (``ampkit profile``, the tune's loader trials) feeds a LightningModule's step module."""
    if isinstance(loader.collate_fn, StepCollate):
        return loader
    iterable = isinstance(loader.dataset, torch.utils.data.IterableDataset)
    batching: dict[str, Any] = {"batch_size": loader.batch_size, "drop_last": loader.drop_last} if iterable else {"batch_sampler": loader.batch_sampler}
    workers = {"prefetch_factor": loader.prefetch_factor, "persistent_workers": loader.persistent_workers} if loader.num_workers > 0 else {}
    return torch.utils.data.DataLoader(
        loader.dataset, collate_fn=StepCollate(loader.collate_fn), num_workers=loader.num_workers, pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn, timeout=loader.timeout, multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator, **batching, **workers,
    )
