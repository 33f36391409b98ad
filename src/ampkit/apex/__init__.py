"""A maintained home for code written against NVIDIA Apex: ``amp``, ``optimizers``, ``parallel``, ``fp16_utils``.

Three ways in, from least to most change:

* ``python -m ampkit.apex train.py --args`` runs an unchanged script with ``import apex`` resolving here;
* ``ampkit.apex.install()`` does the same inside a running process;
* ``from ampkit.apex import amp`` replaces ``from apex import amp`` in code that can change one line.

A real Apex installation is never shadowed silently: :func:`install` keeps its modules and supplies only the
ones it lacks (``amp``, since Apex deleted it), and says so.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import amp
from .install import install, uninstall

__all__ = ["amp", "install", "uninstall", "optimizers", "parallel", "fp16_utils", "normalization", "multi_tensor_apply"]

_LAZY = ("optimizers", "parallel", "fp16_utils", "normalization", "multi_tensor_apply")


def __getattr__(name: str) -> Any:
    # `import apex` followed by `apex.parallel.X` worked with Apex, whose package imported its submodules.
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
