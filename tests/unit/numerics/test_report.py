"""Tests for the doctor's report.md: what ran, the recommendation, comparisons, tables that survive odd names."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from ampkit.numerics._plots import GRADIENT_PLOT, MODULE_PLOT, write_plots
from ampkit.numerics._report import REPORT_NAME, REPORT_TOP, md_escape, render_report, write_report

_CELL_SEPARATOR = re.compile(r"(?<!\\)\|")  # a pipe that is not escaped


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _tables(text: str) -> list[list[str]]:
    """Every Markdown table in ``text``, as its lines."""
    tables: list[list[str]] = []
    previous = False
    for line in text.splitlines():
        is_row = line.startswith("|")
        if is_row and not previous:
            tables.append([])
        if is_row:
            tables[-1].append(line)
        previous = is_row
    return tables


def test_report_says_what_ran(doctor_data: dict[str, Any], tmp_path: Path) -> None:
    path = write_report(doctor_data, tmp_path / "out")
    assert path == tmp_path / "out" / REPORT_NAME
    text = path.read_text()
    assert text.splitlines()[0] == "# ampkit doctor: tiny-net (size tiny)"
    assert "Four layers with known numerics." in text
    assert "```sh\nampkit doctor tiny --steps 4\n```" in text
    head = text[: text.index("## Recommendation")]
    for fact in ("cpu", "torch 2.13.0+cpu", "ampkit 0.1.0", "2026-11-23T10:00:00+00:00", "4 fp32 steps"):
        assert fact in head
    assert [p.name for p in (tmp_path / "out").iterdir()] == [REPORT_NAME]  # no temporary file left behind


def test_recommendation(doctor_data: dict[str, Any]) -> None:
    section = _section(render_report(doctor_data), "Recommendation")
    assert "**Precision: `16-mixed`** (chosen by the doctor)" in section
    assert "- no native bf16 on this device" in section
    assert f"```python\n{doctor_data['engine_code']}\n```" in section
    assert "Loss scale 2^13 (8192): 0.32% of gradient values below 2^-24 unscaled, 0.06% at 2^13." in section
    assert "| weight gradients | 0.32% | 0.06% |" in section
    assert "- **act** (Exp): outputs overflow fp16 (max 2e+05)" in section  # kept, and why


def test_report_links_the_plots_that_exist(doctor_data: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plots = write_plots(doctor_data, tmp_path / "plots")
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        text = write_report(doctor_data, tmp_path, plots=[*plots, tmp_path / "gone.png"]).read_text()
    assert f"](plots/{GRADIENT_PLOT})" in text and f"](plots/{MODULE_PLOT})" in text
    assert "gone.png" not in text and "gone.png" in caplog.text
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (tmp_path / link).is_file()


def test_no_plots_no_plot_section(doctor_data: dict[str, Any]) -> None:
    assert "## Plots" not in render_report(doctor_data, plots=[])


def test_comparisons(doctor_data: dict[str, Any]) -> None:
    section = _section(render_report(doctor_data), "Comparisons")
    assert "### default: `16-mixed`" in section and "### recommended: `16-mixed`" in section
    assert "- non-finite, first in the forward pass at act; 3 modules diverge" in section
    assert "- finite, loss 2.31 vs fp32 2.3; 0 modules diverge" in section
    default, recommended = _tables(section)
    # Non-finite modules first, then the lowest cosine.
    assert [row.split(" | ")[0] for row in default[2:]] == ["| act", "| head\\|out\\_proj", "| (model)", "| fc1"]
    assert [row.split(" | ")[1] for row in recommended[2:]] == ["0.999910", "0.999987", "0.999999", "1.000000"]


def test_missing_comparisons_and_stats(doctor_data: dict[str, Any]) -> None:
    doctor_data["comparisons"] = []
    doctor_data["modules"][1].update(grads=None, inputs=None, outputs=None, output_grads=None, weights=None)
    text = render_report(doctor_data)
    assert "No comparison with the fp32 reference was run." in text
    assert "| fc1 | Linear | — | — | — | — / — | — | — | — |" in text


def test_module_table_worst_first_and_escaped(doctor_data: dict[str, Any]) -> None:
    section = _section(render_report(doctor_data), "Modules")
    (table,) = _tables(section)
    names = [row.split(" | ")[0].removeprefix("| ") for row in table[2:]]
    assert names == ["fc1", "act", "(model)", "head\\|out\\_proj", "drop"]
    assert "| head\\|out\\_proj | Linear | <0.01% | 0% |" in section  # the tiny share is not 0.00%


def test_pipes_in_names_do_not_break_any_table(doctor_data: dict[str, Any]) -> None:
    doctor_data["modules"][1]["problems"] = ["a | b", "c_d_e"]
    doctor_data["keep_fp32"] = ["head|out_proj"]
    text = render_report(doctor_data)
    tables = _tables(text)
    assert len(tables) == 4  # gradient underflow, two comparisons, modules
    for table in tables:
        columns = {len(_CELL_SEPARATOR.findall(line)) for line in table}
        assert len(columns) == 1, f"rows with different column counts: {table}"
    assert "- **head\\|out\\_proj** (Linear)" in text


def test_long_module_lists_are_cut(doctor_data: dict[str, Any]) -> None:
    fc1 = doctor_data["modules"][1]
    doctor_data["modules"] = [dict(fc1, name=f"layer{i}", severity=float(i)) for i in range(REPORT_TOP + 10)]
    section = _section(render_report(doctor_data), "Modules")
    (table,) = _tables(section)
    assert len(table) == 2 + REPORT_TOP and table[2].startswith(f"| layer{REPORT_TOP + 9} |")
    assert "... 10 more in doctor.json" in section


def test_how_to_read_states_the_thresholds(doctor_data: dict[str, Any]) -> None:
    section = _section(render_report(doctor_data), "How to read this")
    for fact in ("2^-24", "2^-14", "65504", "8 bits of precision", "2^k"):
        assert fact in section


def test_md_escape() -> None:
    assert md_escape("a|b_c*d`e") == "a\\|b\\_c\\*d\\`e"
    assert md_escape("<0.01%") == "<0.01%" and md_escape("<script>") == "\\<script>"
    assert md_escape("two\nlines") == "two lines"


def test_a_model_from_a_framework_gets_its_scripts_lines_first_then_the_engine_line_in_the_report(doctor_data: dict[str, Any]) -> None:
    code = "from transformers import Trainer, TrainingArguments\n\nargs = TrainingArguments(use_cpu=True, bf16=True)"
    section = _section(render_report({**doctor_data, "framework": "transformers", "framework_code": code}), "Recommendation")
    ours, engine = f"```python\n{code}\n```", f"```python\n{doctor_data['engine_code']}\n```"
    assert "Paste into your Hugging Face Trainer script:" in section and "Or, in a plain PyTorch loop:" in section
    assert section.index(ours) < section.index(engine)
    plain = _section(render_report(doctor_data), "Recommendation")  # no tag: the Engine line alone, as before
    assert "Paste into your training script:" in plain and "```python\nimport" not in plain
