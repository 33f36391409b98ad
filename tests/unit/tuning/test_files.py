"""``--out``'s files: tune.json, the two plots and report.md linking them; without matplotlib the report says so."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from ampkit.tuning import TuneResult, code, rows, write_files
from ampkit.tuning._report import PLOTS

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_plots_are_written_beside_the_report_and_linked_with_their_definitions(measured: TuneResult, tmp_path: Path) -> None:
    data_path, report = write_files(measured, tmp_path / "out")
    for name in ("speed_memory.png", "loss_curves.png"):
        assert (tmp_path / "out" / name).read_bytes()[:8] == PNG
    text = report.read_text()
    assert "![speed memory](speed_memory.png)" in text and "![loss curves](loss_curves.png)" in text
    assert f"speed_memory.png: {PLOTS['speed_memory.png']}" in text and f"loss_curves.png: {PLOTS['loss_curves.png']}" in text
    data = json.loads(data_path.read_text())
    assert data["rows"] == json.loads(json.dumps(rows(measured))) and data["winner_code"] == code(measured)
    assert data["reference"]["reordered_losses"] == [2.0, 1.6, 1.1, 1.05]


def test_without_matplotlib_the_report_says_so_and_the_rest_is_written(
    measured: TuneResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    data_path, report = write_files(measured, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "tune.json"]
    assert 'No plots: the tune plots need matplotlib, which is not installed: pip install "ampkit[bench]"' in report.read_text()
    assert json.loads(data_path.read_text())["winner_code"] == code(measured)
