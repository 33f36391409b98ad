"""No module under src/ampkit is over 400 lines (issue 48, item 4).

A module that long holds more than one concept. Split it along them: read it whole, find the two or three things it
does, give each its own module, and keep every name importable from where it was (the old module re-exports them).
"""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ampkit"
LIMIT = 400


def oversized(root: Path = SRC, limit: int = LIMIT) -> dict[str, int]:
    """Each ``.py`` file under ``root`` with more than ``limit`` lines, by its path relative to ``root``: its line count."""
    counts = {path.relative_to(root).as_posix(): len(path.read_text(encoding="utf-8").splitlines()) for path in sorted(root.rglob("*.py"))}
    return {name: count for name, count in counts.items() if count > limit}


def test_no_module_is_over_the_limit() -> None:
    assert SRC.is_dir() and any(SRC.rglob("*.py")), f"no modules found under {SRC}: the check would pass vacuously"
    over = oversized()
    assert not over, (
        f"modules over {LIMIT} lines under src/ampkit (split each along its concepts, one module per concept, "
        "re-exporting the names from the old module): " + ", ".join(f"{name} ({count} lines)" for name, count in over.items())
    )


def test_the_check_names_each_module_over_the_limit_and_counts_its_lines(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * 401)
    (tmp_path / "at_limit.py").write_text("x = 1\n" * 400)
    (tmp_path / "no_final_newline.py").write_text("x = 1\n" * 400 + "y = 2")
    (tmp_path / "notes.txt").write_text("x\n" * 1000)  # not a module
    assert oversized(tmp_path) == {"no_final_newline.py": 401, "pkg/big.py": 401}
