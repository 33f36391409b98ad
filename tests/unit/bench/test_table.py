"""Tests for the terminal table: its content, the optional columns, failed and diverged rows, both layouts."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from ampkit.bench._format import MISSING
from ampkit.bench._results import BenchResult, RunResult
from ampkit.bench._table import build_table, render, table_rows, verdict_lines


def _render(result: BenchResult, width: int = 300, **kwargs: object) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    render(result, console, **kwargs)  # type: ignore[arg-type]
    return console.file.getvalue()  # type: ignore[attr-defined]


def _error(result: BenchResult, precision: str) -> str:
    """The first line of a run's error: what the table shows."""
    run = result.run(precision)
    assert run is not None and run.error
    return run.error.splitlines()[0]


def _row(result: BenchResult, precision: str) -> dict[str, str]:
    rows = table_rows(result)
    return dict(zip(rows.headers, rows.rows[[r.precision for r in result.runs].index(precision)]))


def test_every_run_appears_in_order_with_its_status(bench_result: BenchResult) -> None:
    text = _render(bench_result)
    positions = [text.index(f" {r.precision} ") for r in bench_result.runs]
    assert positions == sorted(positions)
    for status in ("ok", "diverged", "failed"):
        assert status in text


def test_figures_of_a_good_run(bench_result: BenchResult) -> None:
    row = _row(bench_result, "bf16-mixed")
    assert row["Step time (p10–p90)"] == "12.5 ms (12.1–13.9)"
    assert row["Throughput"] == "10.2k samples/s"
    assert row["Speed-up vs 32-true"] == "1.60x"
    assert row["Peak memory"] == "19.0 MiB"
    assert row["Activations"] == "3.00 MiB"
    assert row["Peak RSS"] == "330 MiB"
    assert row["Memory saved"] == "13.6%"
    assert row["Eval accuracy"] == "0.9583"
    assert row["FLOP/s"] == "192 GFLOP/s"
    assert row["MFU"] == "1.2%"
    scaled = _row(bench_result, "16-mixed")
    assert (scaled["Skipped steps"], scaled["Loss scale"]) == ("3", "32768")


def test_failed_run_shows_its_error_and_dashes_elsewhere(bench_result: BenchResult) -> None:
    error = _error(bench_result, "bf16-true")
    row = _row(bench_result, "bf16-true")
    assert row["Status"] == "failed"
    assert row["Notes"] == error == "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'"  # first line only: the traceback stays in report.md
    figures = {k: v for k, v in row.items() if k not in ("Precision", "Status", "Notes")}
    assert set(figures.values()) == {MISSING}
    assert error in _render(bench_result)
    assert "Traceback" not in _render(bench_result).split("32-true: the fp32 reference")[0]


def test_partial_figures_of_a_failed_run_are_not_shown(bench_result: BenchResult) -> None:
    # FLOPs are counted before training; a run that then fails must not look half-measured.
    failed = bench_result.run("bf16-true")
    assert failed is not None
    failed.flops_per_step, failed.achieved_flops, failed.skipped_steps = 1e9, 5e10, 2
    row = _row(bench_result, "bf16-true")
    assert (row["FLOP/s"], row["Skipped steps"]) == (MISSING, MISSING)


def test_diverged_run_is_highlighted_and_says_where(bench_result: BenchResult) -> None:
    row = _row(bench_result, "16-true")
    assert row["Notes"] == "loss not finite from step 31"
    assert row["Final loss"] == MISSING
    assert row["Eval accuracy"] == "0.1 worse"  # an old results.json: only within_tolerance False is known
    table = build_table(bench_result)
    styles = {r.precision: row.style for r, row in zip(bench_result.runs, table.rows)}
    assert styles["16-true"] == "red"
    assert styles["32-true"] is None


def test_optional_columns_absent_when_no_run_has_them(throughput_result: BenchResult) -> None:
    headers = table_rows(throughput_result).headers
    assert not [h for h in headers if h.startswith("Eval") or h in ("Peak RSS", "MFU")]
    text = _render(throughput_result)
    assert "1.92M tokens/s" in text
    assert _error(throughput_result, "16-mixed") in text and "unsupported" in text


def test_optional_columns_present_when_one_run_has_them(bench_result: BenchResult) -> None:
    headers = table_rows(bench_result).headers
    assert {"Peak RSS", "MFU", "Eval accuracy", "Notes"} <= set(headers)


def test_verdicts_and_tolerance_below_the_table(bench_result: BenchResult) -> None:
    text = _render(bench_result)
    table_end = text.index("└")
    for run in bench_result.runs:
        assert run.verdict is not None and text.index(run.verdict) > table_end
    assert "Eval tolerance: accuracy within 0.02 of 32-true." in text


