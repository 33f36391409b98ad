"""The numerics benchmark scripts run end to end in their ``--smoke`` mode, as the GPU suite and CI call them.

They run on the CPU only: the GPU suite (``benchmarks/gpu_suite.py``) runs the scripts themselves on the GPU, at
full size, so a smoke run of them in the CUDA test pass would only spend the GPU window twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def script(load_script: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """``script("doctor_findings")``: benchmarks/doctor_findings.py, imported for this test."""
    return lambda name: load_script(name, monkeypatch)


def last_table(out: str) -> list[str]:
    """The Markdown table the script printed last (its rows must be the last lines of the output)."""
    lines = out.rstrip("\n").splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("| ---")) - 1
    table = lines[start:]
    assert all(line.startswith("|") for line in table), "the Markdown table must be printed last"
    return table


def test_doctor_findings_smoke_writes_json_and_prints_the_table_last(script: Callable[[str], ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "doctor.json"
    assert script("doctor_findings").main(["--smoke", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    table = last_table(printed)
    assert len(table) == 3 and table[2].startswith("| gpt |")
    # the 16-mixed diagnosis is printed the moment it ends, before the bf16-mixed comparison and the row
    assert printed.index("# gpt 16-mixed: diagnosed in") < printed.index("| gpt |")
    data = json.loads(path.read_text())  # strict JSON: json.loads would take NaN, so check no figure is one
    assert data["device"] == "cpu" and data["size"] == "tiny" and data["precision"] == "16-mixed"
    (row,) = data["rows"]
    assert row["workload"] == "gpt" and 0 < row["max_grad"] and row["seconds"] > 0
    assert row["bf16_skipped"] is None and -1.0 <= row["bf16_cos"] <= 1.0
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()


def test_doctor_findings_past_its_time_limit_skips_the_bf16_comparison(script: Callable[[str], ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "doctor.json"
    bench = script("doctor_findings")
    original = bench.Deadline

    class SpentAfterTheFirstCheck(original):  # the workload starts; by the bf16 comparison the limit is reached
        checks = 0

        def passed(self) -> str | None:
            type(self).checks += 1
            return None if type(self).checks == 1 else "not started: the script's time limit (1 s) was reached"

    bench.Deadline = SpentAfterTheFirstCheck
    try:
        assert bench.main(["--smoke", "--json", str(path)]) == 0
    finally:
        bench.Deadline = original
    (row,) = json.loads(path.read_text())["rows"]
    assert row["status"] == "ok" and row["max_grad"] > 0 and "time limit" in row["bf16_skipped"]
    assert "not run: not started" in last_table(capsys.readouterr().out)[2]


def test_numerics_sampler_smoke_writes_json_and_prints_the_table_last(script: Callable[[str], ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sampler.json"
    assert script("numerics_sampler").main(["--smoke", "--json", str(path)]) == 0
    table = last_table(capsys.readouterr().out)
    assert len(table) == 3 and table[2].startswith("| gpt |")
    data = json.loads(path.read_text())
    assert data["precision"] == "bf16-mixed", "the default precision is the mixed policy of the device"
    (row,) = data["rows"]
    assert row["n_sampled"] == data["rounds"] and row["off"] > 0 and row["sampled"] > 0


def test_numerics_sampler_takes_the_gpu_suite_spelling(script: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = script("numerics_sampler")
    calls = []
    monkeypatch.setattr(bench, "one", lambda *a: calls.append(a) or {"workload": a[0], "status": "ok", "off": 1.0, "on": 1.0, "sampled": 2.0, "amortized": 1.0, "n_sampled": 1})
    assert bench.main(["--workload", "gpt", "--size", "large"]) == 0
    assert [c[:3] for c in calls] == [("gpt", "large", "bf16-mixed")]
    assert last_table(capsys.readouterr().out)[2].startswith("| gpt |")
