"""The built-in workloads, by name: what ``-w`` names for bench, memory, doctor and profile.

Each module (``digits``, ``digits_aug``, ``segment``, ``gpt``, ``resnet``) exposes ``build(size="small", seed=0, batch_size=None)
-> Workload``.
The modules are imported on first use, so asking for ``gpt`` never imports scikit-learn.

    >>> workload_names()
    ['digits', 'digits-aug', 'gpt', 'resnet', 'segment']
    >>> get_workload("gpt", size="tiny").unit
    'tokens'
    >>> get_workload("gtp")
    Traceback (most recent call last):
    ...
    ValueError: unknown workload 'gtp'; choose one of digits, digits-aug, gpt, resnet, segment (did you mean 'gpt'?).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable

from ._workload import SIZES, Workload

__all__ = ["WORKLOADS", "get_workload", "workload_names"]


def _lazy(module: str) -> Callable[..., Workload]:
    """``module.build``, imported when first called (each module pulls in its own data dependencies)."""

    def build(size: str = "small", seed: int = 0, batch_size: int | None = None) -> Workload:
        return importlib.import_module(f"{__package__}._{module}").build(size=size, seed=seed, batch_size=batch_size)

    build.__name__ = build.__qualname__ = f"build_{module}"
    build.__doc__ = f"Build the {module!r} workload; see :func:`ampkit.workloads.{module}.build`."
    return build


# A name may hold a hyphen (what users type); its module's name cannot.
_MODULES = {"digits": "digits", "digits-aug": "digits_aug", "segment": "segment", "gpt": "gpt", "resnet": "resnet"}

WORKLOADS: dict[str, Callable[..., Workload]] = {name: _lazy(module) for name, module in _MODULES.items()}
"""Workload name -> ``build(size="small", seed=0, batch_size=None) -> Workload``."""


def workload_names() -> list[str]:
    """The built-in workload names, sorted.

    >>> "segment" in workload_names()
    True
    """
    return sorted(WORKLOADS)


def get_workload(name: str, size: str = "small", seed: int = 0, batch_size: int | None = None) -> Workload:
    """Build the built-in workload ``name`` at ``size`` (one of :data:`~ampkit.workloads.SIZES`).

    ``batch_size`` (``--batch-size``) replaces the size's rows per training batch; throughput counts them.

    Raises ValueError, in one line, for an unknown name (naming the closest valid one) or size.

    >>> get_workload("resnet", size="tiny").metric is None
    True
    >>> get_workload("resnet", size="huge")
    Traceback (most recent call last):
    ...
    ValueError: unknown size 'huge' for workload 'resnet'; choose one of tiny, small, large.
    """
    if name not in WORKLOADS:
        valid = workload_names()
        close = difflib.get_close_matches(str(name), valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(valid)}{hint}.")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} for workload {name!r}; choose one of {', '.join(SIZES)}.")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"--batch-size {batch_size!r}: the batch size must be an int >= 1 (rows per training batch).")
    return WORKLOADS[name](size=size, seed=seed, batch_size=batch_size)
