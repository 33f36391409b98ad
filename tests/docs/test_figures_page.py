"""docs/reference/figures.md names every verdict word and table column the tools print, with their printed meanings.

The words, columns and definitions are read from the code: its constants (``VERDICTS``, ``QUALITY``, ``COLUMNS``,
``PHASE_MEANINGS``, the ``report.md`` texts, the thresholds) and the headers of the tables it builds (bench, doctor,
profile and tune's row builders; memory's table as it is printed). A word or column the code gains fails here until
the page defines it; a definition the code rewords fails until the page quotes the new text (the page is compared
with whitespace collapsed, so its line breaks are free). Where the code has no constant (profile's advice topics, the
doctor's finding sentences, tune's machine line) the page is written from the code by hand and this test does not
check it.
"""

from __future__ import annotations

import io
import re
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from rich.table import Table

from ampkit.bench import _quality, _speedup, _verdict
from ampkit.bench._fp8_table import HEADERS as FP8_HEADERS
from ampkit.bench._report import METHOD
from ampkit.bench._results import STATUSES, BenchResult, RunResult
from ampkit.bench._table import definitions, table_rows
from ampkit.cli._memory import _table as memory_table
from ampkit.memory._estimate import MemoryEstimate
from ampkit.memory._fit import Fit
from ampkit.numerics import _update_audit, _update_remedy
from ampkit.numerics._fp8_table import headroom_rows
from ampkit.numerics._report import HOW_TO_READ as DOCTOR_HOW_TO_READ
from ampkit.numerics._table import module_rows
from ampkit.profile import _advice
from ampkit.profile._report import HOW_TO_READ as PROFILE_HOW_TO_READ
from ampkit.profile._table import PHASE_MEANINGS, phase_rows, sync_rows, trial_rows
from ampkit.tuning import _machine
from ampkit.tuning._report import COLUMNS as TUNE_COLUMNS, HEADERS as TUNE_HEADERS, PLOTS as TUNE_PLOTS, VERDICTS as TUNE_VERDICTS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "figures.md"


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def section(page: str, tool: str) -> str:
    """The page's ``## `ampkit <tool>``` section: a word must be defined where its tool is."""
    match = re.search(rf"^## `ampkit {tool}`$(.*?)(?=^## |\Z)", page, re.MULTILINE | re.DOTALL)
    assert match, f"docs/reference/figures.md has no '## `ampkit {tool}`' section"
    return match.group(1)


def undefined(text: str, terms: list[str]) -> list[str]:
    """The ``terms`` that ``text`` does not show as a code span (``` `term` ```), the way the page names each entry."""
    return [t for t in terms if f"`{t}`" not in text]


def unquoted(text: str, definitions: dict[str, str] | list[str]) -> list[str]:
    """The definitions (or the keys of those) that ``text`` does not quote word for word, whitespace aside."""
    flat = _flat(text)
    items = definitions.items() if isinstance(definitions, dict) else ((d, d) for d in definitions)
    return [key for key, meaning in items if _flat(meaning) not in flat]


def unstated(text: str, module: types.ModuleType, names: list[str]) -> list[str]:
    """The constants of ``module`` whose name and value the page's threshold tables do not state as `` `NAME` | value``."""
    return [n for n in names if not re.search(rf"`{n}`\s*\|\s*{re.escape(repr(getattr(module, n)))}\s*\|", text)]


# ampkit bench


def _bench_result(device: str) -> BenchResult:
    # Every optional column switched on: a compiled twin, peak RSS, MFU, notes, eval metrics that disagree by name.
    runs = [RunResult(precision="32-true", eval_metric_name="accuracy", peak_rss_bytes=1, mfu=0.5, error="boom"),
            RunResult(precision="bf16-mixed", compile="model", eval_metric_name="perplexity")]
    return BenchResult(workload="w", runs=runs, device={"type": device})


def test_bench_verdict_words_and_marks_with_their_printed_meanings(page: str) -> None:
    bench = section(page, "bench")
    assert undefined(bench, [*_verdict.VERDICTS, *_quality.QUALITY, *STATUSES]) == []
    assert unquoted(bench, _verdict.VERDICTS) == []
    assert unquoted(bench, _quality.QUALITY) == []


def test_bench_columns_and_the_definitions_printed_under_them(page: str) -> None:
    bench = section(page, "bench")
    for device in ("cpu", "cuda"):
        result = _bench_result(device)
        assert undefined(bench, table_rows(result).headers) == [], device
        assert unquoted(bench, definitions(result)) == [], device
    assert unquoted(bench, [METHOD]) == []
    assert undefined(bench, list(FP8_HEADERS)) == []


def test_bench_thresholds_are_stated_with_their_values(page: str) -> None:
    bench = section(page, "bench")
    assert unstated(bench, _verdict, ["PAYS_SPEEDUP", "PAYS_MEMORY", "SAME_SPEED", "FEW_EVAL_SAMPLES"]) == []
    assert unstated(bench, _speedup, ["MIN_TIMED_STEPS", "CONFIDENCE", "RESAMPLES"]) == []


# ampkit memory


class _Recorder(Console):
    """A console that keeps what is printed: the table object (its headers) and the lines under it."""

    def __init__(self) -> None:
        super().__init__(file=io.StringIO(), width=200)
        self.printed: list[Any] = []

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.printed.extend(objects)


