"""The bench's closing lines: for the fastest run the verdicts call ``pays``, the change to paste in the model's
framework; nothing when none pays. The verdicts come from the bench's own rule (apply_verdicts), not written here."""

from __future__ import annotations

import argparse
import ast
import io
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from ampkit.bench._advice import advice, closing_lines, paying_run
from ampkit.bench._report import render_report
from ampkit.bench._results import BenchResult, RunResult
from ampkit.bench._verdict import Tolerance, apply_verdicts
from ampkit.cli._bench import _present

ACC = Tolerance("accuracy", higher_is_better=True, tolerance=0.02, relative=False)


def _run(precision: str, median: float, compile: str | None = None, eval_metric: float = 0.9) -> RunResult:
    times = (median * (1 + 0.01 * np.linspace(-1, 1, 21))).tolist()
    return RunResult(precision=precision, compile=compile, step_time_median_s=median, step_times_s=times, peak_memory_bytes=1000, eval_metric=eval_metric)


def _result(*runs: RunResult, framework: str | None = None) -> BenchResult:
    result = BenchResult(workload="w", runs=[_run("32-true", 0.010), *runs], device={"type": "cpu", "name": "cpu"},
                         settings={"accumulate": 2, "clip_grad_norm": 1.0, "channels_last": False},
                         workload_info={"framework": framework} if framework else {})
    apply_verdicts(result, ACC)
    return result


def test_the_fastest_paying_run_is_named_with_the_recipe_every_run_shared() -> None:
    result = _result(_run("bf16-mixed", 0.005), _run("bf16-mixed", 0.004, compile="regional"), _run("bf16-true", 0.002, eval_metric=0.5))
    assert [r.outcome for r in result.runs[1:]] == ["pays", "pays", "does not pay"]  # the fastest of all loses accuracy
    run = paying_run(result)
    assert run is result.runs[2]
    lines = closing_lines(result)
    assert lines[0] == "bf16-mixed compiled (regional) pays (2.50x faster): to train with it, paste into your training script:"
    assert "engine = ampkit.Engine('bf16-mixed', accumulate=2, clip_grad_norm=1, compile='regional')" in lines
    assert "DataLoader" not in "\n".join(lines)  # the batch is the user's: only the change is printed
    assert advice(result, run).compile == "regional"


@pytest.mark.parametrize(
    ("framework", "expected"),
    [
        ("lightning", 'trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", accumulate_grad_batches=2, gradient_clip_val=1.0)'),
        ("transformers", "args = TrainingArguments(use_cpu=True, bf16=True, gradient_accumulation_steps=2, max_grad_norm=1.0)  # beside your other arguments"),
    ],
)
def test_a_model_from_a_framework_gets_the_change_in_its_terms(framework: str, expected: str) -> None:
    lines = closing_lines(_result(_run("bf16-mixed", 0.005), framework=framework))
    assert lines[0].endswith(("your Lightning script:", "your Hugging Face Trainer script:")) and expected in lines
    ast.parse("\n".join(lines[1:]))


def test_nothing_is_said_when_no_run_pays(tmp_path: Path) -> None:
    result = _result(_run("bf16-mixed", 0.0101), _run("bf16-true", 0.002, eval_metric=0.5))
    assert [r.outcome for r in result.runs[1:]] == ["does not pay", "does not pay"]  # as fast; faster but worse
    assert paying_run(result) is None and closing_lines(result) == []
    assert "## What to paste" not in render_report(result, tmp_path)


def test_the_terminal_and_the_report_end_with_the_change_to_paste(tmp_path: Path) -> None:
    result = _result(_run("bf16-mixed", 0.005), framework="lightning")
    console = Console(file=io.StringIO(), width=60)  # narrower than the lines to paste: none may be broken
    _present(result, argparse.Namespace(out=None, tensorboard=None), console)
    printed = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    lines = closing_lines(result)
    assert printed[-len(lines) :] == lines
    section = render_report(result, tmp_path).split("## What to paste\n", 1)[1]
    assert section.startswith(f"\n{lines[0]}\n\n```python\n" + "\n".join(lines[1:]) + "\n```")
