"""Tests for the doctor's terminal table: order, the figures in each cell, summary lines, narrow terminals."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from rich.console import Console

from ampkit.numerics._stats import StatsAccumulator
from ampkit.numerics._table import (
    comparison_lines,
    fmt_share,
    module_rows,
    recommendation_lines,
    render,
    scaled_underflow_share,
)

HEAD = "head|out_proj"  # the doctor_data fixture's module with a pipe in its name
WORST_FIRST = ["fc1", "act", "(model)", HEAD, "drop"]


def _render(data: dict[str, Any], width: int = 250, **kwargs: Any) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    render(data, console, **kwargs)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _row(data: dict[str, Any], name: str) -> dict[str, str]:
    rows = module_rows(data, top=None)
    return next(dict(zip(rows.headers, r)) for r in rows.rows if r[0] == name)


def test_rows_are_worst_first(doctor_data: dict[str, Any]) -> None:
    assert [r[0] for r in module_rows(doctor_data).rows] == WORST_FIRST
    text = _render(doctor_data)
    positions = [text.index(f"│ {name} ") for name in WORST_FIRST]
    assert positions == sorted(positions)


def test_severity_not_input_order_decides(doctor_data: dict[str, Any]) -> None:
    doctor_data["modules"][4]["severity"] = 9.0  # drop, last in the list, becomes the worst
    assert module_rows(doctor_data).rows[0][0] == "drop"


def test_underflow_module_shows_unscaled_and_scaled_shares(doctor_data: dict[str, Any]) -> None:
    row = _row(doctor_data, "fc1")
    # 16 of fc1's 25 exponents (-40..-25) are below 2^-24; at 2^13 only -40..-38 are.
    assert row["Grad underflow fp16"] == "64.0%"
    assert row["Grad underflow fp16 @ 2^13"] == "12.0%"
    # 12% still flush at the recommended scale and nothing more is prescribed for fc1: a finding to watch
    assert row["Problems"] == "" and row["Watch"] == "64% of gradients flush to zero in fp16"
    text = _render(doctor_data)
    assert "64.0%" in text and "12.0%" in text and "@ 2^13" in text


def test_tiny_shares_are_not_zero(doctor_data: dict[str, Any]) -> None:
    head = next(m for m in doctor_data["modules"] if m["name"] == HEAD)
    assert head["grads"]["fp16_underflow_share"] == pytest.approx(1 / 20002)
    row = _row(doctor_data, HEAD)
    assert row["Grad underflow fp16"] == "<0.01%"
    assert row["Grad underflow fp16 @ 2^13"] == "0%"  # exactly none: not the same as a few
    assert fmt_share(3e-5) == "<0.01%" and fmt_share(0.0042) == "0.42%" and fmt_share(0.99995) == ">99.99%"
    assert "0.00%" not in _render(doctor_data)


def test_scaled_share_agrees_with_tensor_stats() -> None:
    acc = StatsAccumulator()
    acc.update(torch.tensor([2.0**e for e in range(-40, -15)] + [0.0, 1.0]))
    stats = acc.summary()
    for k in (-3, 0, 5, 13, 20):
        assert scaled_underflow_share(stats.to_dict(), k) == pytest.approx(stats.underflow_share("fp16", k))
    assert scaled_underflow_share(None, 13) is None and scaled_underflow_share(stats.to_dict(), None) is None


def test_other_cells(doctor_data: dict[str, Any]) -> None:
    act, model, head = _row(doctor_data, "act"), _row(doctor_data, "(model)"), _row(doctor_data, HEAD)
    assert act["Act. overflow fp16"] == "50.0%"  # two of its four outputs are above 65504
    assert head["Act. overflow fp16"] == "50.0%"  # max of inputs (act's outputs) and outputs
    assert act["Grad underflow fp16"] == "—"  # no parameters, no gradients
    assert head["Grad cosine (recommended)"] == "0.999987" and head["Grad error (recommended)"] == "1.3e-05"
    assert model["Type"] == "TinyNet" and model["Grad range (bits)"] == "42.0"
    assert _row(doctor_data, "drop")["Grad rel. error fp16 / bf16"] == "— / —"


def test_top_limits_rows_and_says_how_many_more(doctor_data: dict[str, Any]) -> None:
    text = _render(doctor_data, top=2)
    assert "... 3 more in doctor.json" in text
    assert "│ fc1 " in text and "│ act " in text and "│ drop " not in text
    assert "more in doctor.json" not in _render(doctor_data)


def test_summary_lines(doctor_data: dict[str, Any]) -> None:
    lines = recommendation_lines(doctor_data)
    assert lines[:3] == [
        "Recommended precision: 16-mixed",
        "  - no native bf16 on this device",
        "  - fp16 is safe with a loss scale and act in fp32",
    ]
    assert lines[3] == "Loss scale 2^13 (8192): 0.32% of gradient values below 2^-24 unscaled, 0.06% at 2^13."
    assert lines[4:] == ["Keep in fp32: act", f"Paste: {doctor_data['engine_code']}"]
    text = _render(doctor_data, width=80)
    assert f"Paste: {doctor_data['engine_code']}" in text  # never wrapped, even at 80 columns: it is for pasting
    assert "Loss scale 2^13 (8192): 0.32% of gradient values below 2^-24" in text
    lines = comparison_lines(doctor_data)
    assert lines[0] == (
        f"default (16-mixed): non-finite, first in the forward pass at act; 3 modules diverge: act, {HEAD}, (model)"
    )
    assert lines[1] == "recommended (16-mixed): finite, loss 2.31 vs fp32 2.3; 0 modules diverge"
    doctor_data.update(loss_scale_log2=30, recommended_loss_scale=2.0**30)
    assert "Loss scale 2^30 (1.07e+09):" in _render(doctor_data)


def test_bf16_recommendation_says_the_scale_is_for_fp16(doctor_data: dict[str, Any]) -> None:
    doctor_data["recommended_precision"] = "bf16-mixed"
    doctor_data["target"] = "bf16-mixed"
    lines = recommendation_lines(doctor_data)
    assert lines[0] == "Recommended precision: bf16-mixed (tailored for bf16-mixed)"
    assert any(line.endswith("(only fp16 needs a loss scale)") for line in lines)


def test_missing_comparisons_and_stats_are_dashes(doctor_data: dict[str, Any]) -> None:
    doctor_data["comparisons"] = []
    for module in doctor_data["modules"]:
        module.update(grads=None, inputs=None, outputs=None)
    rows = module_rows(doctor_data)
    assert all(cell in ("—", "— / —") for row in rows.rows for cell in row[2:9])
    text = _render(doctor_data)
    assert "Comparisons" not in text and "fc1" in text


def test_minimal_dict_renders() -> None:
    text = _render({"modules": [{"name": "", "type": "Net"}]})
    assert text.startswith("ampkit doctor\n") and "(model)" in text and "Keep in fp32: nothing" in text


def test_narrow_terminal_drops_columns_instead_of_truncating(doctor_data: dict[str, Any]) -> None:
    text = _render(doctor_data, width=80)
    assert "columns left out to fit the terminal" in text
    assert "…" not in text  # every cell shown is whole
    assert "64.0%" in text and "12.0%" in text  # the underflow columns are the last to go
    assert "left out" not in _render(doctor_data, width=250)


def test_module_names_are_not_rich_markup(doctor_data: dict[str, Any]) -> None:
    doctor_data["modules"][1]["name"] = "[bold]fc1[/bold]"
    assert "[bold]fc1[/bold]" in _render(doctor_data)


def test_a_module_the_recommendation_prescribes_nothing_for_is_watched_not_a_problem(doctor_data: dict[str, Any]) -> None:
    modules = {m["name"]: m for m in doctor_data["modules"]}
    modules["act"]["problems"] = ["outputs overflow fp16: 3.0% above 65504"]  # kept in fp32: a prescription
    modules["fc1"]["problems"] = ["grads: 5.0% below 2^-24 unscaled (the loss scale fixes it)", "gradient diverges from fp32"]
    act, fc1 = _row(doctor_data, "act"), _row(doctor_data, "fc1")
    assert (act["Problems"], act["Watch"]) == ("outputs overflow fp16: 3.0% above 65504", "")
    assert fc1["Problems"] == "grads: 5.0% below 2^-24 unscaled (the loss scale fixes it)"  # 16-mixed's loss scale
    assert fc1["Watch"] == "gradient diverges from fp32"  # nothing prescribed for it
    doctor_data["recommended_precision"] = "bf16-mixed"  # no loss scale: fc1's fp16 underflow is moot
    fc1 = _row(doctor_data, "fc1")
    assert fc1["Problems"] == "" and fc1["Watch"].startswith("grads: 5.0% below")
    text = _render(doctor_data)
    assert "Watch" in text and "Problems" in text


def test_a_model_from_a_framework_gets_its_scripts_lines_first_then_the_engine_line(doctor_data: dict[str, Any]) -> None:
    code = 'import lightning as L\n\ntrainer = L.Trainer(accelerator="cpu", precision="bf16-mixed")\ntrainer.fit(model)'
    lines = recommendation_lines({**doctor_data, "framework": "lightning", "framework_code": code})
    start = lines.index("Paste into your Lightning script:")
    assert lines[start + 1 : start + 5] == code.splitlines()
    assert lines[start + 5] == f"Or, in a plain PyTorch loop: {doctor_data['engine_code']}" and not any(line.startswith("Paste: ") for line in lines)
    # Without the tag (plain PyTorch, or a doctor.json written before it): the one Paste line, as before.
    assert f"Paste: {doctor_data['engine_code']}" in recommendation_lines({**doctor_data, "framework": None, "framework_code": None})
    printed = _render({**doctor_data, "framework": "lightning", "framework_code": code}, width=40)  # narrower than the code: none may wrap
    assert 'trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed")' in printed.splitlines()
