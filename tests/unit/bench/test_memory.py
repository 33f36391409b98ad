"""Exact memory accounting: saved activations, training state, and the process peak RSS."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
from torch import nn

import ampkit
from ampkit.bench._memory import SavedActivations, peak_rss_bytes, reset_peak_rss, tensor_bytes, training_state_bytes

B, D_IN, D_HID = 32, 64, 256


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.ReLU(), nn.Linear(D_HID, D_IN))


def test_tensor_bytes_counts_each_storage_once() -> None:
    w = torch.zeros(100)
    assert tensor_bytes([w, w[10:], w.view(10, 10), torch.zeros(3, dtype=torch.bfloat16), "x"]) == 400 + 6


def test_fp32_mlp_saves_its_input_and_the_relu_output() -> None:
    model, x = _mlp(), torch.randn(B, D_IN)
    with SavedActivations(model) as saved:
        model(x).sum().backward()
    # Linear 1 saves x; ReLU saves its output, which Linear 2 saves too (one storage). Weights are not counted.
    assert saved.bytes == 4 * (B * D_IN + B * D_HID)


def test_bf16_autocast_halves_activations_and_counts_the_weight_casts() -> None:
    model, x = _mlp(), torch.randn(B, D_IN)
    with torch.autocast("cpu", dtype=torch.bfloat16), SavedActivations(model) as saved:
        model(x).float().sum().backward()
    activations = 2 * (B * D_IN + B * D_HID)   # bf16 copies of x and of the ReLU output
    # Linear 2 keeps its bf16 weight to compute the ReLU output's gradient; Linear 1 does not keep its own,
    # because x needs no gradient.
    weight_casts = 2 * D_IN * D_HID
    assert saved.bytes == activations + weight_casts


def test_counting_does_not_change_gradients() -> None:
    model, x = _mlp(), torch.randn(B, D_IN)
    model(x).pow(2).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with SavedActivations(model):
        model(x).pow(2).sum().backward()
    for p, g in zip(model.parameters(), expected):
        assert torch.equal(p.grad, g)


def test_training_state_of_fused_adamw_after_a_step() -> None:
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    model(torch.randn(B, D_IN)).sum().backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    state = training_state_bytes(model, [opt])
    # exp_avg and exp_avg_sq per value, plus one fp32 step counter per parameter tensor.
    assert state == {"parameters": 4 * n, "gradients": 4 * n, "optimizer_state": 8 * n + 4 * tensors, "master_weights": 0}


def test_master_weights_are_counted_beside_the_16_bit_model() -> None:
    model = _mlp()
    n = sum(p.numel() for p in model.parameters())
    engine = ampkit.Engine("bf16-true-masters")
    model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    state = training_state_bytes(model, [opt], engine.masters)
    assert state["parameters"] == 2 * n and state["gradients"] == 2 * n
    assert state["master_weights"] == 2 * 4 * n  # fp32 masters and their fp32 gradient buffers


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Requires: Linux /proc (VmHWM, clear_refs)")
def test_peak_rss_rises_with_a_large_allocation_and_resets_after() -> None:
    assert reset_peak_rss()
    before = peak_rss_bytes()
    assert before is not None
    big = torch.ones(64 * 1024 * 1024, dtype=torch.float32)  # 256 MiB, touched
    after = peak_rss_bytes()
    assert after is not None and after - before >= 200 * 1024 * 1024
    del big
    assert reset_peak_rss()
    assert peak_rss_bytes() < after - 200 * 1024 * 1024


@pytest.fixture
def memory_prediction(load_script: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("memory_prediction", monkeypatch)


def test_memory_prediction_smoke_prints_the_table_last_and_writes_the_rows(memory_prediction, tmp_path, capsys) -> None:
    out = tmp_path / "rows.json"
    assert memory_prediction.main(["--smoke", "--workloads", "digits", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert lines[-len(table):] == table and len(table) == 2 + 2  # header, rule, 32-true, bf16-mixed: nothing after
    data = json.loads(out.read_text())
    assert [(r["workload"], r["policy"]) for r in data["rows"]] == [("digits", "32-true"), ("digits", "bf16-mixed")]
    for r in data["rows"]:  # the CPU's estimate is exact: the control is the measured step
        assert r["total_estimate"] == r["total_measure"] and r["peak_estimate"] == r["peak_measure"]
        assert r["allocator_peak"] is None


def test_memory_prediction_reports_rows_past_its_time_limit_as_skipped(memory_prediction, tmp_path, capsys) -> None:
    out = tmp_path / "rows.json"
    assert memory_prediction.main(["--smoke", "--workloads", "digits,gpt", "--time-limit", "0", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["workload"], r["policy"], r["status"]) for r in rows] == [
        (w, p, "skipped") for w in ("digits", "gpt") for p in ("32-true", "bf16-mixed")
    ]
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 4 and all("not started: the script's time limit" in line for line in table[1:])
