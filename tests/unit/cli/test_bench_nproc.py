"""``ampkit bench --nproc 2``: torchrun starts two gloo workers that train every policy under DDP.

Strong scaling keeps the loss curve: each rank trains half of every batch and DDP averages the gradients, so
the 32-true losses must be the single-process ones. The model is a BatchNorm-free MLP on the digits data:
with BatchNorm each rank normalises over its own half (as in any DDP run without SyncBatchNorm), which moves
the digits CNN's losses by 2e-4 to 2e-2 relative: a property of the model, not of the plumbing under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

MODEL = """
import torch
from torch import nn

def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
"""

ARGS = ["-w", "digits", "--steps", "6", "--warmup", "2", "--rounds", "1", "--precision", "32-true,bf16-mixed", "--no-progress"]


@pytest.fixture
def model_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("sklearn", reason="Requires: scikit-learn (pip install -e '.[bench]')")
    (tmp_path / "nproc_toy.py").write_text(textwrap.dedent(MODEL))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


# CI time (2026-11-28): slow tier. CI checks the relaunch under torchrun (tests/unit/distributed/test_launch.py) and
# the engine under DDP against one process (tests/unit/distributed/test_engine_ddp.py); this runs the whole command.
@pytest.mark.slow
def test_two_processes_train_under_ddp_and_match_one_process(model_module: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(model_module), os.environ.get("PYTHONPATH", "")])}
    env.pop("OMP_NUM_THREADS", None)
    cmd = [sys.executable, "-m", "ampkit", "bench", "--nproc", "2", *ARGS, "--model", "nproc_toy:mlp", "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("Precision") == 1  # rank 0 alone prints the table (one header)
    assert "ChildFailedError" not in done.stderr

    data = json.loads((out / "results.json").read_text())
    assert data["settings"]["nproc"] == 2 and data["settings"]["strategy"] == "ddp"
    assert data["command"].startswith("ampkit bench --nproc 2 ")
    assert data["device"]["threads"] == max(1, len(os.sched_getaffinity(0)) // 2)  # workers share the cores
    runs = {r["precision"]: r for r in data["runs"]}
    assert [r["status"] for r in runs.values()] == ["ok", "ok"], [r["error"] for r in runs.values()]
    for run in runs.values():
        assert len(run["losses"]) == 6 and run["timed_steps"] == 4 and run["throughput"] > 0
        assert run["eval_metric"] is not None and run["peak_memory_bytes"] > 0

    # The control: the same workload and steps in this process, no process group.
    from ampkit.bench._runner import run_bench
    from ampkit.workloads import get_workload
    from ampkit.workloads._user import user_workload

    workload = user_workload("nproc_toy:mlp", None, steps=6, warmup=2, base=get_workload("digits", size="small", seed=0))
    workload.steps, workload.warmup = 6, 2  # what the CLI does: the base workload's own steps are 150
    single = run_bench(workload, ["32-true"], "cpu", rounds=1).runs[0]
    assert single.status == "ok"
    ddp = runs["32-true"]["losses"]
    assert len(ddp) == len(single.losses) == 6
    for step, (a, b) in enumerate(zip(ddp, single.losses)):
        assert abs(a - b) <= 1e-4 * abs(b), (step, a, b)
    # Each rank counts the FLOPs of its half of the rows: their sum is the step's, the single process's count.
    assert runs["32-true"]["flops_per_step"] == single.flops_per_step > 0
    assert runs["32-true"]["flops_by_format"] == single.flops_by_format == {"fp32": single.flops_per_step}


def test_a_batch_that_does_not_split_is_refused_before_anything_starts(cli_error: Callable[[list[str]], str]) -> None:
    pytest.importorskip("sklearn", reason="Requires: scikit-learn (pip install -e '.[bench]')")
    err = cli_error(["bench", "--nproc", "3", "-w", "digits", "--size", "tiny"])  # batch 32
    assert "--nproc 3" in err and "32 rows" in err and "--nproc 2, 4, 8, 16" in err


def test_more_processes_than_gpus_is_refused(cli_error: Callable[[list[str]], str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    err = cli_error(["bench", "--nproc", "4", "--device", "cuda"])
    assert "needs 4 GPUs but 1 is visible" in err and "--nproc 1" in err and "--device cpu" in err
    assert "cuda:LOCAL_RANK" in cli_error(["bench", "--nproc", "2", "--device", "cuda:1"])


FAILING = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            raise RuntimeError("no bf16 kernel in this model")
        return self.body(x)

def model():
    torch.manual_seed(0)
    return Net()

def data():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(4)]
"""


@pytest.mark.slow  # a second torchrun start (~8 s on 2 cores); the first test covers the plumbing
def test_a_run_failing_on_every_rank_is_a_row_and_exit_code_1_without_torchruns_report(tmp_path: Path) -> None:
    (tmp_path / "nproc_failing.py").write_text(textwrap.dedent(FAILING))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "ampkit", "bench", "--nproc", "2", "--model", "nproc_failing:model", "--data", "nproc_failing:data",
           "--precision", "bf16", "--steps", "5", "--warmup", "1", "--rounds", "2", "--no-progress", "--out", str(tmp_path / "out")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ChildFailedError" not in done.stderr and "Traceback" not in done.stderr
    runs = {r["precision"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["runs"]}
    assert runs["32-true"]["status"] == "ok" and runs["bf16-mixed"]["status"] == "failed"
    assert "no bf16 kernel" in runs["bf16-mixed"]["error"]


@pytest.mark.slow  # every default policy on two torchrun workers, bf16-true-sr's step compiled on each (~2 min on 2 cores)
def test_the_default_policies_all_run_on_two_processes(tmp_path: Path) -> None:
    # A default run never fails on its own choice: stochastic rounding, in the CPU's default list, runs under DDP.
    pytest.importorskip("sklearn", reason="Requires: scikit-learn (pip install -e '.[bench]')")
    from ampkit.bench._defaults import default_precisions

    env = {**os.environ}
    env.pop("OMP_NUM_THREADS", None)
    cmd = [sys.executable, "-m", "ampkit", "bench", "--nproc", "2", "-w", "digits", "--size", "tiny", "--steps", "3", "--warmup", "1",
           "--rounds", "1", "--no-progress", "--out", str(tmp_path / "out")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = {r["precision"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["runs"]}
    assert list(runs) == [p.name for p in default_precisions(torch.device("cpu"))[0]]
    assert {name: run["error"] for name, run in runs.items() if run["status"] != "ok"} == {}

