"""Entry point of the ``ampkit`` command: builds the parser and dispatches to a subcommand module.

Each subcommand lives in its own module (as in Accelerate's CLI) exposing ``register(subparsers)``, which
adds its parser and sets ``func``: a callable taking the parsed namespace and returning an exit code.
Adding a command means writing that module and listing it in :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from types import ModuleType

import torch

from .. import __version__
from ..errors import AmpkitError, one_line
from . import bench, doctor, env, memory

__all__ = ["main", "build_parser", "SUBCOMMANDS"]

logger = logging.getLogger("ampkit")

SUBCOMMANDS: tuple[ModuleType, ...] = (bench, doctor, env, memory)
"""Modules that each expose ``register(subparsers) -> None``."""

# Exit code for usage errors and for errors ampkit reports on purpose, as argparse uses for bad arguments.
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The ``ampkit`` parser with every subcommand in :data:`SUBCOMMANDS` registered."""
    # prog is fixed so help reads "ampkit" under `python -m ampkit` too, not "__main__.py".
    parser = argparse.ArgumentParser(
        prog="ampkit",
        description="Fast, memory-lean and safe mixed-precision training on native PyTorch.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"ampkit {__version__} (torch {torch.__version__})",
    )
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``ampkit`` command with ``argv`` (``sys.argv[1:]`` when None) and return its exit code.

    Argument errors, ``--help`` and ``--version`` end through argparse's usual ``SystemExit``. An
    :class:`~ampkit.errors.AmpkitError` or ``ValueError`` raised by a subcommand is a user error: it is printed
    as one ``ampkit: error: ...`` line on stderr and gives exit code 2. Anything else is a bug and keeps its
    traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # recorded by commands that log how they ran
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(func(args))
    except (AmpkitError, ValueError) as exc:
        logger.debug("ampkit %s failed", args.command, exc_info=True)
        print(f"ampkit: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130  # the shell's convention for SIGINT
