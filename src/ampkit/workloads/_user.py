"""The user's own model and data, for every tool: ``--model pkg.module:factory`` and ``--data pkg.module:factory``.

The contract (also in docs/guides/bench.md, "Your own model and data"):

- ``--model`` names a callable taking no arguments and returning a ``torch.nn.Module`` in fp32. It is called
  once; every policy trains a deep copy, so all start from the same weights.
- ``--data`` names a callable taking no arguments and returning either a :class:`BenchData`, or a sequence (or
  any iterable, e.g. a DataLoader) of training batches: ``(inputs, targets)`` pairs, ``inputs`` a tensor, a tuple
  (``model(*inputs)``) or a dict (``model(**inputs)``); or dicts of keyword arguments such as a Hugging Face
  collator returns (``input_ids``, ``attention_mask``, ``labels``), passed as ``model(**batch)``.
- Without a loss function, a model output carrying a ``.loss`` (a ``transformers`` ModelOutput given labels)
  is the loss; otherwise integer targets get cross-entropy and floating targets mean squared error, of the
  output's ``.logits`` or a tuple's first tensor (:mod:`ampkit._util.model_io`; a dict with neither is refused);
  its labels are checked against the output's classes first (:mod:`~ampkit.workloads._labels`). Without a metric,
  eval batches are scored by their mean loss (lower is better, within 2% counts as equal).
- Tables and reports name the workload by the model's class (``GPT2LMHeadModel``).
- ``path/to/file.py:factory`` works too. Modules are imported with the current directory on ``sys.path``.
- The frameworks' own objects (:mod:`~ampkit.workloads._framework_inputs`): ``--model hf:PATH`` (a local Hugging Face
  folder), a factory returning a LightningModule (its ``training_step`` is the loss; without ``--data``, its own
  loaders), and ``--data`` returning a ``datasets.Dataset`` or a LightningDataModule.

    >>> spec_parts("mypkg.models:build")
    ('mypkg.models', 'build')
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import itertools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._compat import tree_leaves
from .._errors import one_line
from .._util.model_io import LOSS_FN_HINT, OutputError, batch_parts, call_model, default_loss
from ..training._micro_batching import batch_rows
from ._bench_data import BenchData, EvalLoss
from ._framework_inputs import framework_inputs
from ._frameworks import framework_facts, is_lightning_module
from ._hf_folder import HfFolder, hf_folder, is_hf_spec, load_hf_model
from ._labels import check_labels
from ._workload import Batch, Workload

__all__ = ["BenchData", "EvalLoss", "default_loss", "load_factory", "spec_parts", "user_workload", "workload_from"]


def spec_parts(spec: str) -> tuple[str, str]:
    """Split ``module:attr`` and check both halves are there."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr or not attr.replace(".", "_").isidentifier():
        raise ValueError(f"{spec!r} is not a factory reference; write it as pkg.module:function (or path/file.py:function).")
    return module, attr


