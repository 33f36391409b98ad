"""The legacy Apex example runs unchanged through ``python -m ampkit.apex``: it trains, O1/O2 match O0, it resumes.

Each run is a subprocess, exactly as a user would start it. Accuracy is checked against the O0 run with the
same seed (a control), not against a fixed number; resume is checked bitwise against an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("sklearn", reason="Requires: scikit-learn (pip install -e '.[examples]')")
# Five runs of the example, twelve epochs in all: the slow tier (CI time, issue 36). In CI, an Apex-surface script
# runs unchanged and trains as its O0 run does (test_legacy_apex_idioms.py), `python -m ampkit.apex` runs a legacy
# script (tests/unit/apex/test_main.py), and O0-O3, their checkpoints and a bitwise resume of amp's state are unit
# tests (tests/unit/apex).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "legacy_apex" / "main_amp.py"
# Three epochs, the LR divided by 10 for the last one: enough for ~95% top-1 on the digits validation split.
SCHEDULE = ["--lr-steps", "2", "--seed", "0", "--print-freq", "100"]
# 360 validation images: one image is 0.28 points. Seeds 0-2 put O1 and O2 within 1.4 points of O0.
TOP1_TOLERANCE = 3.0


@dataclass
class Run:
    stdout: str
    final: dict[str, str]
    summary: dict[str, Any]
    out: Path


def run_script(out: Path, *args: str) -> Run:
    env = {k: v for k, v in os.environ.items() if k not in ("AMPKIT_APEX_HALF_DTYPE", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [sys.executable, "-m", "ampkit.apex", str(SCRIPT), *SCHEDULE, "--out", str(out), *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("FINAL ")]
    final = dict(kv.split("=", 1) for kv in line.split()[1:])
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return Run(done.stdout, final, summary, out)


@pytest.fixture(scope="module")
def o0(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_script(tmp_path_factory.mktemp("o0"), "--opt-level", "O0", "--epochs", "3")


@pytest.fixture(scope="module")
def o1(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_script(tmp_path_factory.mktemp("o1"), "--opt-level", "O1", "--epochs", "3")


@pytest.fixture(scope="module")
def o2(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_script(tmp_path_factory.mktemp("o2"), "--opt-level", "O2", "--epochs", "3")


def test_o0_runs_unchanged_and_learns(o0: Run) -> None:
    assert "Selected optimization level O0" in o0.stdout
    assert o0.summary["model_dtypes"] == ["torch.float32"]
    assert [h["epoch"] for h in o0.summary["history"]] == [0, 1, 2]
    # A sanity floor (chance is 10%); O1 and O2 are compared with this run, not with a number.
    assert float(o0.final["top1"]) > 80.0
    assert o0.summary["amp"]["loss_scaler0"]["loss_scale"] == 1.0


def test_o1_bf16_matches_o0(o0: Run, o1: Run) -> None:
    assert "Selected optimization level O1" in o1.stdout
    assert "16-bit type is torch.bfloat16" in o1.stdout  # the CPU default, said aloud
    assert o1.summary["model_dtypes"] == ["torch.float32"]  # O1 keeps fp32 weights; the forward runs in bf16
    assert abs(float(o1.final["top1"]) - float(o0.final["top1"])) <= TOP1_TOLERANCE
    assert o1.summary["amp"]["loss_scaler0"]["loss_scale"] >= 1.0  # dynamic scaler alive and finite


def test_o2_bf16_matches_o0(o0: Run, o2: Run) -> None:
    assert "Selected optimization level O2" in o2.stdout
    assert re.search(r"cast_model_type\s+: torch\.bfloat16", o2.stdout)
    assert o2.summary["model_dtypes"] == ["torch.bfloat16", "torch.float32"]  # 16-bit model, fp32 BatchNorm
    assert abs(float(o2.final["top1"]) - float(o0.final["top1"])) <= TOP1_TOLERANCE


def test_o2_checkpoint_holds_fp32_masters_and_amp_state(o2: Run) -> None:
    ckpt = torch.load(o2.out / "checkpoint.pth.tar", weights_only=True)
    assert set(ckpt) == {"epoch", "arch", "state_dict", "best_prec1", "optimizer", "amp"}
    assert ckpt["epoch"] == 3
    floats = [v for v in ckpt["state_dict"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float32 for v in floats)  # exact masters, not 16-bit weights
    assert set(ckpt["amp"]["loss_scaler0"]) == {"loss_scale", "unskipped"}
    masters = ckpt["amp"]["master_weights"]
    assert torch.equal(masters["fc.weight"], ckpt["state_dict"]["fc.weight"])


def test_o2_resume_is_bitwise_equal_to_an_uninterrupted_run(o2: Run, tmp_path: Path) -> None:
    first = run_script(tmp_path, "--opt-level", "O2", "--epochs", "2")
    assert [h["epoch"] for h in first.summary["history"]] == [0, 1]
    resumed = run_script(tmp_path, "--opt-level", "O2", "--epochs", "3", "--resume", str(tmp_path / "checkpoint.pth.tar"))
    assert "=> loaded checkpoint" in resumed.stdout
    assert [h["epoch"] for h in resumed.summary["history"]] == [2]
    # The third epoch of both runs: same training loss, same metrics, same weights to the last bit.
    uninterrupted = o2.summary["history"][2]
    for key in ("train_loss", "train_top1", "val_loss", "top1", "top5", "loss_scale", "lr"):
        assert resumed.summary["history"][0][key] == uninterrupted[key], key
    assert resumed.summary["weights_sha256"] == o2.summary["weights_sha256"]
    assert resumed.final == {**o2.final, "sec_per_epoch": resumed.final["sec_per_epoch"]}
