"""benchmarks/compile_speed.py in smoke mode on the CPU: every policy gets an eager and a compiled row, and with
aot_eager (the captured graph run unfused) the compiled run's loss equals the eager run's: the control."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_measures_every_policy_and_the_compiled_loss_matches_eager(tmp_path: Path) -> None:
    out = tmp_path / "compile.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compile_speed.py"), "--smoke", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert [r["precision"] for r in rows] == ["32-true", "bf16-mixed"]
    for r in rows:
        assert r["eager_s"] > 0 and r["compiled_s"] > 0 and r["steps_each"] == 4
        assert r["loss_compiled"] == r["loss_eager"], r  # aot_eager: bitwise the same training
    assert "| digits | bf16-mixed |" in done.stdout
