"""A package face whose public names load on first use (PEP 562), so importing the package imports none of its modules.

    >>> getattr_, dir_ = lazy_names("ampkit.fileio", {"save_checkpoint": "_checkpoint_files"}, {})
    >>> getattr_("save_checkpoint").__name__
    'save_checkpoint'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, names: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each public name of ``names`` (name -> its module, relative to the
    package) is imported the first time it is read, then cached in ``namespace`` (the package's ``globals()``)."""

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        namespace[name] = value  # later reads find it without calling __getattr__ again
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(names))

    return getattr_, dir_
