"""A realistic profile.json dict for the tests of the profile's views (terminal table, report.md, plots)."""

from __future__ import annotations

from typing import Any

import pytest

_PHASES = ("data", "copy", "forward", "backward", "optimizer", "other")


def _per_step(steps: int) -> list[dict[str, float]]:
    """Steps whose data wait varies (a slow dataset), the compute nearly constant; each total is its phases' sum."""
    rows = []
    for i in range(steps):
        row = {"data": 0.110 + 0.004 * (i % 5), "copy": 0.0004, "forward": 0.020 + 0.001 * (i % 2), "backward": 0.030,
               "optimizer": 0.006, "other": 0.002}  # fmt: skip
        row["total"] = sum(row.values())
        rows.append(row)
    return rows


def make_profile(steps: int = 12) -> dict[str, Any]:
    """profile.json as `ampkit profile` writes it for a CPU run with a slow dataset and a per-step ``.item()``."""
    per_step = _per_step(steps)
    totals = sorted(r["total"] for r in per_step)
    median = totals[len(totals) // 2]
    medians = {p: sorted(r[p] for r in per_step)[steps // 2] for p in _PHASES}
    return {
        "ampkit_version": "0.9.0", "torch": "2.13.0+cpu", "date": "2026-11-24T15:40:00Z",
        "device": "cpu", "device_name": "AMD EPYC 9R14 (2 cores)",
        "command": "ampkit profile -w digits-aug --out prof/",
        "workload": {"name": "digits-aug", "description": "digits with per-sample augmentation", "size": "small"},
        "precision": "bf16-mixed", "compile": False,
        "steps": steps,
        "step_s": {"median": median, "p10": totals[1], "p90": totals[-2]},
        "phases": {p: {"median_s": medians[p], "share": medians[p] / median} for p in _PHASES},
        "per_step": per_step,
        "device_idle": None,
        "syncs": {"per_step": 2.0, "sites": [
            {"where": "sched.py:17 in step", "op": "_local_scalar_dense", "count": 12, "per_step": 1.0, "code": "lr = float(warm[step])"},
            {"where": "train.py:42 in train", "op": "item", "count": 12, "per_step": 1.0, "code": "print(loss.item())"},
        ]},
        "ops": {"cast_share": 0.08, "casts_per_step": 124, "optimizer_ops_per_step": 15, "optimizer_share": 0.05},
        "overhead": {"plain_step_s": 0.170, "profiled_step_s": 0.182, "sync_step_s": 0.204, "trace_step_s": 0.340, "ratio": 1.07},
        "trials": [
            {"name": "as given", "settings": {"num_workers": 0, "pin_memory": False}, "step_s": 0.180, "median_step_s": 0.178,
             "epoch_start_s": 0.121, "speedup": 1.0, "phases": {"data": 0.12}, "baseline": True},
            {"name": "num_workers=2", "settings": {"num_workers": 2, "pin_memory": False}, "step_s": 0.081, "median_step_s": 0.062,
             "epoch_start_s": 0.31, "speedup": 2.22, "phases": {"data": 0.021}, "baseline": False},
            {"name": "num_workers=2, persistent_workers", "settings": {"num_workers": 2, "persistent_workers": True},
             "step_s": 0.075, "speedup": 2.40, "phases": None, "baseline": False},
        ],
        "advice": [
            {"topic": "input pipeline", "finding": "66% of the step waits for data",
             "change": "DataLoader(num_workers=2, persistent_workers=True)", "measured": "2.40x faster step (0.180 s -> 0.075 s)",
             "confirm": None},
            {"topic": "host syncs", "finding": "1 read-back per step at train.py:42 (print(loss.item()))",
             "change": "accumulate the loss on the device and read it every N steps", "measured": None, "confirm": None},
            {"topic": "casts", "finding": "8% of forward + backward is casts", "change": "compile, or bf16-true weights",
             "measured": None, "confirm": "ampkit bench --precision bf16-mixed,bf16-true --compile"},
        ],
        "trace": "trace.json",
    }  # fmt: skip


@pytest.fixture
def profile_data() -> dict[str, Any]:
    """A fresh copy each test, so a test may delete or change sections."""
    return make_profile()
