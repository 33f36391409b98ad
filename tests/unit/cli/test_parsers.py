"""The command-line grammar, declared apart from the subcommands so that ``--help`` imports no torch."""

from __future__ import annotations

import argparse

import pytest

from ampkit.cli import _parsers as parsers
from ampkit.workloads import SIZES


def test_sizes_are_the_workload_sizes() -> None:
    # parsers repeats the tuple to keep torch out of --help; a new workload size must reach --size too.
    assert parsers.SIZES == SIZES


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(prog="ampkit")
    subparsers = parser.add_subparsers(dest="command")
    for add in (parsers.add_bench, parsers.add_doctor, parsers.add_env, parsers.add_memory):
        add(subparsers)
    return dict(subparsers.choices)


def _declaration(p: argparse.ArgumentParser, option: str, *, with_help: bool) -> tuple[object, ...]:
    action = next(a for a in p._actions if option in a.option_strings)
    fields = (tuple(action.option_strings), action.dest, action.default, action.type, action.choices, action.metavar, action.nargs)
    return (*fields, action.help) if with_help else fields


@pytest.mark.parametrize(
    ("option", "commands", "with_help"),
    [
        ("--workload", ("bench", "doctor", "memory"), True),
        ("--size", ("bench", "doctor", "memory"), True),
        ("--model", ("bench", "doctor", "memory"), True),
        ("--data", ("bench", "doctor", "memory"), True),
        ("--seed", ("bench", "doctor"), True),  # memory's seed seeds only the built-in workload: its help says so
        ("--seed", ("bench", "doctor", "memory"), False),
        ("--device", ("bench", "doctor"), True),  # memory predicts for a device that need not be here: its own help
        ("--device", ("bench", "doctor", "memory"), False),
        ("--out", ("bench", "doctor"), False),  # the help names the files each command writes
    ],
)
def test_shared_flags_are_declared_alike(option: str, commands: tuple[str, ...], with_help: bool) -> None:
    # A flag several subcommands take means the same in each: one declaration, not near-copies that drift apart.
    subparsers = _subparsers()
    declarations = {_declaration(subparsers[c], option, with_help=with_help) for c in commands}
    assert len(declarations) == 1, declarations

