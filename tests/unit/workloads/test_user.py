"""The --model/--data contract: factories that work, and every way one can be wrong, each with one clear error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from ampkit.workloads._user import (
    EvalLoss,
    default_loss,
    load_factory,
    spec_parts,
    user_workload,
)
from ampkit.workloads._workload import Accuracy, Workload

MODULE = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from ampkit.bench import Accuracy
from ampkit.workloads._user import BenchData

g = torch.Generator().manual_seed(0)
X, Y = torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)

def model():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

def wrong_model():
    return "not a module"

def broken_model():
    raise RuntimeError("weights file missing")

def mismatched_model():
    return nn.Linear(5, 3)

def batches():
    return [(X[i:i + 16], Y[i:i + 16]) for i in range(0, 64, 16)]

def loader():
    return DataLoader(TensorDataset(X, Y), batch_size=8)

def regression():
    return [(X[:16], torch.randn(16, 3, generator=g))]

def full():
    return BenchData(train=batches(), eval=batches()[:1], metric=Accuracy, items_per_batch=16)

def eval_no_metric():
    return BenchData(train=batches(), eval=batches()[:2])

def bad_batches():
    return [X[:16]]

def not_batches():
    return 42

NOT_CALLABLE = 3
"""


@pytest.fixture
def user_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "bench_user_mod.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "bench_user_mod"


def _w(model: str | None, data: str | None, base: Workload | None = None) -> Workload:
    return user_workload(model, data, steps=6, warmup=2, base=base)


def test_plain_batches_make_a_workload(user_pkg: str) -> None:
    w = _w(f"{user_pkg}:model", f"{user_pkg}:batches")
    assert w.name == f"{user_pkg}:model" and len(w.train_batches) == 4  # a bare nn.Sequential: named by its factory and w.items_per_batch == 16
    assert w.metric is None and w.loss_fn is default_loss and w.extra["parameters"] == 6 * 16 + 16 + 16 * 3 + 3


def test_your_model_and_data_train_with_fused_adamw_at_1e_3_clipped_to_norm_1_as_the_bench_guide_says(user_pkg: str) -> None:
    w = _w(f"{user_pkg}:model", f"{user_pkg}:batches")
    opt = w.optimizer(w.model.parameters())
    assert type(opt) is torch.optim.AdamW and w.clip_grad_norm == 1.0 and w.lr is None  # --lr, --clip: unset
    assert {k: opt.defaults[k] for k in ("lr", "weight_decay", "fused")} == {"lr": 1e-3, "weight_decay": 0.01, "fused": True}


def test_a_dataloader_is_read_up_to_the_step_count(user_pkg: str) -> None:
    w = _w(f"{user_pkg}:model", f"{user_pkg}:loader")
    assert len(w.train_batches) == 6 and w.items_per_batch == 8


def test_bench_data_carries_metric_and_eval_batches(user_pkg: str) -> None:
    w = _w(f"{user_pkg}:model", f"{user_pkg}:full")
    assert w.metric is Accuracy and len(w.eval_batches) == 1


def test_eval_batches_without_a_metric_are_scored_by_their_loss(user_pkg: str) -> None:
    w = _w(f"{user_pkg}:model", f"{user_pkg}:eval_no_metric")
    metric = w.metric()
    assert isinstance(metric, EvalLoss)
    _, y = w.eval_batches[0]
    out = torch.zeros(len(y), 3)
    metric.update(out, y)
    metric.update(out, y)
    assert metric.compute()["eval_loss"] == pytest.approx(torch.log(torch.tensor(3.0)).item())


def test_default_loss_follows_the_targets_dtype() -> None:
    out = torch.randn(4, 3)
    assert torch.equal(default_loss(out, torch.tensor([0, 1, 2, 0])), torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 0])))
    target = torch.randn(4, 3)
    assert torch.equal(default_loss(out, target), torch.nn.functional.mse_loss(out, target))


def test_floating_targets_train_by_mse(user_pkg: str) -> None:
    w = _w(f"{user_pkg}:model", f"{user_pkg}:regression")
    x, y = w.train_batches[0]
    assert y.is_floating_point() and w.loss_fn(w.model(x), y).item() > 0


def test_a_file_path_factory_works(tmp_path: Path) -> None:
    path = tmp_path / "my_model.py"
    path.write_text("from torch import nn\ndef build():\n    return nn.Linear(2, 2)\n")
    assert isinstance(load_factory(f"{path}:build", "--model")(), torch.nn.Linear)


def test_model_alone_trains_on_a_builtin_workloads_data(user_pkg: str) -> None:
    g = torch.Generator().manual_seed(1)
    base = Workload(name="toy", model=torch.nn.Linear(6, 3), train_batches=[(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))],
                    items_per_batch=8, steps=5, warmup=1)
    w = user_workload(f"{user_pkg}:model", None, steps=5, warmup=1, base=base)
    assert w.name == f"{user_pkg}:model on toy" and w.train_batches is base.train_batches and w.model is not base.model
    assert w.optimizer is base.optimizer and w.clip_grad_norm == base.clip_grad_norm  # the workload's own, as docs/guides/bench.md says


@pytest.mark.parametrize(
    ("model", "data", "message"),
    [
        ("nocolon", "m:batches", "not a factory reference; write it as pkg.module:function"),
        ("no_such_module_xyz:model", "m:batches", "importing no_such_module_xyz failed .*ModuleNotFoundError"),
        ("{m}:nope", "{m}:batches", "has no attribute 'nope'"),
        ("{m}:NOT_CALLABLE", "{m}:batches", "is a int, not a callable"),
        ("{m}:wrong_model", "{m}:batches", "returned str; it must return a torch.nn.Module"),
        ("{m}:broken_model", "{m}:batches", r"calling broken_model\(\) failed \(RuntimeError: weights file missing\)"),
        ("{m}:mismatched_model", "{m}:batches", "fails on the first batch"),
        ("{m}:model", "{m}:bad_batches", "batch 0 is Tensor; each batch must be an \\(inputs, targets\\) pair"),
        ("{m}:model", "{m}:not_batches", "returned int; return a list"),
        (None, "{m}:batches", "needs --model"),
        ("{m}:model", None, "--model without --data needs a built-in --workload"),
        ("/no/such/file.py:build", "{m}:batches", "no file"),
    ],
)
def test_each_mistake_gets_one_clear_error(user_pkg: str, model: str | None, data: str | None, message: str) -> None:
    fill = lambda s: None if s is None else s.format(m=user_pkg)
    with pytest.raises(ValueError, match=message) as info:
        _w(fill(model), fill(data))
    assert "\n" not in str(info.value)


def test_spec_parts_rejects_empty_halves() -> None:
    for bad in (":f", "mod:", "mod:not-an-id"):
        with pytest.raises(ValueError, match="pkg.module:function"):
            spec_parts(bad)
