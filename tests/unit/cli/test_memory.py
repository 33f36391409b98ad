"""``ampkit memory`` from the command line: the JSON contract, the table, the batch search, bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from ampkit.cli._main import main
from ampkit.memory import estimate
from ampkit.workloads import get_workload

pytest.importorskip("sklearn", reason="Requires: scikit-learn (pip install -e '.[dev]')")

FIELDS = {"precision", "parameters", "gradients", "optimizer_state", "master_weights", "activations", "total"}


def test_json_has_every_field_per_policy_and_matches_the_library(capsys: pytest.CaptureFixture[str]):
    assert main(["memory", "-w", "digits", "--size", "tiny", "--device", "cpu", "--precision", "32-true,bf16-mixed", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["precision"] for r in rows] == ["32-true", "bf16-mixed"]
    for r in rows:
        assert FIELDS <= set(r) and all(isinstance(r[k], int) for k in FIELDS - {"precision"})
        assert r["total"] == sum(r[k] for k in ("parameters", "gradients", "optimizer_state", "master_weights", "activations"))
    w = get_workload("digits", size="tiny")
    direct = estimate(w.model, w.batch(0), w.optimizer, "bf16-mixed", "cpu", loss_fn=w.loss_fn, clip_grad_norm=w.clip_grad_norm)
    assert rows[1]["total"] == direct.total and rows[1]["peak"] == direct.peak
    assert rows[1]["activations"] < rows[0]["activations"]


def test_batch_size_and_device_memory(capsys: pytest.CaptureFixture[str]):
    assert main(["memory", "-w", "digits", "--size", "tiny", "--precision", "bf16", "--batch-size", "64",
                 "--device-memory", "8MiB", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["batch_size"] == 64 and row["device_memory"] == 8 * 2**20 and row["max_batch_size"] > 64


def test_table_lists_every_cpu_policy(capsys: pytest.CaptureFixture[str]):
    assert main(["memory", "-w", "digits", "--size", "tiny"]) == 0
    out = capsys.readouterr().out
    for name in ("32-true", "bf16-mixed", "16-mixed", "bf16-true-masters"):
        assert name in out
    assert "tf32" not in out  # not a CPU policy


def test_cuda_target_without_cuda_is_simulated(capsys: pytest.CaptureFixture[str]):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: nothing is simulated")
    assert main(["memory", "-w", "digits", "--size", "tiny", "--device", "cuda", "--precision", "tf32", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["device"], row["simulated_on"], row["precision"]) == ("cuda", "cpu", "tf32")


def test_simulated_cuda_says_which_attention_kernels_it_modelled(capsys: pytest.CaptureFixture[str]):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: nothing is simulated")
    argv = ["memory", "-w", "gpt", "--size", "tiny", "--device", "cuda", "--precision", "32-true,bf16-mixed"]
    assert main([*argv, "--json"]) == 0
    assert [row["attention"] for row in json.loads(capsys.readouterr().out)] == ["efficient", "flash"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())  # the note may wrap
    assert "attention: F.scaled_dot_product_attention modelled" in out and "efficient for 32-true; flash for bf16-mixed" in out
    assert main(["memory", "-w", "gpt", "--size", "tiny", "--device", "cpu", "--precision", "32-true"]) == 0
    assert "attention:" not in capsys.readouterr().out  # the CPU's own kernels: nothing modelled


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--precision", "tf32", "--device", "cpu"], "does not run on cpu"),
        (["--device", "tpu"], "cpu or cuda"),
        (["--precision", "bf17"], "bf17"),
    ],
)
def test_bad_input_exits_2_with_the_fix(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]):
    assert main(["memory", "-w", "digits", "--size", "tiny", *argv]) == 2
    assert message in capsys.readouterr().err


def test_in_a_log_the_table_keeps_every_column_whole(capsys: pytest.CaptureFixture[str], log_table: Callable[[str], Any]):
    assert main(["memory", "-w", "digits", "--size", "tiny", "--precision", "32-true,bf16-true-masters"]) == 0
    headers, body = log_table(capsys.readouterr().out)
    assert headers == ["policy", "params", "grads", "optim", "masters", "activ.", "total", "peak", "vs fp32"]
    assert [cells[0] for cells in body] == ["32-true", "bf16-true-masters"]  # one line per policy: nothing wrapped
    assert all(len(cells) == len(headers) and "…" not in "".join(cells) for cells in body)


def test_fp8_prints_the_layer_plan_for_a_gpu_and_json_carries_it(capsys: pytest.CaptureFixture[str]):
    from ampkit.memory._fp8_layers import Fp8Plan, fp8_layer_plan

    w = get_workload("gpt", "tiny")
    assert main(["memory", "-w", "gpt", "--size", "tiny", "--device", "cpu", "--precision", "32-true", "--fp8", "L4"]) == 0
    out = capsys.readouterr().out
    assert "fp8 layers (fp8-tensorwise, predicted for L4)" in out and "0 of 5 Linear layers in fp8" in out
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[fp8]')")
    # For a GPU (simulated here), the fp8 policy's entry carries its plan at the batch's rows.
    assert main(["memory", "-w", "gpt", "--size", "tiny", "--device", "cuda", "--precision", "fp8-rowwise", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)[0]
    assert Fp8Plan.from_dict(entry["fp8_layers"]) == fp8_layer_plan(w.model, w.batch(0), "fp8-rowwise")


CONV1D_USER = """
def model():
    torch.manual_seed(0)
    return nn.Sequential(Conv1D(192, 64), nn.GELU(), Conv1D(64, 192), nn.Linear(64, 128))

def data():
    return [(torch.randn(8, 32, 64), torch.randint(0, 128, (8, 32)))]
"""


def test_fp8_plans_hugging_face_conv1d_layers_and_names_them(tmp_path, hf_conv1d_source: str, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    # GPT-2's projections are Conv1D: the plan counts them among the Linear layers and says torchao leaves them in bf16.
    path = tmp_path / "gpt2_like.py"
    path.write_text(hf_conv1d_source + CONV1D_USER)
    argv = ["memory", "--model", f"{path}:model", "--data", f"{path}:data", "--precision", "32-true", "--device", "cpu", "--fp8", "H100"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())  # the summary wraps at the terminal's width
    assert "0 of 3 Linear layers in fp8" in out and "2 of the 3 layers are Hugging Face Conv1D" in out
    assert "0 (Conv1D)" in out and "2 (Conv1D)" in out and "replace each Conv1D with an nn.Linear" in out