def _printed_memory_table() -> tuple[list[str], list[str]]:
    """The headers and the dim lines ``ampkit memory`` prints, from its own table function."""
    e = MemoryEstimate(precision="32-true", device="cpu", parameters=4, gradients=4, optimizer_state=8, master_weights=0,
                       activations=16, peak=64, batch=8, batch_size=2)
    console = _Recorder()
    memory_table([("32-true", e, Fit(2, e, None), None)], types.SimpleNamespace(name="toy", description=""), torch.device("cpu"), 1000, console)
    headers = [str(c.header) for t in console.printed if isinstance(t, Table) for c in t.columns]
    lines = [re.sub(r"\[/?dim\]", "", s) for s in console.printed if isinstance(s, str) and s.startswith("[dim]")]
    return headers, lines


def test_memory_columns_and_the_lines_printed_under_them(page: str) -> None:
    memory = section(page, "memory")
    headers, lines = _printed_memory_table()
    assert "max batch" in headers and len(lines) == 2  # the recorder saw the table and both lines
    assert undefined(memory, headers) == []
    # The budget is the run's; the page shows it as {budget}.
    assert unquoted(memory, [re.sub(r"fits in .*?\.$", "fits in {budget}.", line) for line in lines]) == []


# ampkit doctor


def test_doctor_columns_and_how_to_read_them(page: str) -> None:
    doctor = section(page, "doctor")
    headers = module_rows({"loss_scale_log2": 10, "modules": []}).headers
    # The scale is the run's: the page writes the column as `... @ 2^k`.
    assert undefined(doctor, [h.replace("2^10", "2^k") for h in headers]) == []
    assert "Grad underflow fp16 @ scaled" in module_rows({"modules": []}).headers and "`@ scaled`" in doctor
    fp8 = {"layers": [{"name": "fc", "shape": [4, 8], "problems": [], "operands": {op: {"format": "e4m3", "amax": 1.0, "flushed_share": 0.0, "rel_error": 0.0} for op in ("input", "weight", "grad_output")}}]}
    fp8_headers = headroom_rows(fp8).headers
    assert len(fp8_headers) == 9  # every operand's two columns are there to check
    assert undefined(doctor, fp8_headers) == []
    assert unquoted(doctor, [DOCTOR_HOW_TO_READ]) == []


def test_doctor_update_check_thresholds(page: str) -> None:
    doctor = section(page, "doctor")
    assert unstated(doctor, _update_audit, ["UPDATE_LOST_WARN", "UPDATE_DISCARDED_WARN", "DECAY_LOST_WARN", "PARAM_FROZEN_WARN"]) == []
    assert unstated(doctor, _update_remedy, ["RECOVERED_SHARE", "NOISE_FACTOR", "TARGETED_SHARE"]) == []
    assert undefined(doctor, [name for name, _ in _update_audit.REMEDIES]) == []
    assert [f"{name}` {cost:g}" for name, cost in _update_audit.REMEDIES if f"`{name}` {cost:g}" not in doctor] == []


# ampkit profile


def test_profile_phases_columns_and_how_to_read_them(page: str) -> None:
    profile = section(page, "profile")
    assert undefined(profile, list(PHASE_MEANINGS)) == []
    assert unquoted(profile, PHASE_MEANINGS) == []
    headers = [h.replace("\n", " ") for rows in (phase_rows({}), sync_rows({}), trial_rows({})) for h in rows.headers]
    assert undefined(profile, headers) == []
    assert unquoted(profile, [PROFILE_HOW_TO_READ]) == []
    assert unstated(profile, _advice, ["DATA_SHARE", "MIN_SPEEDUP", "CAST_SHARE", "PER_PARAMETER_OPS", "HOST_SHARE", "IDLE_SHARE"]) == []


# ampkit tune


def test_tune_columns_verdicts_and_plots_with_their_printed_meanings(page: str) -> None:
    tune = section(page, "tune")
    assert undefined(tune, [*TUNE_HEADERS, *TUNE_VERDICTS, *TUNE_PLOTS]) == []
    assert unquoted(tune, TUNE_COLUMNS) == []
    assert unquoted(tune, TUNE_VERDICTS) == []
    assert unquoted(tune, TUNE_PLOTS) == []
    assert re.search(rf"`ROUND_DRIFT` \({_machine.ROUND_DRIFT!r}\)", tune) and re.search(rf"`BUSY_CORES` \({_machine.BUSY_CORES!r}\)", tune)


# The checks themselves can fail.


def test_a_word_missing_or_reworded_is_named() -> None:
    verdicts = {"pays": "at least 5% faster", "does not pay": "no gain"}
    page = "## `ampkit bench`\n\n| `pays` | at least 5% faster |\n| `does not pay` | no gain at\n all |\n"
    assert undefined(section(page, "bench"), [*verdicts, "inconclusive"]) == ["inconclusive"]
    assert unquoted(page, verdicts) == []  # a line break inside a quote does not count as a change
    assert unquoted(page, {**verdicts, "pays": "at least 10% faster"}) == ["pays"]
    assert unstated("| `PAYS_SPEEDUP` | 1.05 | ... |", types.SimpleNamespace(PAYS_SPEEDUP=1.1), ["PAYS_SPEEDUP"]) == ["PAYS_SPEEDUP"]


def test_a_word_defined_under_another_tool_does_not_count() -> None:
    page = "## `ampkit tune`\n\n| `cut` | ... |\n\n## `ampkit bench`\n\nnothing\n"
    assert undefined(section(page, "bench"), ["cut"]) == ["cut"]
    assert undefined(section(page, "tune"), ["cut"]) == []
