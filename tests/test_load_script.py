"""The suite's ``load_script`` fixture (tests/conftest.py): a benchmark script imported by its name, for one test."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_a_script_is_imported_under_its_own_name_for_the_test_only(load_script: Callable[..., ModuleType]) -> None:
    before = sys.modules.get("measured_rows")  # the scripts import it as a neighbour: it may be there already
    with pytest.MonkeyPatch.context() as monkeypatch:
        module = load_script("measured_rows", monkeypatch)
        assert sys.modules["measured_rows"] is module  # dataclasses of the script find their module
        assert Path(module.__file__) == BENCHMARKS / "measured_rows.py" and module is not before
    assert sys.modules.get("measured_rows") is before


@pytest.mark.parametrize("name", ["measured_rows.py", "no_such_script"])
def test_a_name_that_is_no_script_says_what_to_pass(load_script: Callable[..., ModuleType], name: str) -> None:
    with pytest.raises(FileNotFoundError, match=r"name a script of benchmarks/, without \.py"):
        load_script(name)
    assert name not in sys.modules
