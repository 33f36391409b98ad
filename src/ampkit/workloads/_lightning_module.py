"""What the tools train for a LightningModule: its step, its data, its optimizer.

- The loss: ``training_step(batch, batch_idx)``'s (:mod:`~ampkit.workloads._lightning_step`); ``batch_idx`` is the
  batch's position in the data, as in a Trainer's first epoch.
- The data: what ``--data`` gives (batches, a DataLoader, a ``datasets.Dataset``, or a ``LightningDataModule``, whose
  ``prepare_data()``, ``setup("fit")``, ``train_dataloader()`` and ``val_dataloader()`` are called as a Trainer calls
  them); without ``--data``, the module's own ``train_dataloader()``/``val_dataloader()`` after its own
  ``prepare_data()`` and ``setup("fit")``.
- The optimizer: the first one ``configure_optimizers()`` returns, rebuilt on each policy's copy with its class and
  its param groups' settings (at the learning rate it was configured with: a scheduler may already have changed the
  group's). The LR scheduler is not used, and a log line says so: every policy trains at that learning rate.
- A module with ``automatic_optimization = False`` steps its own optimizers inside ``training_step``: refused.

    >>> from torch import nn
    >>> opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.5)
    >>> first_optimizer({"optimizer": opt, "lr_scheduler": object()}) == (opt, True)
    True
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .._util.framework_versions import require
from ._bench_data import BenchData
from ._frameworks import is_datamodule, is_hf_dataset, is_hf_dataset_dict, lightning_package
from ._hf_datasets import dataset_bench_data
from ._lightning_step import step_batch, step_module
from ._optimizer_twin import optimizer_twin

__all__ = ["first_optimizer", "hook_loaders", "lightning_inputs", "optimizer_factory", "step_output_loss"]

log = logging.getLogger("ampkit")

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


def step_output_loss(output: Any, target: Any) -> torch.Tensor:
    """The loss of a step module's output: the output is the step's loss already (``target`` is unused)."""
    return output


def _overrides(obj: Any, name: str) -> bool:
    """Whether ``obj``'s class defines ``name`` itself, rather than inheriting Lightning's placeholder."""
    for klass in type(obj).__mro__:
        if name in vars(klass):
            return not klass.__module__.startswith(("lightning.", "pytorch_lightning."))
    return False


def first_optimizer(conf: Any) -> tuple[torch.optim.Optimizer | None, bool]:
    """The first optimizer in what ``configure_optimizers()`` may return (every form Lightning takes), and whether a
    scheduler came with it."""
    if isinstance(conf, torch.optim.Optimizer):
        return conf, False
    if isinstance(conf, Mapping):
        return first_optimizer(conf.get("optimizer"))[0], conf.get("lr_scheduler") is not None
    if isinstance(conf, (list, tuple)) and conf:
        if len(conf) == 2 and isinstance(conf[0], (list, tuple)):  # ([optimizers], [schedulers])
            return first_optimizer(conf[0])[0], bool(conf[1])
        return first_optimizer(conf[0])
    return None, False


def optimizer_factory(optimizer: torch.optim.Optimizer, module: nn.Module, where: str) -> OptimizerFactory:
    """``params -> optimizer`` of ``optimizer``'s class and groups over a copy's parameters (in ``module``'s order)."""
    return optimizer_twin(optimizer, module, f"{where}: configure_optimizers() returned an optimizer of parameters that are not the module's; build it on self.parameters().")


def _optimizer(module: nn.Module, where: str) -> OptimizerFactory | None:
    if not _overrides(module, "configure_optimizers"):
        log.info("%s defines no configure_optimizers(): the tools' default optimizer (AdamW, lr 1e-3) trains it", where)
        return None
    try:
        conf = module.configure_optimizers()  # type: ignore[operator]
    except Exception as exc:
        raise ValueError(f"{where}: configure_optimizers() failed outside a Trainer ({type(exc).__name__}: {exc}).") from exc
    optimizer, scheduled = first_optimizer(conf)
    if optimizer is None:
        raise ValueError(f"{where}: configure_optimizers() returned {type(conf).__name__}, with no optimizer in it; return one.")
    if scheduled:
        log.warning(
            "%s: configure_optimizers() returns an LR scheduler, which the tools do not use: every policy trains at the "
            "optimizer's configured learning rate (lr %s)", where, optimizer.param_groups[0].get("initial_lr", optimizer.param_groups[0]["lr"]),
        )
    return optimizer_factory(optimizer, module, where)


def _single(loaders: Any, hook: str, where: str) -> Any:
    # Several loaders are a list of DataLoaders; a list of anything else is one loader's batches.
    if isinstance(loaders, (list, tuple)) and loaders and all(isinstance(x, torch.utils.data.DataLoader) for x in loaders):
        if hook == "val_dataloader":
            log.info("%s: %s() returns %d loaders; eval batches come from the first", where, hook, len(loaders))
            return loaders[0]
        raise ValueError(f"{where}: {hook}() returns {len(loaders)} loaders; the tools train on one: return one DataLoader, or pass --data.")
    if isinstance(loaders, Mapping):
        raise ValueError(f"{where}: {hook}() returns a dict of loaders; the tools train on one: return one DataLoader, or pass --data.")  # noqa: TRY004 - a ValueError: the command prints it as one line and exits 2
    return loaders


def hook_loaders(owner: Any, where: str) -> tuple[Any, Any]:
    """``owner``'s train and val loaders (a LightningModule's or a LightningDataModule's), as a Trainer's fit gets them."""
    if not _overrides(owner, "train_dataloader"):
        raise ValueError(
            f"{where} defines no train_dataloader(); pass --data pkg.module:factory returning its LightningDataModule, a "
            "DataLoader, a datasets.Dataset or batches."
        )
    try:
        owner.prepare_data()
        owner.setup("fit")
        train = _single(owner.train_dataloader(), "train_dataloader", where)
        val = _single(owner.val_dataloader(), "val_dataloader", where) if _overrides(owner, "val_dataloader") else ()
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"{where}: reading its data failed ({type(exc).__name__}: {exc}).") from exc
    return train, val


