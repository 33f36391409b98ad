"""benchmarks/compile_speed.py: in smoke mode on the CPU both forms (each repeated block, the whole model) get a row
and with aot_eager (the captured graph run unfused) the compiled run's loss equals the eager run's: the control.
Each row is printed the moment it is measured, a time limit skips the rows it did not start, and the speed-up's
spread over rounds and its verdict come from each round's medians."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "compile_speed.py"


@pytest.fixture
def script(load_script: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("compile_speed", monkeypatch)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


# CI time (2026-11-28): slow tier. The GPU suite no longer runs this script (its tune step measures the two compile
# forms); CI checks compiled training against eager in tests/unit/training/test_compile.py.
@pytest.mark.slow
def test_smoke_run_measures_both_forms_and_the_compiled_loss_matches_eager(tmp_path: Path) -> None:
    out = tmp_path / "compile.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    rows = data["rows"]
    assert [(r["precision"], r["compile"]) for r in rows] == [("bf16-mixed", "regional"), ("bf16-mixed", "true")]
    table = [line for line in done.stdout.splitlines() if line.startswith("| gpt |")]
    assert len(table) == len(rows)
    for r, line in zip(rows, table):
        assert r["status"] == "ok" and r["eager_s"] > 0 and r["compiled_s"] > 0, r
        assert r["steps_each"] == data["rounds"] * data["steps"] and len(r["speedup_rounds"]) == data["rounds"]
        assert r["loss_compiled"] == r["loss_eager"], r  # aot_eager: bitwise the same training
        assert r["speedup"] == pytest.approx(statistics.median(r["speedup_rounds"])) and r["speedup_min"] <= r["speedup"] <= r["speedup_max"]
        cells = _cells(line)
        assert cells[3:7] == [f"{r['eager_s'] * 1e3:.1f} ms", f"{r['compiled_s'] * 1e3:.1f} ms", f"{r['speedup']:.2f}x",
                              f"{min(r['speedup_rounds']):.2f}-{max(r['speedup_rounds']):.2f}x"]
        assert cells[7] == r["verdict"]


def test_the_speedups_spread_and_verdict_come_from_each_rounds_medians(script: ModuleType) -> None:
    # Three rounds, the second slow on both sides (the machine busy), an eager step stalled in the others: pooled, the
    # compiled engine looks twice as fast, outside what any round says; round by round it is slower once, so the
    # verdict is noise and the speed-up is the rounds' median, inside their spread.
    eager = [[10.0, 10.0, 30.0], [20.0, 20.0, 20.0], [10.0, 10.0, 30.0]]
    compiled = [[9.0, 9.0, 9.0], [21.0, 21.0, 21.0], [9.0, 9.0, 9.0]]
    f = script.speedup_figures(eager, compiled)
    per_round = [statistics.median(e) / statistics.median(c) for e, c in zip(eager, compiled)]
    pooled = statistics.median([t for r in eager for t in r]) / statistics.median([t for r in compiled for t in r])
    assert f["speedup_rounds"] == pytest.approx(per_round) and f["speedup"] == pytest.approx(statistics.median(per_round))
    assert (f["speedup_min"], f["speedup_max"]) == (min(per_round), max(per_round)) and f["steps_each"] == 9
    assert pooled > max(per_round) and min(per_round) < 1 < max(per_round) and f["verdict"].startswith("within noise")
    assert f["eager_s"] == statistics.median([t for r in eager for t in r]) and f["compiled_s"] == statistics.median([t for r in compiled for t in r])
    assert script.speedup_figures(eager, [[t / 2 for t in r] for r in eager])["verdict"] == "faster in every round"
    assert script.speedup_figures(eager, [[t * 1.1 for t in r] for r in eager])["verdict"] == "slower in every round"


class _Limit:
    """A time limit reached once ``after`` rows have started."""

    def __init__(self, after: int) -> None:
        self.after, self.started = after, 0

    def passed(self) -> str | None:
        self.started += 1
        return "not started: the script's time limit (1 s) was reached" if self.started > self.after else None


def test_each_row_is_printed_as_it_is_measured_and_a_time_limit_skips_the_rest(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The 2026-11-28 H200 run was killed after its one row was measured: rows must reach the log (and the JSON) as
    # they are measured, and the rows not started before the limit are reported, not cut half-way.
    measured: list[str] = []

    def fake_measure(w: Any, base: Any, batches: Any, precision: str, form: str, args: Any) -> dict[str, Any]:
        printed = capsys.readouterr().out  # what the log held when this row started
        measured.append(form)
        if len(measured) == 2:  # the first row is in the log, and in the JSON, before the second starts
            assert "| gpt | bf16-mixed | 'regional' | 30.0 ms |" in printed
            assert [r["compile"] for r in json.loads((tmp_path / "c.json").read_text())["rows"]] == ["regional"]
        f = script.speedup_figures([[0.030, 0.030]] * 2, [[0.020, 0.020]] * 2)
        return {**f, "compile_s": 11.6, "loss_eager": 2.5, "loss_compiled": 2.5}

    monkeypatch.setattr(script, "get_workload", lambda name, size, batch_size: SimpleNamespace(model=torch.nn.Linear(2, 2), channels_last=False, train_batches=[]))
    monkeypatch.setattr(script, "measure_form", fake_measure)
    monkeypatch.setattr(script, "Deadline", lambda seconds: _Limit(after=2))
    argv = ["--workloads", "gpt", "--precision", "bf16-mixed,32-true", "--compile", "regional,true", "--time-limit", "1", "--json", str(tmp_path / "c.json")]
    assert script.main(argv) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert measured == ["regional", "true"]
    assert [(r["precision"], r["compile"], r["status"]) for r in rows] == [
        ("bf16-mixed", "regional", "ok"), ("bf16-mixed", "true", "ok"), ("32-true", "regional", "skipped"), ("32-true", "true", "skipped")]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("| gpt | 32-true | True (whole model) | skipped: not started: the script's time limit")


@pytest.mark.parametrize(("argv", "message"), [(["--compile", "whole"], "--compile regional,true"), (["--workloads", "gtp"], "choose from")])
def test_bad_arguments_name_the_fix(script: ModuleType, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        script.main(argv)
    assert message in capsys.readouterr().err


def test_the_scripts_examples_hold(script: ModuleType) -> None:
    import doctest

    failures, tried = doctest.testmod(script)
    assert tried >= 2 and failures == 0
