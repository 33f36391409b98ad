"""Benchmark the user's own model: ``--model pkg.module:factory`` and ``--data pkg.module:factory``.

The contract (also in the README):

- ``--model`` names a callable taking no arguments and returning a ``torch.nn.Module`` in fp32. It is called
  once; every policy trains a deep copy, so all start from the same weights.
- ``--data`` names a callable taking no arguments and returning either a :class:`BenchData`, or a sequence (or
  any iterable, e.g. a DataLoader) of ``(inputs, targets)`` training batches. ``inputs`` is a tensor, or a tuple
  of tensors passed as ``model(*inputs)``.
- Without a loss function, integer targets get cross-entropy and floating targets mean squared error. Without
  a metric, eval batches are scored by their mean loss (lower is better, within 2% counts as equal).
- ``path/to/file.py:factory`` works too. Modules are imported with the current directory on ``sys.path``.

    >>> spec_parts("mypkg.models:build")
    ('mypkg.models', 'build')
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import itertools
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import one_line
from .workload import Batch, Metric, Workload, call_model, output_as_float

__all__ = ["BenchData", "EvalLoss", "load_factory", "spec_parts", "user_workload"]


@dataclass(kw_only=True)
class BenchData:
    """What a ``--data`` factory may return when plain batches are not enough.

    >>> x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    >>> BenchData(train=[(x, y)], eval=[(x, y)], unit="samples").loss_fn is None
    True
    """

    train: Iterable[Batch]
    """Training batches ``(inputs, targets)``; an iterable is read once, up to the number of steps."""
    eval: Iterable[Batch] = ()
    """Held-out batches for the eval metric."""
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None = None
    """``loss_fn(output, targets)``; default by targets' dtype (cross-entropy or MSE)."""
    metric: Callable[[], Metric] | None = None
    """Factory of a fresh :class:`~ampkit.bench.workload.Metric`; default: mean eval loss."""
    unit: str = "samples"
    """What throughput counts; ``tokens`` for language models."""
    items_per_batch: int | None = None
    """Samples (or tokens) per training batch; default: the first batch's ``len(targets)``."""

    def __post_init__(self) -> None:
        for name in ("train", "eval"):
            value = getattr(self, name)
            if isinstance(value, (torch.Tensor, dict, str, bytes)) or not isinstance(value, Iterable):
                raise TypeError(
                    f"BenchData({name}=...) got {type(value).__name__}; {name} must be a list (or any iterable, e.g. a "
                    "DataLoader) of (inputs, targets) batches."
                )
        for name in ("loss_fn", "metric"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"BenchData({name}=...) got {type(value).__name__}; {name} must be a callable or None.")
        if not isinstance(self.unit, str) or not self.unit:
            raise TypeError(f"BenchData(unit=...) got {self.unit!r}; unit must be a word such as 'samples' or 'tokens'.")
        n = self.items_per_batch
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"BenchData(items_per_batch=...) got {n!r}; it must be a positive int, or None to count len(targets).")


class EvalLoss:
    """The mean loss over eval batches: the metric of last resort, lower is better, within 2% counts as equal."""

    name = "eval_loss"
    higher_is_better = False
    tolerance = 0.02
    relative = True

    def __init__(self, loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]) -> None:
        self._loss_fn = loss_fn
        self._sum: torch.Tensor | None = None
        self._count = 0

    def update(self, output: Any, target: torch.Tensor) -> None:
        loss = self._loss_fn(output, target).detach().float()
        self._sum = loss if self._sum is None else self._sum + loss
        self._count += 1

    def compute(self) -> dict[str, float]:
        return {self.name: float("nan") if self._sum is None else self._sum.item() / self._count}


def default_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer targets, mean squared error for floating ones."""
    if target.is_floating_point():
        return nn.functional.mse_loss(output, target)
    return nn.functional.cross_entropy(output, target)


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
        raise ValueError(f"{option} {spec}: {attr} is a {type(obj).__name__}, not a callable; name a function that builds it.")
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


def _read(batches: Iterable[Any], limit: int | None, spec: str, what: str) -> list[Any]:
    """Up to ``limit`` batches of the user's iterable (all when None); an error while iterating names the data."""
    out: list[Any] = []
    try:
        for b in itertools.islice(batches, limit):
            out.append(b)
    except SystemExit as exc:
        raise ValueError(f"--data {spec}: reading {what} batch {len(out)} exited ({_exit_text(exc)}); make the data iterable end, not exit.") from exc
    except Exception as exc:
        raise ValueError(f"--data {spec}: reading {what} batch {len(out)} failed ({type(exc).__name__}: {one_line(exc)}).") from exc
    return out


