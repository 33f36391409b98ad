"""docs/reference/cli.md is made from the parsers themselves, so it cannot drift from what the commands accept.

The page is generated from ``ampkit.cli._main.build_parser()`` (every ``ampkit`` subcommand, declared in
``ampkit/cli/_parsers.py``) and from the parser ``python -m ampkit.apex`` builds: each command's description and one
row per option with its value and its help, as ``--help`` prints them. The committed page must be exactly what the
parsers give today; a flag added, removed or reworded fails this test until the page is made again::

    AMPKIT_UPDATE_DOCS=1 python -m pytest -q -p no:cacheprovider tests/docs/test_cli_page.py

and committed with the change (``git diff docs/reference/cli.md`` shows what users will read).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "cli.md"
UPDATE_VARIABLE = "AMPKIT_UPDATE_DOCS"

HEAD = """\
# Command line

<!-- Made from the parsers by tests/docs/test_cli_page.py, which fails when this page and the parsers differ. Do not
edit it: change the help in src/ampkit/cli/_parsers.py (or src/ampkit/apex/__main__.py), then run
AMPKIT_UPDATE_DOCS=1 python -m pytest -q -p no:cacheprovider tests/docs/test_cli_page.py -->

Every command and every option, as `--help` prints them. `ampkit --help` and `ampkit COMMAND --help` show the same
on the terminal; `ampkit --version` prints ampkit's and torch's versions. A bad option or value exits with code 2 and
names the fix. What the commands print is defined on [Verdicts and figures](figures.md); the same runs from Python
are in the [API reference](api.md).
"""


class _Captured(Exception):
    """Raised in place of parsing, once the parser is built."""


def apex_parser() -> argparse.ArgumentParser:
    """The parser ``python -m ampkit.apex`` builds: ``main()`` builds it inline, so it is caught as it parses."""
    from ampkit.apex import __main__ as apex_main

    built: list[argparse.ArgumentParser] = []

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        built.append(self)
        raise _Captured

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture), contextlib.suppress(_Captured):
        apex_main.main([])
    return built[0]


def commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each command's name as typed and its parser: ``ampkit``'s subcommands in their order, then the Apex runner."""
    from ampkit.cli._main import build_parser

    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        yield f"ampkit {name}", parser
    yield "python -m ampkit.apex", apex_parser()


def _cell(text: str) -> str:
    # One table cell: a pipe would start a new cell, and "<" could open an HTML tag.
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _value(action: argparse.Action) -> str:
    """What the option takes, as ``--help`` writes it: nothing for a switch, ``[X]`` for an optional value."""
    if action.nargs == 0:
        return ""
    if action.choices is not None and action.metavar is None:
        shown = "{" + ",".join(map(str, action.choices)) + "}"
    elif action.metavar is not None:
        shown = str(action.metavar)
    else:
        shown = action.dest.upper() if action.option_strings else action.dest
    if action.nargs == argparse.REMAINDER:
        return "`...`"
    if action.nargs == "?":
        return f"`[{shown}]` (alone: `{action.const}`)"
    return f"`{shown}`"


def command_section(name: str, parser: argparse.ArgumentParser) -> list[str]:
    """One command: its heading, its description and a row per option (help and positional arguments included)."""
    formatter = parser._get_formatter()
    lines = [f"## `{name}`", ""]
    if parser.description:
        lines += [" ".join(parser.description.split()), ""]
    lines += [f"```text\n{name} [options]{' SCRIPT [ARGS...]' if name.endswith('apex') else ''}\n```", ""]
    lines += ["| Option | Value | What it does |", "| --- | --- | --- |"]
    for action in parser._actions:
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
        help_text = formatter._expand_help(action) if action.help else ""
        lines.append(f"| {names} | {_value(action)} | {_cell(help_text)} |")
    return [*lines, ""]


def render_page() -> str:
    """The whole page, from the parsers."""
    lines = [HEAD]
    for name, parser in commands():
        lines += command_section(name, parser)
    return "\n".join(lines).rstrip("\n") + "\n"


def missing_options(page: str) -> list[str]:
    """Every option string of every command that the page does not show as code."""
    return [f"{name} {option}" for name, parser in commands() for action in parser._actions for option in action.option_strings
            if f"`{option}`" not in page]


def test_the_page_is_what_the_parsers_give() -> None:
    made = render_page()
    if os.environ.get(UPDATE_VARIABLE):
        PAGE.write_text(made, encoding="utf-8")
    page = PAGE.read_text(encoding="utf-8")
    if page != made:
        diff = "".join(difflib.unified_diff(page.splitlines(True), made.splitlines(True), "docs/reference/cli.md", "the parsers"))
        pytest.fail(f"docs/reference/cli.md differs from the parsers; if the change is deliberate, remake it with "
                    f"{UPDATE_VARIABLE}=1 python -m pytest -q -p no:cacheprovider tests/docs/test_cli_page.py\n{diff}")


def test_every_option_of_every_command_is_on_the_page() -> None:
    # The same promise in the terms a reader checks: no flag --help shows is missing (a failure names it).
    assert missing_options(PAGE.read_text(encoding="utf-8")) == []


def test_every_subcommand_and_the_apex_runner_have_a_section() -> None:
    page = PAGE.read_text(encoding="utf-8")
    expected = ["ampkit bench", "ampkit doctor", "ampkit env", "ampkit memory", "ampkit profile", "ampkit tune", "python -m ampkit.apex"]
    assert sorted(name for name, _ in commands()) == sorted(expected)
    assert [name for name in expected if f"## `{name}`" not in page] == []


def test_a_flag_left_off_the_page_is_named() -> None:
    # The checks above can fail: a page without one option's row is told apart, and that option is the one named.
    page = PAGE.read_text(encoding="utf-8")
    without = "\n".join(line for line in page.splitlines() if not line.startswith("| `--budget`"))
    assert missing_options(without) == ["ampkit tune --budget"]
    assert without != render_page()


def test_the_apex_parser_is_the_one_its_main_parses_with() -> None:
    parser = apex_parser()
    assert parser.prog == "python -m ampkit.apex"
    assert {s for a in parser._actions for s in a.option_strings} >= {"--force", "--half-dtype", "-m"}