def test_verdict_lines_fill_in_missing_verdicts() -> None:
    runs = [
        RunResult(precision="32-true", verdict="the fp32 reference"),
        RunResult(precision="bf16-mixed"),
        RunResult(precision="16-mixed", status="unsupported", error="needs CUDA\nmore detail"),
    ]
    assert verdict_lines(BenchResult(workload="w", runs=runs)) == [
        "32-true: the fp32 reference",
        "bf16-mixed: ok, no verdict",
        "16-mixed: unsupported: needs CUDA",
    ]


def test_narrow_console_turns_the_table_on_its_side(bench_result: BenchResult) -> None:
    text = _render(bench_result, width=100)
    header = next(line for line in text.splitlines() if "32-true" in line)
    assert all(r.precision in header for r in bench_result.runs)  # one column per run
    assert "Speed-up vs" in text and "RuntimeError:" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    wide = _render(bench_result, width=100, transpose=False)  # forced: still renders, squeezed
    assert "32-true" in wide


def test_result_read_back_from_json(bench_result: BenchResult) -> None:
    # results.json turns NaN into null: the table must take None where it had NaN.
    text = _render(BenchResult.from_dict(bench_result.to_dict()))
    assert "loss not finite from step 31" in text


def test_empty_result_renders_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        text = _render(BenchResult(workload="nothing"))
    assert "ampkit bench: nothing" in text
    assert "no runs" in caplog.text


def test_the_eval_loss_column_reads_eval_loss() -> None:
    runs = [RunResult(precision="32-true", eval_metric_name="eval_loss", eval_metric=0.01989),
            RunResult(precision="bf16-mixed", eval_metric_name="eval_loss", eval_metric=0.02209)]
    assert "Eval loss" in table_rows(BenchResult(workload="w", runs=runs)).headers
    assert "Eval eval_loss" not in _render(BenchResult(workload="w", runs=runs))


def test_eval_marks_and_verdict_words_are_printed_with_their_one_definition(bench_result: BenchResult) -> None:
    from ampkit.bench._quality import QUALITY
    from ampkit.bench._verdict import VERDICTS

    mixed, scaled = bench_result.run("bf16-mixed"), bench_result.run("16-mixed")
    assert mixed is not None and scaled is not None
    mixed.quality, mixed.outcome = "better", "pays"
    scaled.quality, scaled.outcome, scaled.within_tolerance = "unclear", "inconclusive", None
    bench_result.eval_noise = "Eval noise: ±0.0213 (2.78 standard errors of 32-true's accuracy over 5 eval batches, each scored alone)"
    assert (_row(bench_result, "bf16-mixed")["Eval accuracy"], _row(bench_result, "16-mixed")["Eval accuracy"]) == ("0.9583 better", "0.9583 unclear")
    text = " ".join(_render(bench_result).split())  # the terminal wraps long lines
    assert bench_result.eval_noise in text
    for word in ("pays", "inconclusive"):
        assert f"{word}: {VERDICTS[word]}." in text
    for mark in ("better", "unclear", "worse"):  # 16-true's accuracy is worse (within_tolerance False)
        assert f"{mark} (after an eval figure): {QUALITY[mark]}." in text
    assert f"does not pay: {VERDICTS['does not pay']}" not in text  # only the words this result uses
    assert text.index("What the words mean:") > text.index("Eval tolerance:")


def test_a_gpu_run_without_mfu_says_why_in_its_row(bench_result: BenchResult) -> None:
    why = "MFU n/a: no dense peak is known for 'NVIDIA Future GPU' (ampkit/policy/_gpu_specs.py lists the GPUs it knows)"
    run = bench_result.run("16-mixed")
    assert run is not None
    run.mfu, run.mfu_note = None, why
    row = _row(bench_result, "16-mixed")
    assert row["MFU"] == "n/a" and row["Notes"] == why
    assert why in _render(bench_result)


def test_an_mfu_above_100_percent_is_never_printed_as_measured(bench_result: BenchResult) -> None:
    # A results.json written before the check (the first H200 run's bf16-true row held 2.735) reads back as is.
    run = bench_result.run("bf16-mixed")
    assert run is not None
    run.mfu = 2.735
    row = _row(bench_result, "bf16-mixed")
    assert row["MFU"] == "n/a" and "274%" not in row["MFU"]
    assert row["Notes"].startswith("MFU n/a: 274% recorded") and "wrong peak or FLOP count" in row["Notes"]
    assert "274%" not in _render(bench_result).split("Notes")[0]


def test_the_memory_and_mfu_figures_are_defined_under_the_table(bench_result: BenchResult, throughput_result: BenchResult) -> None:
    text = _render(bench_result)
    assert "Peak memory: the most bytes of live tensors" in text and "ampkit memory's peak" in text
    assert "Activations: saved for backward by one micro-batch" in text
    assert "MFU: the time the step's useful FLOPs" in text and "dense peak for the format each ran in" in text
    throughput_result.device = {"type": "cuda", "name": "NVIDIA H200"}
    text = _render(throughput_result)
    assert "Peak memory: torch.cuda.max_memory_allocated" in text and "MFU:" not in text  # no run has an MFU there
