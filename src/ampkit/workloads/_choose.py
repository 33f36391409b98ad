"""The workload that a tool's options describe, built by one set of rules: a built-in workload (``-w``,
``--size``, ``--batch-size``) or the user's model and data (``--model``, ``--data``), with the steps it runs.

The rules, the same for bench, memory, doctor and profile (and the coming tune):

- Nothing named: the device's default built-in workload (:func:`~ampkit.workloads.default_workload`).
- ``--model`` alone trains the user's model on a built-in workload's data (``-w``), or on the model's own: an
  ``hf:`` folder's model on data made for it, a LightningModule on its own ``train_dataloader()``. Any other
  ``--model`` alone is refused before anything of the user's runs: whether a factory may return a LightningModule is
  read from its module's source, which must name ``lightning`` (it is not run). ``--data`` alone has no model.
- ``--batch-size`` rebuilds a built-in workload's batches, and batches a ``datasets.Dataset`` from ``--data``; data
  that comes in batches (a list, a DataLoader, a LightningModule's loaders) has its own, so there it is refused.
- A built-in workload keeps its own steps and warm-up unless the tool sets them; the user's data has none of its
  own: they default to ``-w``'s (``--model`` on a built-in's data) or to 100 steps and a tenth of them (at most 5)
  as warm-up. ``accumulate`` micro-batches make each step, so the user's data is read for ``steps * accumulate``
  batches.

    >>> w = choose_workload("gpt", size="tiny", device=torch.device("cpu"), steps=4, warmup=1)
    >>> w.name, w.steps, w.warmup
    ('gpt', 4, 1)
    >>> choose_workload(model="mypkg.nets:build", device=torch.device("cpu"), data_use="train it on")
    Traceback (most recent call last):
    ...
    ValueError: --model without --data needs --workload NAME (the data to train it on), or --data pkg.module:factory. (An hf:FOLDER model, and a LightningModule from a module that imports lightning, bring their own.)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from ._defaults import default_workload
from ._hf_folder import is_hf_spec
from ._registry import get_workload
from ._user import spec_parts, user_workload
from ._workload import Workload

__all__ = ["brings_own_data", "choose_workload"]


def _source(module: str) -> Path | None:
    """The file of ``module`` (a dotted name or a ``.py`` path), found without importing anything."""
    if module.endswith(".py"):
        return Path(module) if Path(module).is_file() else None
    parts = module.split(".")
    for root in [str(Path.cwd()), *sys.path]:  # as load_factory imports: the current directory first
        base = Path(root or ".", *parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    spec = importlib.util.find_spec(parts[0]) if len(parts) == 1 else None  # an installed top-level module, not run
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def brings_own_data(model: str | None) -> bool:
    """Whether ``--model`` may train without ``--data`` or ``-w``: an ``hf:`` folder (data is made for it), or a
    factory whose module names ``lightning`` (it may return a LightningModule, whose loaders are its data). The
    module's source is read, not run: a plain model is refused before any of the user's code runs.

    >>> brings_own_data("hf:models/tiny-gpt2"), brings_own_data("no_such_module_xyz:build")
    (True, False)
    """
    if model is None:
        return False
    if is_hf_spec(model):
        return True
    path = _source(spec_parts(model)[0])
    try:
        return path is not None and "lightning" in path.read_text(encoding="utf-8", errors="replace").lower()
    except OSError:
        return False


def choose_workload(
    name: str | None = None,
    model: str | None = None,
    data: str | None = None,
    *,
    device: torch.device,
    size: str = "small",
    seed: int = 0,
    steps: int | None = None,
    warmup: int | None = None,
    batch_size: int | None = None,
    accumulate: int = 1,
    data_use: str = "run it on",
) -> Workload:
    """The workload ``name`` (``-w``), ``model`` and ``data`` (``--model``/``--data`` factory references) describe, at
    ``size`` and ``seed``, with ``steps``/``warmup`` set where given (see the module's rules).

    ``data_use`` says what the tool does with the data, for the message refusing ``--model`` without data.
    Raises ValueError naming the option to change.
    """
    if model is None and data is None:
        workload = get_workload(default_workload(device) if name is None else name, size=size, seed=seed, batch_size=batch_size)
    else:
        if data is None and name is None and not brings_own_data(model):
            raise ValueError(
                f"--model without --data needs --workload NAME (the data to {data_use}), or --data pkg.module:factory. "
                "(An hf:FOLDER model, and a LightningModule from a module that imports lightning, bring their own.)"
            )
        # The built-in's rows for --model on its data; a Dataset from --data takes --batch-size itself.
        base = get_workload(name, size=size, seed=seed, batch_size=batch_size if data is None else None) if name is not None else None
        steps = steps or (base.steps if base else 100)
        warmup = warmup if warmup is not None else (base.warmup if base else min(5, steps // 10))
        workload = user_workload(
            model, data, steps=steps, warmup=warmup, base=base, accumulate=accumulate, batch_size=None if base and data is None else batch_size,
            seed=seed,
        )
    # --model on a built-in workload's data copies that workload, its steps included: the tool's settings win.
    if steps is not None:
        workload.steps = steps
    if warmup is not None:
        workload.warmup = warmup
    workload.accumulate = accumulate
    return workload