def _indexed(batches: Iterable[Any]) -> Iterator[dict[str, Any]]:
    for index, batch in enumerate(batches):
        yield step_batch(batch, index)


def lightning_inputs(
    module: nn.Module, data: Any, *, count: int, where: str, data_where: str, batch_size: int | None = None, optimizer: bool = True,
) -> tuple[nn.Module, BenchData, OptimizerFactory | None, str]:
    """The step module of ``module``, its data as a BenchData of step batches (read lazily, up to what the run
    needs), the optimizer factory (None: the tools' default) and a line saying where the data came from.

    ``data``: None (the module's own loaders), a LightningDataModule, a ``datasets.Dataset``, a BenchData, or an
    iterable of batches. ``count``: training batches needed; ``batch_size``: rows per batch of a Dataset;
    ``optimizer``: False for a tool that takes no optimizer from the module (configure_optimizers is not called).
    """
    package = lightning_package(module)
    if package == "lightning.pytorch":
        require("lightning", where)
    if not getattr(module, "automatic_optimization", True):
        raise ValueError(
            f"{where}: automatic_optimization is False, so training_step steps its own optimizers; the tools need a "
            "training_step that returns the loss (and leave the backward and the step to them)."
        )
    eval_data: Any = ()
    if data is None:
        data, eval_data = hook_loaders(module, where)
        what = f"its own train_dataloader(){' and val_dataloader()' if eval_data else ''}"
    elif is_datamodule(data):
        what = f"the {type(data).__name__} (a LightningDataModule) from {data_where}"
        data, eval_data = hook_loaders(data, data_where)
    elif is_hf_dataset(data) or is_hf_dataset_dict(data):
        bench_data, what = dataset_bench_data(data, module, batch_size=batch_size, count=count, where=data_where, dict_batches=True)
        data, eval_data = bench_data.train, bench_data.eval
    elif isinstance(data, BenchData):
        if data.loss_fn is not None or data.metric is not None:
            raise ValueError(f"{data_where}: a LightningModule's loss is its training_step's; drop the BenchData's loss_fn and metric.")
        data, eval_data, what = data.train, data.eval, data_where
    else:
        what = data_where
    factory = _optimizer(module, where) if optimizer else None
    step = step_module(module)  # after setup(): a layer it adds is the copy's too
    bench = BenchData(train=_indexed(data), eval=_indexed(eval_data), loss_fn=step_output_loss, unit="samples")
    return step, bench, factory, what
