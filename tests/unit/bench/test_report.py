"""Tests for report.md: its sections, a well-formed results table, plot links, atomic writing."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from ampkit.bench._plots import write_plots
from ampkit.bench._report import REPORT_NAME, render_report, write_report
from ampkit.bench._results import BenchResult, RunResult
from ampkit.bench._table import table_rows


def _section(text: str, title: str) -> str:
    """The body of ``## title`` up to the next section."""
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _cells(line: str) -> list[str]:
    """A Markdown table row split on its unescaped pipes."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_report_has_every_part(bench_result: BenchResult, tmp_path: Path) -> None:
    text = write_report(bench_result, tmp_path).read_text(encoding="utf-8")
    assert text.startswith("# ampkit bench: digits-mlp\n")
    assert f"```sh\n{bench_result.command}\n```" in text
    head = text.split("## Results")[0]
    for fact in ("Test CPU @ 2.0GHz", "torch 2.13.0+cpu", "ampkit 0.1.0", "2026-11-22T22:00:00+00:00"):
        assert fact in head
    assert "steps `60`" in head and "warmup `10`" in head and "parameters `1,048,576`" in head
    verdicts = _section(text, "Verdicts")
    for run in bench_result.runs:
        assert f"- {run.verdict}" in verdicts
    assert "Eval tolerance: accuracy within 0.02 of 32-true." in verdicts
    method = _section(text, "How this was measured")
    for words in ("same weights", "warm-up", "interleaved in rounds", "allocator", "FlopCounterMode"):
        assert words.lower() in method.lower()


def test_results_table_matches_the_terminal_columns(bench_result: BenchResult, tmp_path: Path) -> None:
    text = write_report(bench_result, tmp_path).read_text(encoding="utf-8")
    lines = [line for line in _section(text, "Results").splitlines() if line.startswith("|")]
    expected = table_rows(bench_result)
    assert _cells(lines[0]) == expected.headers
    assert all(len(_cells(line)) == len(expected.headers) for line in lines)  # no cell broke the table
    assert set(_cells(lines[1])) == {"---", "---:"}
    by_policy = {_cells(line)[0]: _cells(line) for line in lines[2:]}
    assert list(by_policy) == [r.precision for r in bench_result.runs]
    assert by_policy["bf16-mixed"][expected.headers.index("Speed-up vs 32-true")] == "1.60x"
    assert by_policy["bf16-true"][1] == "failed"
    assert 'RuntimeError: "addmm_impl_cpu_" not implemented' in by_policy["bf16-true"][-1]


def test_the_figures_are_defined_under_the_results_table_and_in_the_method(bench_result: BenchResult) -> None:
    text = render_report(bench_result)
    results = _section(text, "Results")
    assert "Peak memory: the most bytes of live tensors" in results and "MFU: the time the step's useful FLOPs" in results
    method = _section(text, "How this was measured")
    assert "same count as `ampkit memory`'s peak" in method and "one micro-batch's" in method
    assert "(activation checkpointing) left out" in method and "dense peak for the format" in method


def test_pipes_and_newlines_in_an_error_stay_inside_their_cell(tmp_path: Path) -> None:
    run = RunResult(precision="bf16-true", status="failed", error="shape a|b mismatch")
    text = render_report(BenchResult(workload="w", runs=[run]), tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| bf16-true"))
    assert _cells(row)[-1] == r"shape a\|b mismatch"


def test_memory_breakdown_per_policy(bench_result: BenchResult) -> None:
    memory = _section(render_report(bench_result), "Memory by part")
    lines = [line for line in memory.splitlines() if line.startswith("|")]
    assert _cells(lines[0]) == [
        "Precision", "parameters", "gradients", "optimizer state", "activations", "counted total", "peak memory"
    ]
    assert _cells(lines[2]) == ["32-true", "4.00 MiB", "4.00 MiB", "8.00 MiB", "6.00 MiB", "22.0 MiB", "22.0 MiB"]
    assert "bf16-true" not in memory  # a failed run has no memory to show


def test_full_error_text_is_kept(bench_result: BenchResult) -> None:
    errors = _section(render_report(bench_result), "Errors in full")
    assert "**bf16-true** (failed)" in errors and "Traceback (most recent call last):" in errors


def test_plots_are_linked_relative_to_the_report(bench_result: BenchResult, tmp_path: Path) -> None:
    plots = write_plots(bench_result, tmp_path / "plots")
    report = write_report(bench_result, tmp_path, plots)
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text(encoding="utf-8"))
    assert links == ["plots/loss_curves.png", "plots/time_memory.png"]
    assert all((report.parent / link).is_file() for link in links)


def test_missing_plot_is_not_linked(bench_result: BenchResult, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        text = write_report(bench_result, tmp_path, [tmp_path / "gone.png"]).read_text(encoding="utf-8")
    assert "gone.png" not in text and "## Plots" not in text
    assert "gone.png" in caplog.text


def test_written_atomically_over_a_previous_report(bench_result: BenchResult, tmp_path: Path) -> None:
    (tmp_path / REPORT_NAME).write_text("old", encoding="utf-8")
    path = write_report(bench_result, tmp_path)
    assert path == tmp_path / REPORT_NAME and path.read_text(encoding="utf-8").startswith("# ampkit bench")
    assert [p.name for p in tmp_path.iterdir()] == [REPORT_NAME]  # no temporary file left behind


def test_command_with_backticks_keeps_its_code_block(tmp_path: Path) -> None:
    result = BenchResult(workload="w", command="ampkit bench --model ```odd```")
    text = render_report(result, tmp_path)
    assert "````sh\nampkit bench --model ```odd```\n````" in text


def test_throughput_only_workload(throughput_result: BenchResult, tmp_path: Path) -> None:
    text = write_report(throughput_result, tmp_path).read_text(encoding="utf-8")
    assert "Eval tolerance" not in text and "Eval " not in _section(text, "Results")
    assert "| 16-mixed | unsupported |" in text
    memory = [line for line in _section(text, "Memory by part").splitlines() if line.startswith("|")]
    assert _cells(memory[0]) == ["Precision", "peak memory"]


def test_the_verdicts_section_holds_the_eval_noise_and_the_words_defined(bench_result: BenchResult, tmp_path: Path) -> None:
    from ampkit.bench._verdict import VERDICTS

    bench_result.eval_noise = "Eval noise: not measured (1 eval batch scored alone; it takes 2 or more)."
    bench_result.runs[1].outcome = "pays"
    verdicts = _section(write_report(bench_result, tmp_path).read_text(encoding="utf-8"), "Verdicts")
    assert bench_result.eval_noise in verdicts
    assert "**What the words mean:**" in verdicts and f"- pays: {VERDICTS['pays']}." in verdicts
    assert "- worse (after an eval figure): " in verdicts  # 16-true's accuracy, worse than 32-true's
