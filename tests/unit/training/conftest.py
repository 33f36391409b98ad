"""Fixtures of the training tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def mypy_on_user_code(tmp_path: Path) -> Callable[[str], str]:
    """Run mypy on a user's snippet as their type checker would read ampkit: only ampkit analysed (torch and the rest
    skipped, their types Any), no cache (about 3 s, the same each run), and the ampkit this test imports on mypy's
    path, not another checkout installed in the environment. Returns mypy's report."""
    api = pytest.importorskip("mypy.api", reason="Requires: mypy (the dev extra)")
    import ampkit

    def run(code: str) -> str:
        (tmp_path / "user.py").write_text(code)
        (tmp_path / "mypy.ini").write_text(
            f"[mypy]\nmypy_path = {Path(ampkit.__file__).resolve().parents[1]}\nfollow_imports = skip\nignore_missing_imports = True\n"
            "[mypy-ampkit.*]\nfollow_imports = silent\n"
        )
        out, err, _ = api.run([str(tmp_path / "user.py"), "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir", os.devnull, "--no-error-summary"])
        assert not err, err
        return out

    return run
