"""benchmarks/fused_master_step.py in smoke mode on the CPU: the bf16-mixed step, the masters' unfused step and
their fused step each get a row; the fused masters end where the unfused ones do (the control), after steps that
really went through the fused region."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# CI time (2026-11-28): slow tier. No GPU suite step runs this script; CI checks the fused master step against the
# unfused one in tests/unit/training/test_fused_master_step.py.
@pytest.mark.slow
def test_smoke_run_times_each_step_and_the_fused_masters_match_the_unfused(tmp_path: Path) -> None:
    out = tmp_path / "fused.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fused_master_step.py"), "--smoke", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = {r["engine"]: r for r in json.loads(out.read_text(encoding="utf-8"))["rows"]}
    assert list(rows) == ["bf16-mixed", "bf16-true-masters", "bf16-true-masters fused"]
    assert all(r["step_s"] > 0 for r in rows.values())
    fused = rows["bf16-true-masters fused"]
    assert fused["fused_calls"] == 1 + 4  # the compiling step, then 2 rounds of 2
    assert fused["fused_failure"] is None  # the region compiled: the row times the fused step
    assert fused["masters_max_rel_diff"] < 1e-5
    assert "| bf16-true-masters fused |" in done.stdout