def load_factory(spec: str, option: str) -> Callable[[], Any]:
    """Import the callable ``spec`` (``pkg.module:name`` or ``file.py:name``) named by CLI ``option``."""
    module_name, attr = spec_parts(spec)
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ValueError(f"{option} {spec}: no file {path}; give a path to an existing .py file.")
            loader_spec = importlib.util.spec_from_file_location(f"_ampkit_user_{path.stem}", path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            # Registered by name, as importlib's recipe does: torch.compile looks up the module of the code it traces.
            sys.modules[loader_spec.name] = module
            loader_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))  # as `python -m` does: the user's own package is importable
            module = importlib.import_module(module_name)
    except ValueError:
        raise
    except SystemExit as exc:
        raise ValueError(f"{option} {spec}: importing {module_name} exited ({_exit_text(exc)}); move the script code under `if __name__ == \"__main__\":`.") from exc
    except Exception as exc:
        raise ValueError(
            f"{option} {spec}: importing {module_name} failed ({type(exc).__name__}: {exc}); "
            "make it importable from the current directory or PYTHONPATH."
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{option} {spec}: {module_name} has no attribute {attr!r}; check the name after the colon.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{option} {spec}: {attr} is a {type(obj).__name__}, not a callable; name a function that builds it.")  # noqa: TRY004 - a ValueError: the command prints it as one line and exits 2
    return obj


def _exit_text(exc: SystemExit) -> str:
    return f"sys.exit({exc.code!r})" if exc.code is not None else "sys.exit()"


def _call_factory(factory: Callable[[], Any], spec: str, option: str) -> Any:
    # SystemExit too: a factory that exits (even with 0) produced nothing, and must not end the command as a success.
    name = spec.rpartition(":")[2]
    try:
        return factory()
    except SystemExit as exc:
        raise ValueError(f"{option} {spec}: {name}() exited ({_exit_text(exc)}) instead of returning; make it return, not exit.") from exc
    except Exception as exc:
        raise ValueError(f"{option} {spec}: calling {name}() failed ({type(exc).__name__}: {exc}).") from exc


def _read(batches: Iterable[Any], limit: int | None, where: str, what: str) -> list[Any]:
    """Up to ``limit`` batches of the user's iterable (all when None); an error while iterating names the data."""
    out: list[Any] = []
    try:
        for b in itertools.islice(batches, limit):
            out.append(b)  # noqa: PERF402 - a loop, so an error names the batch it broke at
    except SystemExit as exc:
        raise ValueError(f"{where}: reading {what} batch {len(out)} exited ({_exit_text(exc)}); make the data iterable end, not exit.") from exc
    except Exception as exc:
        raise ValueError(f"{where}: reading {what} batch {len(out)} failed ({type(exc).__name__}: {one_line(exc)}).") from exc
    return out


def _is_kwargs(b: Any) -> bool:
    # A tensor anywhere in the values: a LightningModule's step batch holds the user's batch, a tuple of tensors.
    return isinstance(b, Mapping) and all(isinstance(k, str) for k in b) and any(isinstance(v, torch.Tensor) for v in tree_leaves(list(b.values())))


def _check_batches(batches: Sequence[Any], where: str, what: str) -> list[Batch]:
    """The batches as the runner takes them; dicts (a tokenizer's BatchEncoding too) become plain dicts, which
    torch's pytree (fake copies, device moves, DDP slices) walks into."""
    out: list[Batch] = []
    for i, b in enumerate(batches):
        if _is_kwargs(b):
            out.append(dict(b))
        elif isinstance(b, (tuple, list)) and len(b) == 2 and isinstance(b[1], torch.Tensor):
            out.append((dict(b[0]) if _is_kwargs(b[0]) else b[0], b[1]))
        else:
            raise ValueError(
                f"{where}: {what} batch {i} is {type(b).__name__}; each batch must be an (inputs, targets) pair with a tensor "
                "of targets, or a dict of keyword arguments for the model (e.g. input_ids, attention_mask, labels)."
            )
    return out


def _as_bench_data(obj: Any, where: str) -> BenchData:
    if isinstance(obj, BenchData):
        return obj
    if isinstance(obj, (torch.Tensor, Mapping, str)) or not isinstance(obj, Iterable):
        raise ValueError(  # noqa: TRY004 - a ValueError: the command prints it as one line and exits 2
            f"{where} returned {type(obj).__name__}; return a list (or DataLoader) of batches, or an ampkit.bench.BenchData."
        )
    return BenchData(train=obj)


def _smoke_test(
    model: nn.Module, batch: Batch, loss_fn: Callable[..., torch.Tensor], where: str, labels: Mapping[str, Sequence[Batch]] | None = None,
    data_at: str = "data",
) -> None:
    # One fp32 forward before any policy runs: a model that does not fit its data fails once, clearly, instead
    # of once per policy row. The model call and the loss fail for different reasons, with different fixes.
    # ``labels``: the batches whose labels the default loss's classes must cover (named ``data_at``).
    inputs, target = batch_parts(batch)
    with torch.no_grad():
        try:
            output = call_model(model, inputs)
        except Exception as exc:
            raise ValueError(f"{where} fails on the first batch ({type(exc).__name__}: {one_line(exc)}).") from exc
        if labels is not None and loss_fn is default_loss:  # a loss of the user's own may read labels otherwise
            check_labels(output, target, labels, data_at)
        try:
            loss = loss_fn(output.float() if isinstance(output, torch.Tensor) and output.is_floating_point() else output, target)
        except OutputError as exc:  # its message names the output's keys and the fix, whole
            raise ValueError(f"{where}: {exc}") from exc
        except Exception as exc:
            raise ValueError(
                f"{where}: no loss from its output on the first batch, a {type(output).__name__} ({type(exc).__name__}: "
                f"{one_line(exc)}); {LOSS_FN_HINT}."
            ) from exc
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        raise ValueError(f"{where}: the loss on the first batch is not a scalar tensor; pass a BenchData with a loss_fn that reduces.")


def _items(batch: Batch, unit: str) -> int:
    if not isinstance(batch, Mapping):
        return len(batch[1])
    ids = batch.get("input_ids")
    if unit == "tokens" and isinstance(ids, torch.Tensor):
        return ids.numel()
    return batch_rows(batch)


def model_name(model: nn.Module, spec: str | None = None) -> str:
    """What tables call the user's model: its class name, or the factory ``spec`` for a bare torch container.

    >>> class Net(nn.Sequential): ...
    >>> model_name(nn.Sequential(), "nets:mlp"), model_name(nn.Sequential()), model_name(Net(), "nets:net")
    ('nets:mlp', 'Sequential', 'Net')
    """
    cls = type(model)
    if spec and cls.__module__.startswith("torch.nn."):  # "Sequential" says less than the factory that built it
        return spec
    return cls.__name__


def workload_from(
    model: nn.Module, data: Any, *, steps: int, warmup: int, model_spec: str | None = None, data_spec: str = "data", cli: bool = False,
    accumulate: int = 1, batch_size: int | None = None, folder: HfFolder | None = None, seed: int = 0,
) -> Workload:
    """The Workload of ``model`` trained on ``data`` (a :class:`BenchData`, an iterable of batches, a ``datasets.Dataset``
    or a LightningDataModule; None: the model's own, see :mod:`~ampkit.workloads._framework_inputs`).

    ``model_spec``/``data_spec`` name them in the description and results.json; errors name them as the options
    ``--model``/``--data`` when ``cli``. ``accumulate`` micro-batches make a step: up to ``steps * accumulate``
    training batches are read. ``batch_size``: rows per batch of a Dataset; ``folder``: the ``hf:`` folder the model
    was read from; ``seed``: the seed of data made for it.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"{'--model ' + str(model_spec) if cli else 'model'} is {type(model).__name__}; it must be a torch.nn.Module.")  # noqa: TRY004 - a ValueError: the command prints it as one line and exits 2
    name = model_name(model, model_spec)
    model_at, data_at = (f"--model {model_spec}", f"--data {data_spec}") if cli else (name, data_spec)
    made = framework_inputs(
        model, data, count=steps * accumulate, where=model_at, data_where=data_at, batch_size=batch_size, folder=folder, seed=seed,
    )
    model, name = made.model, model_name(made.model, model_spec)
    data = _as_bench_data(made.data, data_at)
    train = _check_batches(_read(data.train, steps * accumulate, data_at, "training"), data_at, "training")
    if not train:
        raise ValueError(f"{data_at} gave no training batches; give at least one batch.")
    eval_batches = _check_batches(_read(data.eval, None, data_at, "eval"), data_at, "eval")
    loss_fn = data.loss_fn or default_loss
    metric = (data.metric or (lambda: EvalLoss(loss_fn))) if eval_batches else None
    _smoke_test(model, train[0], loss_fn, model_at, {"training": train, "eval": eval_batches}, data_at)
    unit = data.unit or ("tokens" if isinstance(train[0], Mapping) and "input_ids" in train[0] else "samples")
    n_params = sum(p.numel() for p in model.parameters())
    # What the data is, where it was not given as batches: a Dataset's collation, a module's own loaders, made data.
    described = data_spec if made.data_text is None else made.data_text if data_spec == "data" else f"{data_spec}: {made.data_text}"
    workload = Workload(
        name=name,
        model=model,
        train_batches=train,
        eval_batches=eval_batches,
        metric=metric,
        loss_fn=loss_fn,
        items_per_batch=data.items_per_batch or _items(train[0], unit),
        unit=unit,
        steps=steps,
        warmup=warmup,
        accumulate=accumulate,
        description=f"{model_spec or name} on {described}",
        extra={"model": model_spec or name, "data": described, "model_class": type(model).__name__, "parameters": n_params, **made.facts},
    )
    if made.optimizer is not None:
        workload.optimizer = made.optimizer
    return workload


def _model_of(model_spec: str, folder: HfFolder | None, seed: int) -> nn.Module:
    if folder is not None:
        return load_hf_model(folder, seed)
    model = _call_factory(load_factory(model_spec, "--model"), model_spec, "--model")
    if not isinstance(model, nn.Module):
        raise ValueError(f"--model {model_spec} returned {type(model).__name__}; it must return a torch.nn.Module.")  # noqa: TRY004 - a ValueError: the command prints it as one line and exits 2
    return model


def user_workload(
    model_spec: str | None, data_spec: str | None, *, steps: int, warmup: int, base: Workload | None = None, accumulate: int = 1,
    batch_size: int | None = None, seed: int = 0,
) -> Workload:
    """The Workload for ``--model``/``--data``; with only ``--model``, the model trains on ``base``'s data, or without a
    ``base`` on its own (a LightningModule's loaders, data made for an ``hf:`` folder's model).

    ``steps`` and ``warmup`` are the bench's settings (user data carries no defaults of its own); ``batch_size``: rows
    per batch of a ``datasets.Dataset``; ``seed``: an ``hf:`` model's random initialisation and made data.
    """
    if model_spec is None:
        raise ValueError(f"--data {data_spec} needs --model pkg.module:factory: the model to train on it.")
    try:
        folder = hf_folder(model_spec) if is_hf_spec(model_spec) else None
        model = _model_of(model_spec, folder, seed)
        if data_spec is None and base is not None:
            _smoke_test(model, base.train_batches[0], base.loss_fn, f"--model {model_spec}")
            return dataclasses.replace(
                base, name=f"{model_name(model, model_spec)} on {base.name}", model=model, description=f"{model_spec} on {base.name} data",
                # The built-in's data facts, the user's model's own: its class, parameter count and framework.
                extra={
                    **base.extra, "model": model_spec, "model_class": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
                    **framework_facts(model), **({"hf_path": str(folder.path)} if folder else {}),
                },
            )
        if data_spec is None and folder is None and not is_lightning_module(model):
            raise ValueError("--model without --data needs a built-in --workload whose data it trains on; or pass --data pkg.module:factory.")
        data = None if data_spec is None else _call_factory(load_factory(data_spec, "--data"), data_spec, "--data")
        return workload_from(
            model, data, steps=steps, warmup=warmup, model_spec=model_spec, data_spec=data_spec or "data", cli=True, accumulate=accumulate,
            batch_size=batch_size, folder=folder, seed=seed,
        )
    except ImportError as exc:  # a framework package missing: its message names the extra to install
        raise ValueError(one_line(exc)) from exc