def _check_batches(batches: Sequence[Any], spec: str, what: str) -> list[Batch]:
    for i, b in enumerate(batches):
        if not (isinstance(b, (tuple, list)) and len(b) == 2 and isinstance(b[1], torch.Tensor)):
            raise ValueError(
                f"--data {spec}: {what} batch {i} is {type(b).__name__}; each batch must be an (inputs, targets) pair with a tensor of targets."
            )
    return [tuple(b) for b in batches]  # type: ignore[misc]


def _as_bench_data(obj: Any, spec: str) -> BenchData:
    if isinstance(obj, BenchData):
        return obj
    if isinstance(obj, (torch.Tensor, dict, str)) or not isinstance(obj, Iterable):
        raise ValueError(
            f"--data {spec} returned {type(obj).__name__}; return a list (or DataLoader) of (inputs, targets) batches, or an ampkit.bench.BenchData."
        )
    return BenchData(train=obj)


def _smoke_test(model: nn.Module, batch: Batch, loss_fn: Callable[..., torch.Tensor], model_spec: str) -> None:
    # One fp32 forward before any policy runs: a model that does not fit its data fails once, clearly, instead
    # of once per policy row.
    inputs, target = batch
    try:
        with torch.no_grad():
            loss = loss_fn(output_as_float(call_model(model, inputs)), target)
    except Exception as exc:
        raise ValueError(f"--model {model_spec} fails on the first batch ({type(exc).__name__}: {' '.join(str(exc).split())}).") from exc
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        raise ValueError(f"--model {model_spec}: the loss on the first batch is not a scalar tensor; pass a BenchData with a loss_fn that reduces.")


def user_workload(model_spec: str | None, data_spec: str | None, *, steps: int, warmup: int, base: Workload | None = None) -> Workload:
    """The Workload for ``--model``/``--data``; with only ``--model``, the model trains on ``base``'s data.

    ``steps`` and ``warmup`` are the bench's settings (user data carries no defaults of its own).
    """
    model = None
    if model_spec is not None:
        model = _call_factory(load_factory(model_spec, "--model"), model_spec, "--model")
        if not isinstance(model, nn.Module):
            raise ValueError(f"--model {model_spec} returned {type(model).__name__}; it must return a torch.nn.Module.")
    if data_spec is None:
        if base is None or model is None:
            raise ValueError("--model without --data needs a built-in --workload whose data it trains on; or pass --data pkg.module:factory.")
        _smoke_test(model, base.train_batches[0], base.loss_fn, model_spec or "")
        return dataclasses.replace(base, name=f"{base.name}+{model_spec}", model=model, description=f"{model_spec} on {base.name} data")
    if model is None:
        raise ValueError(f"--data {data_spec} needs --model pkg.module:factory: the model to train on it.")

    data = _as_bench_data(_call_factory(load_factory(data_spec, "--data"), data_spec, "--data"), data_spec)
    train = _check_batches(_read(data.train, steps, data_spec, "training"), data_spec, "training")
    if not train:
        raise ValueError(f"--data {data_spec} gave no training batches; return at least one (inputs, targets) pair.")
    eval_batches = _check_batches(_read(data.eval, None, data_spec, "eval"), data_spec, "eval")
    loss_fn = data.loss_fn or default_loss
    metric = (data.metric or (lambda: EvalLoss(loss_fn))) if eval_batches else None
    _smoke_test(model, train[0], loss_fn, model_spec or "")
    items = data.items_per_batch or len(train[0][1])
    n_params = sum(p.numel() for p in model.parameters())
    return Workload(
        name="user",
        model=model,
        train_batches=train,
        eval_batches=eval_batches,
        metric=metric,
        loss_fn=loss_fn,
        items_per_batch=items,
        unit=data.unit,
        steps=steps,
        warmup=warmup,
        description=f"{model_spec} on {data_spec}",
        extra={"model": model_spec, "data": data_spec, "parameters": n_params},
    )
