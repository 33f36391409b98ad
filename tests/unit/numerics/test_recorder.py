"""The module recorder: the loss's own gradient (the backward's seed) is no module's output gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.numerics._recorder import ModuleRecorder


class WithCriterion(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.criterion(self.fc(x), y)


def test_the_seed_reaching_the_loss_is_left_out_and_every_other_gradient_kept() -> None:
    x, y, scale = torch.randn(8, 4), torch.randint(0, 3, (8,)), 2.0**20
    net = WithCriterion()
    with ModuleRecorder(net) as rec:
        loss = net(x, y)
        rec.backward_from(loss)
        (loss * scale).backward()  # as a loss scaler does: the gradient reaching the loss is the scale
    stats = rec.summaries()
    assert "output_grads" not in stats["criterion"] and "output_grads" not in stats[""]
    # The control: the fc output's gradient of the same scaled backward, in plain torch.
    control = WithCriterion()
    logits = control.fc(x)
    logits.retain_grad()
    (control.criterion(logits, y) * scale).backward()
    assert stats["fc"]["output_grads"].max_abs == pytest.approx(float(logits.grad.abs().max()), rel=1e-6)


def test_a_one_element_output_of_the_model_is_its_loss() -> None:
    class OwnLoss(nn.Module):  # a Hugging Face model given labels: {"loss", "logits"}
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = self.fc(x)
            return {"loss": nn.functional.cross_entropy(logits, y), "logits": logits}

    torch.manual_seed(0)
    net, x, y = OwnLoss(), torch.randn(8, 4), torch.randint(0, 3, (8,))
    with ModuleRecorder(net) as rec:
        out = net(x, y)
        (out["loss"] * 2.0**20).backward()
    root = rec.summaries()[""]["output_grads"]
    out = net(x, y)
    out["logits"].retain_grad()
    (out["loss"] * 2.0**20).backward()
    # The logits' gradient only: the loss's own, 2^20, is no value the model computed.
    assert root.count == 8 * 3 and root.max_abs == pytest.approx(float(out["logits"].grad.abs().max()), rel=1e-6)
