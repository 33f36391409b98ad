"""AmpkitPrecision under Lightning's DDP and FSDP2 (ModelParallelStrategy) on two gloo ranks, started by Lightning's
own launcher: an overflow on one rank's gradients makes every rank skip the same step, and the ranks' weights stay
equal, even when each rank initialised its model on its own (the plugin gives the masters rank 0's weights)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("ranks_script.py")


def _run(policy: str, strategy: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), policy, strategy, str(tmp_path)], capture_output=True, text=True, timeout=240)


def _ranks(policy: str, strategy: str, tmp_path: Path) -> list[dict]:
    run = _run(policy, strategy, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("policy", ["16-mixed", "16-true-masters"])
def test_ddp_ranks_skip_together_and_stay_equal(policy: str, tmp_path: Path) -> None:
    ranks = _ranks(policy, "ddp_spawn", tmp_path)
    for rank in ranks:
        assert rank["skipped"] == 1 and rank["scale"] == 2.0**15 and rank["steps"] == 4
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert ranks[0]["dtype"] == ("torch.float16" if "true" in policy else "torch.float32")


def test_fsdp2_ranks_skip_together(tmp_path: Path) -> None:
    ranks = _ranks("16-mixed", "fsdp2", tmp_path)
    for rank in ranks:
        assert rank["skipped"] == 1 and rank["scale"] == 2.0**15 and rank["steps"] == 4
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_fsdp2_with_16_bit_storage_is_refused_naming_fsdps_own_mixed_precision(tmp_path: Path) -> None:
    run = _run("bf16-true-masters", "fsdp2", tmp_path)
    assert run.returncode != 0 and "fsdp_mixed_precision()" in run.stderr
