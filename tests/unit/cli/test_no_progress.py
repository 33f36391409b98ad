"""Every command ``ampkit --help`` lists takes ``--no-progress``, so a script can pass it to each alike: the commands
that show progress (bench, doctor, memory, profile, tune) turn it off; env, which shows none, accepts it and prints
the same."""

from __future__ import annotations

import argparse
import json

import pytest

from ampkit.cli._main import _ADD_PARSERS, main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ampkit")
    subparsers = parser.add_subparsers(dest="command")
    for add in _ADD_PARSERS.values():
        add(subparsers)
    return parser


@pytest.mark.parametrize("command", sorted(_ADD_PARSERS))
def test_every_command_takes_no_progress(command: str) -> None:
    # Before: `ampkit env --no-progress` was a usage error (exit 2), so a script passing it to every command broke there.
    parser = _parser()
    assert parser.parse_args([command, "--no-progress"]).no_progress is True
    assert parser.parse_args([command]).no_progress is False


def test_env_prints_the_same_facts_with_no_progress(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--json"]) == 0
    plain = capsys.readouterr()
    assert main(["env", "--json", "--no-progress"]) == 0
    quiet = capsys.readouterr()
    assert json.loads(quiet.out) == json.loads(plain.out) and quiet.err == plain.err == ""
