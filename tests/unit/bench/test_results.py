"""results.json: the schema the issue promises, JSON-safe values, atomic writes, forward-compatible reads."""

from __future__ import annotations

import json
from pathlib import Path

from ampkit.bench._results import BenchResult, RunResult

REQUIRED_TOP = {"workload", "device", "torch", "command", "runs"}
REQUIRED_RUN = {
    "precision", "status", "step_time_median_s", "throughput", "speedup_vs_fp32", "peak_memory_bytes",
    "activation_bytes", "final_loss", "eval_metric_name", "eval_metric", "skipped_steps",
}


def test_schema_holds_every_documented_key(tmp_path: Path) -> None:
    result = BenchResult(workload="gpt", command="ampkit bench", runs=[RunResult(precision="32-true")])
    data = json.loads(result.write_json(tmp_path / "results.json").read_text())
    assert REQUIRED_TOP <= set(data) and data["schema"] == 1
    assert REQUIRED_RUN <= set(data["runs"][0])


def test_non_finite_numbers_become_null_so_the_file_is_strict_json(tmp_path: Path) -> None:
    run = RunResult(precision="16-true", status="diverged", final_loss=float("nan"), losses=[1.0, float("inf")])
    path = BenchResult(workload="w", runs=[run]).write_json(tmp_path / "r.json")
    data = json.loads(path.read_text(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert data["runs"][0]["final_loss"] is None and data["runs"][0]["losses"] == [1.0, None]


def test_round_trip_and_unknown_keys_are_ignored(tmp_path: Path) -> None:
    result = BenchResult(workload="digits", device={"type": "cpu"}, runs=[RunResult(precision="bf16-mixed", throughput=12.5)])
    path = result.write_json(tmp_path / "results.json")
    data = json.loads(path.read_text())
    data["added_later"] = 1
    data["runs"][0]["also_new"] = 2
    back = BenchResult.from_dict(data)
    assert back == result
    assert back.run("bf16-mixed").throughput == 12.5 and back.run("16-mixed") is None


def test_write_replaces_whole_files_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text("old")
    BenchResult(workload="w").write_json(path)
    assert json.loads(path.read_text())["workload"] == "w"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
