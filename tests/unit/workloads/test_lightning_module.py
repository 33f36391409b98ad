"""A LightningModule through the tools: its training_step is the loss (checked against the step called by hand on the
same batches and weights), its own loaders the data, its configure_optimizers the optimizer; self.log is silent."""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import pytest
import torch
from torch import nn

lightning = pytest.importorskip("lightning.pytorch")

from ampkit.bench import bench_model
from ampkit.workloads._lightning_module import first_optimizer, lightning_inputs
from ampkit.workloads._lightning_step import step_batch, step_module
from ampkit.workloads._user import workload_from


def _batches(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


class Classifier(lightning.LightningModule):
    """Logs in training_step (outside a Trainer Lightning warns there), has its own loaders and an SGD with momentum."""

    def __init__(self, validation_loss: bool = True, scheduler: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.validation_loss = validation_loss
        self.scheduler = scheduler
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        self.log_dict({"lr": 0.1})
        self.calls.append(batch_idx)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        x, y = batch
        loss = 2 * nn.functional.cross_entropy(self(x), y)  # twice: a figure training_step's loss cannot be
        self.log("val_loss", loss)
        return loss if self.validation_loss else None

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        if not self.scheduler:
            return optimizer
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.0 if step == 0 else 1.0)  # sets lr 0 at once
        return {"optimizer": optimizer, "lr_scheduler": warmup}

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*map(torch.cat, zip(*_batches(6), strict=True))), batch_size=8)

    def val_dataloader(self) -> Any:
        return _batches(2, seed=1)


def _by_hand(module: Classifier, batches: list[Any]) -> list[float]:
    """The control: training_step called on each batch of a copy, with configure_optimizers' optimizer, no clipping."""
    twin = copy.deepcopy(module)
    optimizer = twin.configure_optimizers()
    losses = []
    for i, batch in enumerate(batches):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its self.log, outside a Trainer
            loss = twin.training_step(batch, i)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return losses


def _quiet_step(module: Classifier, batch: Any, index: int) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(module(x), y)  # training_step's loss, without its self.log (which warns here)


def test_the_losses_under_32_true_equal_the_training_steps_own_on_the_same_batches_and_weights() -> None:
    module = Classifier()
    result = bench_model(module, None, "32-true", steps=6, warmup=1, rounds=1, device="cpu", clip_grad_norm=None)
    (run,) = result.runs
    assert run.status == "ok" and len(run.losses) == 6
    control = _by_hand(module, _batches(6))  # the module's own loader yields these batches, in this order
    assert run.losses == control  # bit for bit: the same step, optimizer and order
    assert control[-1] < control[0]  # it trained: SGD with momentum moved the weights
    assert result.workload == "Classifier" and result.workload_info["framework"] == "lightning"
    assert "its own train_dataloader() and val_dataloader()" in result.workload_info["data"]


def test_eval_batches_are_scored_by_validation_step_when_it_returns_a_loss_else_by_training_step() -> None:
    for validation_loss, factor in ((True, 2.0), (False, 1.0)):
        module = Classifier(validation_loss=validation_loss)
        workload = workload_from(module, None, steps=2, warmup=1)
        model = copy.deepcopy(workload.model).eval()
        metric = workload.metric()
        with torch.no_grad():
            for batch in workload.eval_batches:
                metric.update(model(**batch), None)
        expected = sum(factor * _quiet_step(module, b, 0).item() for b in _batches(2, seed=1)) / 2
        assert metric.compute()["eval_loss"] == pytest.approx(expected, rel=1e-6)


def test_the_step_copy_keeps_the_users_names_and_leaves_the_users_module_as_it_was() -> None:
    module = Classifier()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    step = step_module(module)
    assert type(step).__name__ == "Classifier" and isinstance(step, Classifier)
    assert list(step.state_dict()) == list(module.state_dict()) == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    bench_model(module, None, "bf16", steps=3, warmup=1, rounds=1, device="cpu")
    assert type(module) is Classifier and "log" not in vars(module)  # its own class and its own log
    assert all(torch.equal(module.state_dict()[k], v) for k, v in before.items())  # the policies trained copies
    with pytest.warns(UserWarning, match="self.log"):  # the user's module still logs as Lightning does outside a Trainer
        module.training_step(_batches(1)[0], 0)


