"""Entry point of the ``ampkit`` command: builds the parser and dispatches to a subcommand module.

Each subcommand lives in its own module (as in Accelerate's CLI) exposing ``run(args) -> int``; its parser is
declared in :mod:`ampkit.cli._parsers`, and the module itself is imported only when the command runs, so
``ampkit --help`` imports neither torch nor any tool. Adding a command means writing that module, declaring its
parser there and listing it in :data:`_ADD_PARSERS`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from .. import __version__
from .._errors import AmpkitError, one_line
from .._util.library_logs import TORCHAO_LOGGERS, quiet_library_logs
from ._checks import check_before_import
from ._parsers import add_bench, add_doctor, add_env, add_memory, add_profile, add_tune

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

logger = logging.getLogger("ampkit")

_ADD_PARSERS: dict[str, Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = {
    "bench": add_bench, "doctor": add_doctor, "env": add_env, "memory": add_memory, "profile": add_profile, "tune": add_tune,
}
"""Each subcommand, the name of its module in this package, and the function declaring its parser."""


def __getattr__(name: str) -> Any:
    # SUBCOMMANDS, the subcommand modules, is public: it imports them (and torch) only when it is read.
    if name == "SUBCOMMANDS":
        return tuple(importlib.import_module(f"{__package__}._{command}") for command in _ADD_PARSERS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SUBCOMMANDS: tuple[ModuleType, ...]
"""Modules that each expose ``register(subparsers) -> None`` and ``run(args) -> int``, imported when read."""


class _Version(argparse.Action):
    """``--version``: prints ampkit's version and torch's, importing torch only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        import torch

        print(f"ampkit {__version__} (torch {torch.__version__})")  # stdout, as argparse's own version action
        parser.exit()


# Exit code for usage errors and for errors ampkit reports on purpose, as argparse uses for bad arguments.
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The ``ampkit`` parser with every subcommand registered; builds it without importing the subcommands."""
    # prog is fixed so help reads "ampkit" under `python -m ampkit` too, not "__main__.py".
    parser = argparse.ArgumentParser(
        prog="ampkit",
        description="Fast, memory-lean and safe mixed-precision training on native PyTorch.",
    )
    parser.add_argument("--version", action=_Version, help="show program's version number and exit")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for add_parser in _ADD_PARSERS.values():
        add_parser(subparsers)
    return parser


def _refuse_unknown(parser: argparse.ArgumentParser, args: argparse.Namespace, unknown: list[str]) -> None:
    """Exit 2 on arguments no parser took, with the usage of the command they were given to (``ampkit bench
    --acumulate 4`` shows bench's usage, not ampkit's) and the closest option of that command."""
    commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
    command = commands.get(getattr(args, "command", None) or "", parser)
    message = f"unrecognized arguments: {' '.join(unknown)}"
    options = [s for a in command._actions for s in a.option_strings if s.startswith("--")]
    typed = next((u.split("=", 1)[0] for u in unknown if u.startswith("-")), None)
    close = difflib.get_close_matches(typed, options, n=1, cutoff=0.6) if typed else []
    command.error(f"{message} (did you mean {close[0]}?)" if close else message)


def main(argv: list[str] | None = None) -> int:
    """Run the ``ampkit`` command with ``argv`` (``sys.argv[1:]`` when None) and return its exit code.

    Argument errors, ``--help`` and ``--version`` end through argparse's usual ``SystemExit``; an unknown option
    prints the usage of the command it was given to, with its closest option. Names and values that can be judged
    without torch are refused before the command imports it (:func:`~ampkit.cli._checks.check_before_import`). An
    :class:`~ampkit.AmpkitError` or ``ValueError`` raised by a subcommand is a user error: it is printed
    as one ``ampkit: error: ...`` line on stderr and gives exit code 2. Anything else is a bug and keeps its
    traceback.
    """
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse_unknown(parser, args, unknown)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # recorded by commands that log how they ran
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        check_before_import(args)  # a bad name or value is refused at once, not after torch's import
        # A model file may import torchao (transformers does) whatever the command: its import noise stays out.
        with quiet_library_logs(*TORCHAO_LOGGERS):
            return int(func(args))
    except (AmpkitError, ValueError) as exc:
        logger.debug("ampkit %s failed", args.command, exc_info=True)
        print(f"ampkit: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130  # the shell's convention for SIGINT
