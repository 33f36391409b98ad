"""The command-line grammar, declared apart from the subcommands so that ``--help`` imports no torch."""

from __future__ import annotations

from ampkit.bench.workload import SIZES
from ampkit.cli import parsers


def test_sizes_are_the_workload_sizes() -> None:
    # parsers repeats the tuple to keep torch out of --help; a new workload size must reach --size too.
    assert parsers.SIZES == SIZES
