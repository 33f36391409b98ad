"""benchmarks/preemption_overhead.py: the smoke run prints the row it writes, the ratio is on/off of the medians, and
the check adds no aten op and no host sync to a single-process step (the counts are deterministic)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def script(load_script: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("preemption_overhead", monkeypatch)


def test_smoke_run_prints_and_writes_the_same_row_and_the_check_adds_no_op_or_sync(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "overhead.json"
    script.main(["--smoke", "--ranks", "1", "--json", str(out)])  # the two-rank row spawns ranks: the slow tier's run
    assert signal.getsignal(signal.SIGTERM) is before
    (row,) = json.loads(out.read_text())["results"]
    assert row["ratio"] == pytest.approx(row["on_ms"] / row["off_ms"])
    assert row["ops"][0] == row["ops"][1] > 0 and row["syncs"] == [0, 0]
    assert script.row_line(row) in capsys.readouterr().out


@pytest.mark.slow
def test_smoke_run_on_two_ranks(script: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    script.main(["--smoke", "--ranks", "2", "--json", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert [r["ranks"] for r in rows] == [1, 2] and rows[1]["on_ms"] > 0
