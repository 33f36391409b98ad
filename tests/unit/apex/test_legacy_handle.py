"""Apex's pre-2019 handle API: ``amp_handle = amp.init()`` and ``with amp_handle.scale_loss(loss, optimizer)``."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit.apex import amp


class Tagger(nn.Module):
    """An LSTM and a GRU over a sequence, as the RNN models of Apex's era were built."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 16, batch_first=True)
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(self.lstm(x)[0])[0]).squeeze(-1)


def _data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        x = torch.randn(8, 10, 6, generator=g)
        out.append((x, x[..., :2].sum(-1).cumsum(-1) / 4))  # a running sum: needs the recurrence
    return out


def _train(model: nn.Module, data, amp_handle) -> list[float]:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x).float(), y)
        with amp_handle.scale_loss(loss, opt) as scaled_loss:  # the script as written for Apex
            scaled_loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture
def one_thread():
    # Small RNN steps on two intra-op threads spend most of their time waiting on each other when the cores
    # are shared; one thread keeps this test at about a second. The numbers do not depend on it.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_legacy_handle_trains_an_rnn_to_its_fp32_loss_level(one_thread):
    torch.manual_seed(0)
    model = Tagger()
    control = copy.deepcopy(model)
    data = _data(60)
    fp32 = _train(control, data, amp.init(enabled=False))  # Apex's switch: a handle that does nothing
    amp_handle = amp.init()
    try:
        mixed = _train(model, data, amp_handle)
        assert model.lstm(torch.randn(1, 3, 6))[0].dtype == torch.bfloat16  # it did run in 16 bits
    finally:
        amp_handle._deactivate()
    first, last_fp32, last_mixed = fp32[0], sum(fp32[-10:]) / 10, sum(mixed[-10:]) / 10
    assert last_fp32 < 0.2 * first  # the task is learnt
    assert abs(last_mixed - last_fp32) < 0.25 * last_fp32, (last_mixed, last_fp32)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_legacy_scale_loss_skips_the_step_after_an_overflow_and_backs_off():
    w = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.5)
    handle = amp.init()
    try:
        with handle.scale_loss((w * float("inf")).sum(), opt) as scaled:
            scaled.backward()
        opt.step()
        assert torch.equal(w.detach(), torch.ones(3))  # skipped
        assert handle._scaler.get_scale() == 2.0**16 * 0.5
        opt.zero_grad()
        with handle.scale_loss((w * 2).sum(), opt) as scaled:
            scaled.backward()
        assert torch.equal(w.grad, torch.full((3,), 2.0))  # unscaled on exit
        opt.step()
    finally:
        handle._deactivate()
    assert torch.equal(w.detach(), torch.ones(3) - 0.5 * 2.0)  # the next step ran, with the class's step
    assert "step" not in opt.__dict__


def test_legacy_static_loss_scale():
    w = nn.Parameter(torch.ones(2))
    handle = amp.init(loss_scale=128.0)
    try:
        with handle.scale_loss(w.sum(), torch.optim.SGD([w], lr=0.1)) as scaled:
            assert float(scaled.detach()) == 2.0 * 128
            scaled.backward()
    finally:
        handle._deactivate()
    assert torch.equal(w.grad, torch.ones(2))


def test_bad_loss_scale_is_refused_before_anything_changes():
    with pytest.raises(ValueError, match="loss_scale must be 'dynamic' or a positive number"):
        amp.init(loss_scale="static")
    assert not torch.is_autocast_enabled("cpu")
