"""benchmarks/apex_overhead.py in smoke mode: every contender builds and steps, and --json holds the printed table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def script(load_script: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("apex_overhead", monkeypatch)


def test_smoke_mode_runs_every_contender_and_writes_the_table_as_json(script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "apex.json"
    result = script.main(["--smoke", "--json", str(out)])
    printed = capsys.readouterr().out
    assert json.loads(out.read_text(encoding="utf-8")) == result
    names = [row["contender"] for row in result["rows"]]
    assert names == ["fp32 loop", "apex O0", "torch.amp loop", "apex O1", "apex O1 loss_scale=1", "Engine masters", "apex O2", "apex O2 loss_scale=1"]
    for row in result["rows"]:
        assert row["median_ms"] > 0 and row["steps"] == 4  # 2 rounds of 2 steps
        assert f"| {row['contender']} | {row['median_ms']:.3f} |" in printed
    assert (result["device"], result["model"], result["half"], result["smoke"]) == ("cpu", "mlp", "bfloat16", True)
    assert "--smoke --json" in result["command"]


def test_the_model_follows_the_device_unless_given(script: ModuleType) -> None:
    parse = script.parse_args
    assert parse([]).model == "cnn" and parse(["--device", "cuda"]).model == "mlp"
    assert parse(["--device", "cuda", "--model", "cnn"]).model == "cnn"
    cuda = parse(["--device", "cuda", "--half", "float16", "--width", "2048", "--batch", "512"])  # the GPU suite's call
    assert (cuda.width, cuda.batch, cuda.steps, cuda.rounds, cuda.warmup) == (2048, 512, 10, 8, 3)
