"""The framework objects through the options' rules (``choose_workload``: ``hf:PATH``, a LightningModule alone, a
Dataset with ``--batch-size``) and through the tools that take a model and batches directly (estimate, diagnose)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ampkit.workloads import choose_workload
from ampkit.workloads._choose import brings_own_data
from ampkit.workloads._framework_inputs import tool_inputs

CPU = torch.device("cpu")

USER = """
import torch
from torch import nn
import lightning.pytorch as pl

class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(6, 3)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(3)]

def lit():
    return Lit()

def rows():
    import datasets
    g = torch.Generator().manual_seed(0)
    return datasets.Dataset.from_dict({"x": torch.randn(20, 6, generator=g).tolist(), "label": torch.randint(0, 3, (20,), generator=g).tolist()})

def batches():
    return list(Lit().train_dataloader())

def linear():
    return nn.Linear(6, 3)

def digit_lit():
    lit = Lit()
    lit.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))  # forward: the digits' 8x8 images to their 10 classes
    return lit
"""


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pytest.importorskip("lightning.pytorch")
    (tmp_path / "frameworks_user.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "frameworks_user", raising=False)
    return "frameworks_user"


def test_a_lightning_module_alone_trains_on_its_own_loader(user: str) -> None:
    workload = choose_workload(model=f"{user}:lit", device=CPU, steps=3, warmup=1)
    assert workload.name == "Lit" and len(workload.train_batches) == 3 and workload.extra["framework"] == "lightning"
    assert type(workload.optimizer(workload.model.parameters())) is torch.optim.AdamW


def test_a_model_alone_is_let_through_only_when_its_module_names_lightning_and_refused_before_it_runs(user: str, tmp_path: Path) -> None:
    assert brings_own_data(f"{user}:lit") and brings_own_data("hf:anything") and brings_own_data(f"{tmp_path / 'frameworks_user.py'}:lit")
    (tmp_path / "plain_user.py").write_text("import torch\ndef net():\n    return torch.nn.Linear(2, 2)\n")
    assert not brings_own_data("plain_user:net") and not brings_own_data(None)
    with pytest.raises(ValueError, match=r"^--model without --data needs --workload NAME"):
        choose_workload(model="plain_user:net", device=CPU)
    assert "plain_user" not in sys.modules  # refused before it was imported
    # A module that names lightning but returns a plain module is imported, then refused by the same rule.
    with pytest.raises(ValueError, match="--model without --data needs a built-in --workload"):
        choose_workload(model=f"{user}:linear", device=CPU)


def test_batch_size_batches_a_dataset_and_is_refused_for_data_that_comes_in_batches(user: str) -> None:
    workload = choose_workload(model=f"{user}:linear", data=f"{user}:rows", device=CPU, batch_size=5, steps=2, warmup=1)
    assert [len(x) for x, _ in workload.train_batches] == [5, 5] and workload.items_per_batch == 5
    default = choose_workload(model=f"{user}:linear", data=f"{user}:rows", device=CPU, steps=9, warmup=1)
    assert len(default.train_batches) == 2 and default.items_per_batch == 8  # 20 rows: two whole batches of the default 8
    with pytest.raises(ValueError, match=r"^--batch-size 5 applies to a built-in workload's data \(or a datasets.Dataset\); your --data"):
        choose_workload(model=f"{user}:linear", data=f"{user}:batches", device=CPU, batch_size=5)
    with pytest.raises(ValueError, match=r"^--batch-size 5 applies .* your --model \S+:lit's train_dataloader\(\) makes its own batches"):
        choose_workload(model=f"{user}:lit", device=CPU, batch_size=5)


def test_an_hf_folder_alone_trains_on_data_made_for_it_and_records_where_it_came_from(hf_folders: dict[str, Path]) -> None:
    workload = choose_workload(model=f"hf:{hf_folders['config']}", device=CPU, steps=3, warmup=1, seed=4)
    assert workload.name == "GPT2LMHeadModel" and workload.unit == "tokens" and workload.metric is None  # random tokens: no eval
    assert workload.extra["framework"] == "transformers" and workload.extra["hf_path"] == str(hf_folders["config"])
    assert "random initialisation" in workload.extra["hf_weights"] and "(seed 4)" in workload.extra["hf_weights"]
    assert workload.extra["data"].startswith("random token ids") and "random token ids" in workload.description
    with pytest.raises(ValueError, match="is a BertForSequenceClassification: without --data"):
        choose_workload(model=f"hf:{hf_folders['bert']}", device=CPU, steps=2, warmup=1)


def test_estimate_and_diagnose_take_a_lightning_module_and_a_dataset(user: str) -> None:
    import importlib

    from ampkit.memory import estimate
    from ampkit.numerics import diagnose

    module = importlib.import_module(user)
    lit, batch = module.lit(), module.batches()[0]
    got = estimate(lit, batch, policy="bf16-mixed")
    control = estimate(module.linear(), batch, policy="bf16-mixed")  # the same network, the same cross-entropy
    assert (got.parameters, got.activations, got.total) == (control.parameters, control.activations, control.total)
    diagnosis = diagnose(lit, module.batches(), steps=2, update_steps=0, fp8_recipe=None, target="bf16-mixed")
    assert "net" in {m["name"] for m in diagnosis.to_dict()["modules"]}  # the user's own module names
    first = estimate(module.linear(), module.rows(), policy="32-true")
    assert first.batch_size == 8
    with pytest.raises(ValueError, match="a LightningModule's loss is its training_step's; drop loss_fn"):
        tool_inputs(lit, [batch], lambda out, y: out, count=1, what="estimate()")


def test_a_lightning_module_on_a_built_in_workloads_data_is_still_recorded_as_lightning(user: str) -> None:
    workload = choose_workload("digits", f"{user}:digit_lit", size="tiny", device=CPU, steps=2, warmup=1)
    assert workload.name == "Lit on digits" and workload.extra["framework"] == "lightning"
    assert workload.extra["parameters"] == 64 * 10 + 10  # its own, not the digits CNN's
