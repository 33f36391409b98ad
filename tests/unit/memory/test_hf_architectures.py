"""ampkit memory and bench's memory figures on tiny Hugging Face architectures built from configs.

Llama (grouped-query attention), Mixtral (MoE: grouped-mm experts), T5, ViT, Whisper and GPT-2 with activation
checkpointing. Every policy keeps its row; the parts (parameters, gradients, optimizer state, masters) equal
bench's to the byte; activations and peak equal bench's to the byte where the model takes the same path on fake
tensors, and otherwise exceed it by no more than the bound docs/guides/memory.md states: transformers' decoders
build their attention mask when they see fake tensors (they take them for tracing) where a batch without padding
runs causal attention unmasked, and a mask turns their grouped-query attention into k and v repeated to the
query's heads. The control for the decoders is measure(), the same step on real tensors: equal to bench's.
"""

from __future__ import annotations

import dataclasses
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from ampkit.bench import bench_model
from ampkit.cli._main import main
from ampkit.memory import measure
from ampkit.workloads._user import load_factory

pytest.importorskip("transformers", reason="Requires: transformers (pip install -e '.[hf]')")

HERE = Path(__file__).resolve().parent / "hf_tiny_models.py"
POLICIES = ("32-true", "bf16-mixed")
PARTS = ("parameters", "gradients", "optimizer_state", "master_weights")

# model -> (data, attention layers whose mask fake tensors build, query heads, kv heads, head dim); None: same path.
MODELS = {
    "llama": ("tokens", (2, 4, 2, 8)),
    "mixtral": ("tokens", (2, 4, 2, 8)),
    "gpt2_checkpointed": ("tokens", (2, 2, 2, 16)),
    "whisper": ("audio", (2, 4, 4, 8)),  # the decoder's self-attention
    "t5": ("tokens", None),
    "vit": ("images", None),
}


def mask_bound(layers: int, heads: int, kv_heads: int, head_dim: int, batch: int = 2, seq: int = 16) -> int:
    """The most bytes an estimate may count above the real step (docs/guides/memory.md): per attention layer, a
    B x T x T mask and k, v repeated from kv_heads to heads, at 4 bytes an element at most."""
    return layers * batch * seq * (seq + 2 * (heads - kv_heads) * head_dim) * 4


def _memory_rows(name: str, data: str) -> dict[str, dict]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["memory", "--model", f"{HERE}:{name}", "--data", f"{HERE}:{data}", "--device", "cpu",
                     "--precision", ",".join(POLICIES), "--json", "--no-progress"]) == 0
    return {row["precision"]: row for row in json.loads(out.getvalue())}


def _bench_runs(name: str, data: str) -> dict[str, dict]:
    """bench's runs as ``ampkit bench --model --data`` records them (its Python API: the same runner, no report files)."""
    model, batches = load_factory(f"{HERE}:{name}", "--model")(), load_factory(f"{HERE}:{data}", "--data")()
    result = bench_model(model, batches, "bf16-mixed", steps=3, warmup=2, rounds=1, device="cpu")
    return {run.precision: dataclasses.asdict(run) for run in result.runs}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_memory_rows_equal_bench_memory_on_hf_architectures(name: str) -> None:
    data, masked = MODELS[name]
    rows, runs = _memory_rows(name, data), _bench_runs(name, data)
    assert list(rows) == list(POLICIES) and all(r["method"] == "estimate" and r["note"] is None for r in rows.values())
    model, batch = load_factory(f"{HERE}:{name}", "--model")(), load_factory(f"{HERE}:{data}", "--data")().train[0]
    for policy in POLICIES:
        row, run = rows[policy], runs[policy]
        assert run["status"] == "ok"
        assert {k: row[k] for k in PARTS} == {k: run["memory_breakdown"][k] for k in PARTS}
        if policy == "bf16-mixed":  # the control (one policy: its cost is a bench run's): the same step on real tensors,
            # bench's optimizer and clip. bench keeps the first step's loss (an fp32 scalar) through the second for its
            # loss curve: 4 bytes the memory step does not hold.
            real = measure(model, batch, lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, fused=True), policy, clip_grad_norm=1.0)
            assert (run["activation_bytes"], run["peak_memory_bytes"]) == (real.activations, real.peak + 4)
        over = (row["activations"] - run["activation_bytes"], row["peak"] - (run["peak_memory_bytes"] - 4))
        if masked is None:
            assert over == (0, 0)
        else:
            assert 0 < over[0] <= mask_bound(*masked) and 0 <= over[1] <= mask_bound(*masked)


_UNESTIMABLE = '''
import torch
from torch import nn


class Router(nn.Module):
    """Keeps only the rows whose score is positive: a shape that depends on the values, which fake tensors lack."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.score, self.head = nn.Linear(8, 1), nn.Linear(8, 4)

    def forward(self, x):
        kept = x[self.score(x).squeeze(-1) > 0]
        return self.head(torch.cat([kept, x])).mean(0, keepdim=True).expand(x.shape[0], -1)


def model():
    return Router()


def data():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)) for _ in range(2)]
'''


def _unestimable(tmp_path: Path, device: str) -> tuple[int, str, list[dict]]:
    path = tmp_path / "router.py"
    path.write_text(_UNESTIMABLE)
    argv = ["memory", "--model", f"{path}:model", "--data", f"{path}:data", "--device", device, "--precision", "32-true,bf16-mixed", "--no-progress"]
    table = io.StringIO()
    with redirect_stdout(table):
        code = main(argv)
    out = io.StringIO()
    with redirect_stdout(out):
        main([*argv, "--json"])
    return code, table.getvalue(), json.loads(out.getvalue())


def test_a_row_that_cannot_be_estimated_is_measured_on_the_cpu_and_says_why(tmp_path: Path) -> None:
    code, table, rows = _unestimable(tmp_path, "cpu")
    assert code == 0 and [r["precision"] for r in rows] == ["32-true", "bf16-mixed"]
    assert all(r["method"] == "measure" and "not estimable on fake tensors" in r["note"] and "measured on cpu instead" in r["note"] for r in rows)
    assert "* 32-true: not estimable on fake tensors (" in table and "measured on cpu instead" in table
    model, batch = load_factory(f"{tmp_path / 'router.py'}:model", "--model")(), load_factory(f"{tmp_path / 'router.py'}:data", "--data")()[0]
    control = measure(model, batch, lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, fused=True), "32-true", clip_grad_norm=1.0)
    assert (rows[0]["total"], rows[0]["peak"]) == (control.total, control.peak)
    out = io.StringIO()
    with redirect_stdout(out):  # the largest-batch search runs on fake tensors: the measured row says it has none
        assert main(["memory", "--model", f"{tmp_path / 'router.py'}:model", "--data", f"{tmp_path / 'router.py'}:data", "--device", "cpu",
                     "--precision", "32-true", "--device-memory", "1MiB", "--no-progress", "--json"]) == 0
    [row] = json.loads(out.getvalue())
    assert row["max_batch_size"] is None and row["note"].endswith("instead; max batch not searched (the search runs on fake tensors)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="Requires: no CUDA (a prediction for a GPU that is not here)")
def test_a_row_that_can_be_neither_estimated_nor_measured_says_why_and_the_others_stay(tmp_path: Path) -> None:
    code, table, rows = _unestimable(tmp_path, "cuda")
    assert code == 0 and [r["precision"] for r in rows] == ["32-true", "bf16-mixed"]
    assert all(r["method"] is None and "not measured: no CUDA here" in r["note"] for r in rows)
    assert "* bf16-mixed: not estimable on fake tensors (" in table
