"""benchmarks/lowbit_step.py in smoke mode on the CPU: every row is measured and printed, the compiled rows really
stepped through their regions, the controls compare each row with its twin, and a time limit skips what it did
not start instead of cutting it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1].parent
SCRIPT = ROOT / "benchmarks" / "lowbit_step.py"


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    out = tmp_path / "lowbit.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out), *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done, json.loads(out.read_text(encoding="utf-8"))["rows"]


def test_smoke_run_times_every_step_and_compares_each_remedy_with_its_twin(tmp_path: Path) -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    pytest.importorskip("optimi", reason="Requires: torch-optimi (pip install -e '.[lowbit]')")
    done, rows = _run(tmp_path)
    by = {r["engine"]: r for r in rows}
    assert list(by) == [
        "bf16-true-masters", "bf16-true-sr, torchao's step", "bf16-true-sr, one region", "bf16-true-kahan, optimi foreach",
        "bf16-true-kahan, optimi for-loop", "bf16-true-masters fused", "bf16-true",
    ]
    assert all(r["status"] == "ok" and r["step_s"] > 0 and r["steps"] == 4 for r in rows)
    assert by["bf16-true-masters"]["vs_masters"] == 1.0 and by["bf16-true-masters fused"]["vs_masters_fused"] == 1.0
    # The compiled rows went through their regions: every step after the one that built the state (the compiling
    # warm-up step, then 4 timed).
    assert by["bf16-true-sr, one region"]["compiled_calls"] == 5 and by["bf16-true-masters fused"]["compiled_calls"] == 5
    assert by["bf16-true-sr, torchao's step"]["compiled_calls"] == 0 and "compile_s" in by["bf16-true-sr, one region"]
    assert by["bf16-true-masters fused"]["control"]["max_abs_diff"] <= 0.01 * by["bf16-true-masters fused"]["control"]["weight_scale"]
    assert by["bf16-true-sr, torchao's step"]["control"]["stochastic"]
    assert "| tiny | bf16-true-sr, one region |" in done.stdout


def test_a_time_limit_reports_the_work_it_did_not_start_as_skipped(tmp_path: Path) -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    done, rows = _run(tmp_path, "--time-limit", "0", "--sizes", "tiny,small", "--rows", "bf16-true-sr,bf16-true")
    assert rows and all(r["status"] == "skipped" and "time limit" in r["reason"] for r in rows)
    assert {r["size"] for r in rows} == {"tiny", "small"} and "skipped: not started" in done.stdout
    # --rows: the masters' step, a policy's rows by the name before their comma, a row by its whole label.
    assert [r["engine"] for r in rows if r["size"] == "tiny"] == ["bf16-true-masters", "bf16-true-sr, torchao's step", "bf16-true-sr, one region", "bf16-true"]
