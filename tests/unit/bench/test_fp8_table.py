"""The fp8 layer plan in bench: planned at the workload's rows, run as planned, shown in the terminal and report.md.

fp8 needs an sm89+ GPU; here the registry's fp8-tensorwise is swapped for its emulated twin so that the bench's
path runs on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from rich.console import Console

from ampkit.bench import _table as table
from ampkit.bench._fp8_table import HEADERS, fp8_markdown, fp8_rows
from ampkit.bench._report import write_report
from ampkit.bench._results import BenchResult
from ampkit.bench._runner import run_bench
from ampkit.memory._fp8_layers import Fp8Plan, fp8_layer_plan
from ampkit.policy import FP8Tensorwise
from ampkit.policy._registry import POLICIES

pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[fp8]')")


@dataclass(frozen=True, kw_only=True)
class EmulatedTensorwise(FP8Tensorwise):
    emulate: bool = True


def _gpt():
    import dataclasses

    from ampkit.workloads import _gpt as gpt

    return dataclasses.replace(gpt.build("tiny"), steps=3, warmup=1)


def test_bench_plans_fp8_at_the_workloads_rows_and_runs_the_plan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(POLICIES, "fp8-tensorwise", EmulatedTensorwise)
    w = _gpt()
    result = run_bench(w, ["32-true", "bf16-mixed", "fp8-tensorwise"], "cpu", rounds=1)
    plan = Fp8Plan.from_dict(result.fp8_layers["fp8-tensorwise"])
    assert plan == fp8_layer_plan(w.model, w.train_batches[0], "fp8-tensorwise")
    assert plan.tokens == w.train_batches[0][0].numel()  # 4 x 32 tokens: every Linear's rows
    # At 128 rows no layer pays, so the run converts none and is bf16-mixed's, loss for loss.
    assert not any(p.convert for p in plan.layers)
    assert result.run("fp8-tensorwise").losses == result.run("bf16-mixed").losses
    # The plan survives results.json and reaches the terminal and report.md.
    again = BenchResult.from_dict(result.to_dict())
    assert again.fp8_layers == result.fp8_layers
    console = Console(record=True, width=200)
    table.render(again, console)
    text = console.export_text()
    assert "fp8 layers (fp8-tensorwise, predicted for H100)" in text and "0 of 5 Linear layers in fp8" in text
    report = write_report(again, tmp_path).read_text()
    assert "## fp8 layers: fp8-tensorwise" in report and fp8_markdown(plan) in report


def test_rows_fold_repeated_blocks_and_say_why_a_layer_stays_bf16() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(3)], torch.nn.Linear(4096, 10))
    plan = fp8_layer_plan(model, (torch.empty(8192, 4096, device="meta"), None), gpu="H100")
    rows = fp8_rows(plan)
    assert [r[0] for r in rows] == ["*", "3"] and [r[1] for r in rows] == ["3", "1"]
    assert rows[0][-1] == "fp8" and rows[1][-1] == "bf16: 4096x10: fp8 kernels need multiples of 16"
    assert all(len(r) == len(HEADERS) for r in rows)
    assert rows[0][3] == f"{plan.layers[0].cost.bf16_s * 1e6:,.1f}" and rows[0][6] == f"{plan.layers[0].cost.speedup:.2f}x"


def test_fp8_is_left_out_of_the_default_bench_on_a_gpu_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from ampkit.bench._defaults import default_precisions

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    chosen, left_out = default_precisions(torch.device("cuda", 0))
    names = {p.name for p in chosen}
    assert "bf16-mixed" in names and not {"fp8-tensorwise", "fp8-rowwise"} & names
    assert "--compile" in left_out["fp8-tensorwise"] and "--compile" in left_out["fp8-rowwise"]


def test_a_model_fake_tensors_cannot_run_is_benched_without_a_plan(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The plan needs a forward on fake tensors; a model whose shapes depend on its data (a boolean mask) cannot give
    one. The fp8 run goes on with the policy's own filter, and the log says so."""
    import dataclasses
    import logging

    monkeypatch.setitem(POLICIES, "fp8-tensorwise", EmulatedTensorwise)

    class MaskedRows(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x[x.sum(1) > -1e9])  # rows kept by a mask: a shape only real values know

    from ampkit.workloads._workload import Workload

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(3)]  # every row kept
    w = Workload(name="masked", model=MaskedRows(), train_batches=batches, items_per_batch=8, steps=3, warmup=1)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        result = run_bench(dataclasses.replace(w), ["32-true", "fp8-tensorwise"], "cpu", rounds=1, count_flops=False)
    assert result.run("fp8-tensorwise").status == "ok" and result.fp8_layers == {}
    assert "could not plan fp8-tensorwise's layers" in caplog.text
