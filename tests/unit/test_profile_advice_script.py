"""benchmarks/profile_advice.py in smoke mode on the CPU: the attribution against the control, the advice applied,
the per-step read-back found at the script's line, and every window's overhead, all present and consistent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "profile_advice.py"


def test_smoke_run_reports_attribution_advice_syncs_and_overhead(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text(encoding="utf-8"))
    a = result["attribution"]
    # The augmentation, timed alone, is what the data phase gains over the control (generous: tiny sizes, shared CPU).
    extra = a["phases"]["data"]["slow_s"] - a["phases"]["data"]["control_s"]
    assert 0.3 * a["augmentation_alone_s"] < extra < 3 * a["augmentation_alone_s"]
    assert set(result["advice"]["ab_step_s"]) == {"as given", "advised"}
    trials = result["advice"]["profile"]["trials"]
    assert trials[0]["name"] == "as given" and any(t["name"] == result["advice"]["advised"] for t in trials)
    (site,) = result["syncs"]["sites"]
    line = next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "the per-step read-back the profile must find" in text)
    assert site["where"].startswith(f"{SCRIPT}:{line} ") and site["per_step"] == 1
    overhead = result["advice"]["profile"]["overhead"]
    assert all(overhead[k] > 0 for k in ("plain_step_s", "profiled_step_s", "sync_step_s", "trace_step_s"))
    assert "| data |" in done.stdout and "The profiler's own overhead" in done.stdout
    # each part is printed the moment it is measured, most telling first
    assert done.stdout.index("| data |") < done.stdout.index("A per-step `loss.item()`") < done.stdout.index("The advice, applied")


def test_parts_not_started_by_the_time_limit_are_reported_skipped(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--time-limit", "0", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text(encoding="utf-8"))
    assert [result[k]["status"] for k in ("attribution", "syncs", "advice")] == ["skipped"] * 3
    assert done.stdout.count("not started: the script's time limit") == 3
