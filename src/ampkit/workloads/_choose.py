"""The workload that a tool's options describe, built by one set of rules: a built-in workload (``-w``,
``--size``, ``--batch-size``) or the user's model and data (``--model``, ``--data``), with the steps it runs.

The rules, the same for bench, memory, doctor and profile (and the coming tune):

- Nothing named: the device's default built-in workload (:func:`~ampkit.workloads.default_workload`).
- ``--model`` alone trains the user's model on a built-in workload's data, so it needs ``-w``; it is refused
  before anything of the user's is imported. ``--data`` alone has no model to train.
- ``--batch-size`` rebuilds a built-in workload's batches; the user's ``--data`` makes its own batches, so there it
  is refused.
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
    ValueError: --model without --data needs --workload NAME (the data to train it on), or --data pkg.module:factory.
"""

from __future__ import annotations

import torch

from ._defaults import default_workload
from ._registry import get_workload
from ._user import user_workload
from ._workload import Workload

__all__ = ["choose_workload"]


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
        if data is None and name is None:
            raise ValueError(f"--model without --data needs --workload NAME (the data to {data_use}), or --data pkg.module:factory.")
        if data is not None and batch_size is not None:
            raise ValueError(
                f"--batch-size {batch_size} applies to a built-in workload's data; your --data {data} makes its own "
                "batches: return batches of that many rows from it (or drop --batch-size)."
            )
        base = get_workload(name, size=size, seed=seed, batch_size=batch_size) if name is not None else None
        steps = steps or (base.steps if base else 100)
        warmup = warmup if warmup is not None else (base.warmup if base else min(5, steps // 10))
        workload = user_workload(model, data, steps=steps, warmup=warmup, base=base, accumulate=accumulate)
    # --model on a built-in workload's data copies that workload, its steps included: the tool's settings win.
    if steps is not None:
        workload.steps = steps
    if warmup is not None:
        workload.warmup = warmup
    workload.accumulate = accumulate
    return workload
