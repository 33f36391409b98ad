"""The ``ampkit`` command line: one internal module per subcommand, wired together in :mod:`ampkit.cli._main`.

Its one public name is :func:`main`, the console script's entry point (``ampkit ...``, ``python -m ampkit ...``);
importing this package imports no subcommand (nor torch).

    >>> from ampkit.cli import main
    >>> try:  # doctest: +ELLIPSIS
    ...     main(["--version"])
    ... except SystemExit as done:  # --help and --version end as argparse ends them
    ...     print("exit code", done.code)
    ampkit ...
    exit code 0
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._util.lazy import lazy_names

if TYPE_CHECKING:
    from ._main import main

# Where each public name lives (its module, relative to this package): imported on the name's first use.
_NAMES = {"main": "_main"}

__all__ = ["main"]

__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
