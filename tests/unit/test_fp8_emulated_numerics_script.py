"""benchmarks/fp8_emulated_numerics.py in smoke mode: four policies from the same weights, every Linear in fp8 under
the fp8 ones, and the figures it prints are the ones it writes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[fp8]')")


@pytest.fixture(scope="module")
def script(load_script: Callable[..., ModuleType]) -> ModuleType:
    return load_script("fp8_emulated_numerics")


def test_smoke_run_trains_every_policy_from_the_same_start(script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert script.main(["--smoke", "--json", str(tmp_path / "out.json")]) == 0
    runs = json.loads((tmp_path / "out.json").read_text())["runs"]
    assert [runs[n]["fp8_layers"] for n in ("32-true", "bf16-mixed", "fp8-tensorwise", "fp8-rowwise")] == [0, 0, 5, 5]
    first = {n: r["losses"][0] for n, r in runs.items()}
    assert max(first.values()) - min(first.values()) < 0.01  # one start: the first losses differ by rounding only
    assert runs["fp8-tensorwise"]["losses"] != runs["bf16-mixed"]["losses"]  # fp8 really ran
    out = capsys.readouterr().out
    assert f"{runs['fp8-rowwise']['losses'][-1]:>10.4f}" in out and "max |dloss| vs bf16-mixed" in out
