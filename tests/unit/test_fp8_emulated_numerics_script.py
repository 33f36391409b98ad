"""benchmarks/fp8_emulated_numerics.py in smoke mode: four policies from the same weights, every Linear in fp8 under
the fp8 ones, and the figures it prints are the ones it writes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[fp8]')")


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fp8_emulated_numerics_script", ROOT / "benchmarks" / "fp8_emulated_numerics.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_smoke_run_trains_every_policy_from_the_same_start(script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert script.main(["--smoke", "--json", str(tmp_path / "out.json")]) == 0
    runs = json.loads((tmp_path / "out.json").read_text())["runs"]
    assert [runs[n]["fp8_layers"] for n in ("32-true", "bf16-mixed", "fp8-tensorwise", "fp8-rowwise")] == [0, 0, 5, 5]
    first = {n: r["losses"][0] for n, r in runs.items()}
    assert max(first.values()) - min(first.values()) < 0.01  # one start: the first losses differ by rounding only
    assert runs["fp8-tensorwise"]["losses"] != runs["bf16-mixed"]["losses"]  # fp8 really ran
    out = capsys.readouterr().out
    assert f"{runs['fp8-rowwise']['losses'][-1]:>10.4f}" in out and "max |dloss| vs bf16-mixed" in out
