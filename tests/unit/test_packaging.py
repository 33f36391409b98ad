"""What the package ships besides its modules."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_package_ships_the_py_typed_marker() -> None:
    # PEP 561: without the marker, mypy and pyright treat `import ampkit` in a user's code as untyped (every name
    # Any), so the library's annotations would check nothing for its users.
    tomllib = pytest.importorskip("tomllib", reason="Requires: Python >= 3.11 (tomllib) to read pyproject.toml")
    assert (resources.files("ampkit") / "py.typed").is_file()
    package_data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["ampkit"]  # setuptools before 69 leaves it out of the wheel unless named