def test_a_step_batch_runs_the_step_with_its_index_and_any_other_call_is_the_forward() -> None:
    step = step_module(Classifier())
    x, y = _batches(1)[0]
    loss = step(**step_batch((x, y), 4))
    assert loss.ndim == 0 and step.calls == [4]
    assert step(x).shape == (8, 3)  # self(x), as training_step calls it


def test_the_optimizer_is_configure_optimizers_first_rebuilt_at_the_lr_it_was_configured_with(caplog: pytest.LogCaptureFixture) -> None:
    module = Classifier(scheduler=True)
    with caplog.at_level(logging.INFO, logger="ampkit"):
        workload = workload_from(module, _batches(2), steps=2, warmup=1)
    twin = copy.deepcopy(workload.model)
    optimizer = workload.optimizer(twin.parameters())
    assert type(optimizer) is torch.optim.SGD and optimizer.param_groups[0]["lr"] == 0.1 and optimizer.param_groups[0]["momentum"] == 0.9
    warned = [r for r in caplog.records if "LR scheduler" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING and "(lr 0.1)" in warned[0].getMessage()
    assert [p is q for p, q in zip(optimizer.param_groups[0]["params"], twin.parameters(), strict=True)] == [True] * 4


def test_every_form_configure_optimizers_returns_gives_its_first_optimizer() -> None:
    opt = torch.optim.AdamW(nn.Linear(2, 2).parameters())
    assert first_optimizer(opt) == (opt, False)
    assert first_optimizer([opt]) == (opt, False)
    assert first_optimizer(([opt], [object()])) == (opt, True)
    assert first_optimizer([{"optimizer": opt, "lr_scheduler": object()}]) == (opt, True)
    assert first_optimizer(None) == (None, False)


class _Manual(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class _NoLoader(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(6, 3)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"loss": nn.functional.cross_entropy(self.net(batch[0]), batch[1])}


def test_what_the_tools_cannot_train_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="automatic_optimization is False, so training_step steps its own optimizers"):
        lightning_inputs(_Manual(), None, count=1, where="--model m:manual", data_where="--data")
    with pytest.raises(ValueError, match=r"^--model m:f defines no train_dataloader\(\); pass --data pkg.module:factory returning its LightningDataModule"):
        lightning_inputs(_NoLoader(), None, count=1, where="--model m:f", data_where="--data")


def test_a_dict_loss_and_the_default_optimizer_without_configure_optimizers() -> None:
    workload = workload_from(_NoLoader(), _batches(3), steps=3, warmup=1)
    assert workload.optimizer.__name__ == "default_optimizer"
    with torch.no_grad():
        assert workload.model(**workload.train_batches[0]).ndim == 0


def test_a_lightning_datamodule_gives_the_data() -> None:
    class Data(lightning.LightningDataModule):
        def setup(self, stage: str) -> None:
            self.ready = stage

        def train_dataloader(self) -> Any:
            return _batches(3, seed=int(self.ready == "fit"))

    workload = workload_from(_NoLoader(), Data(), steps=3, warmup=1, data_spec="dm:build")
    assert torch.equal(workload.train_batches[2]["ampkit_batch"][0], _batches(3, seed=1)[2][0])
    assert "the Data (a LightningDataModule)" in workload.description


class _Submodule(Classifier):
    """A step that calls its layers directly (self.net(x)), never its own forward, as many LightningModules do."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x).float(), y)


def test_a_16_bit_policy_casts_the_batch_of_a_step_that_bypasses_forward() -> None:
    """The step is the module's call: a *-true policy casts the batch into it, as Lightning's bf16-true casts a
    Trainer's batch. The control: the same net, bf16 weights and batches by hand, with the same optimizer."""
    module = _Submodule()
    result = bench_model(module, None, "bf16-true", steps=6, warmup=1, rounds=1, device="cpu", clip_grad_norm=None)
    (run,) = [r for r in result.runs if r.precision == "bf16-true"]
    assert run.status == "ok", run.error
    twin = copy.deepcopy(module.net).bfloat16()
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    control = []
    for x, y in _batches(6):
        loss = nn.functional.cross_entropy(twin(x.bfloat16()).float(), y)
        control.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert run.losses == control
