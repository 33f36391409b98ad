"""``amp._amp_state`` as Apex-era scripts and Apex's own tests touch it, each checked against a plain fp32 run.

The model multiplies elementwise (as Apex's own amp tests do), which autocast leaves alone, and every loss scale
is a power of two: an amp run then equals its fp32 control exactly, so any scale not removed again would show.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit.apex import amp
from ampkit.apex._state import _amp_state


class Mul(nn.Module):
    def __init__(self, weight_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight0 = nn.Parameter(torch.arange(1.0, 5.0))
        self.weight1 = nn.Parameter(torch.arange(2.0, 6.0).to(weight_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.weight0 * self.weight1.float()).sum()


X = torch.tensor([0.5, -1.0, 0.25, 2.0])


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.125, momentum=0.5)


def amp_step(model: nn.Module, opt: torch.optim.Optimizer, loss_id: int = 0, inf: bool = False) -> float:
    """One step through amp; returns scaled loss / loss, i.e. the scale the step used."""
    opt.zero_grad()
    loss = model(X) * (float("inf") if inf else 1.0)
    with amp.scale_loss(loss, opt, loss_id=loss_id) as scaled:
        scaled.backward()
    opt.step()
    return float("inf") if inf else (scaled / loss).item()


def plain_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(X).backward()
    opt.step()


def assert_same(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)


# ------------------------------------------------------------------------------------------- _loss_scale
@pytest.mark.parametrize("opt_level", ["O0", "O1", "O3"])
def test_setting_loss_scale_takes_effect_on_the_next_scale_loss(opt_level):
    control = Mul()
    model = copy.deepcopy(control)
    model, opt = amp.initialize(model, sgd(model), opt_level=opt_level, verbosity=0, cast_model_type=False if opt_level == "O3" else None)
    control_opt = sgd(control)
    # BERT-era scripts: `_amp_state.loss_scalers[0]._loss_scale = 2**20`. Under O0/O3 (static 1.0, where Apex
    # skipped scaling) the new scale is used too: Apex read it afresh on every scale_loss.
    _amp_state.loss_scalers[0]._loss_scale = 2.0**20
    assert _amp_state.loss_scalers[0]._loss_scale == 2.0**20 == _amp_state.loss_scalers[0].loss_scale()
    used = []
    for _ in range(3):
        used.append(amp_step(model, opt))
        plain_step(control, control_opt)
    assert used == [2.0**20] * 3
    assert_same(model, control)  # every gradient was unscaled again
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 2.0**20


def test_setting_loss_scale_and_unskipped_round_trip_through_state_dict():
    model = Mul()
    model, opt = amp.initialize(model, sgd(model), opt_level="O1", verbosity=0)
    amp_step(model, opt)
    _amp_state.loss_scalers[0]._loss_scale = 512.0
    _amp_state.loss_scalers[0]._unskipped = 7  # what Apex's own load_state_dict assigns
    state = amp.state_dict()
    assert state["loss_scaler0"] == {"loss_scale": 512.0, "unskipped": 7}
    other = Mul()
    other, other_opt = amp.initialize(other, sgd(other), opt_level="O1", verbosity=0)
    amp.load_state_dict(state)
    assert (_amp_state.loss_scalers[0]._loss_scale, _amp_state.loss_scalers[0]._unskipped) == (512.0, 7)
    assert amp_step(other, other_opt) == 512.0 and _amp_state.loss_scalers[0]._unskipped == 8


def test_a_bad_loss_scale_is_refused():
    model = Mul()
    amp.initialize(model, sgd(model), opt_level="O1", verbosity=0)
    for bad in (0.0, -4.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="_loss_scale must be a positive finite number"):
            _amp_state.loss_scalers[0]._loss_scale = bad
    assert _amp_state.loss_scalers[0]._loss_scale == 2.0**16


# ------------------------------------------------------------------------------- allow_incoming_model_not_fp32
def test_apex_flags_exist_before_initialize():
    assert _amp_state.allow_incoming_model_not_fp32 is False and _amp_state.hard_override is False


@pytest.mark.parametrize(("opt_level", "kw"), [("O1", {}), ("O2", {"cast_model_type": False}), ("O0", {"cast_model_type": False})])
def test_allow_incoming_model_not_fp32(opt_level, kw):
    # Apex's own amp tests build models holding a 16-bit parameter and set the flag around initialize.
    control = Mul(torch.bfloat16)
    model = copy.deepcopy(control)
    with pytest.raises(RuntimeError, match=r"'weight1' is torch.bfloat16, expected torch.float32"):
        amp.initialize(model, sgd(model), opt_level=opt_level, verbosity=0, **kw)
    _amp_state.allow_incoming_model_not_fp32 = True
    model, opt = amp.initialize(model, sgd(model), opt_level=opt_level, verbosity=0, **kw)
    _amp_state.allow_incoming_model_not_fp32 = False
    assert model.weight1.dtype == torch.bfloat16  # left as it came
    control_opt = sgd(control)
    for _ in range(3):
        amp_step(model, opt)
        plain_step(control, control_opt)
    assert_same(model, control)


# ------------------------------------------------------------------------------------ a second initialize
def test_a_second_initialize_replaces_the_loss_scalers_and_the_first_optimizers_keep_working(capsys):
    controls = [Mul(), Mul()]
    a, b = (copy.deepcopy(c) for c in controls)
    a, opt_a = amp.initialize(a, sgd(a), opt_level="O1", verbosity=1)
    amp_step(a, opt_a)
    _amp_state.loss_scalers[0]._loss_scale = 2.0**10
    first = _amp_state.loss_scalers
    b, opt_b = amp.initialize(b, sgd(b), opt_level="O1", num_losses=2, verbosity=1)
    # Apex kept one global list and a second initialize replaced it with fresh scalers (num_losses of them).
    second = _amp_state.loss_scalers
    assert second is not first and len(first) == 1 and first[0]._loss_scale == 2.0**10
    assert [s.loss_scale() for s in second] == [2.0**16, 2.0**16]
    # The first call's optimizer goes on with scale_loss, on the current scalers.
    assert amp_step(a, opt_a, loss_id=1) == 2.0**16
    capsys.readouterr()
    amp_step(a, opt_a, loss_id=1, inf=True)  # an overflow: the step is skipped, that scaler backs off
    assert "Skipping step, loss scaler 1 reducing loss scale to 32768.0" in capsys.readouterr().out
    assert [s.loss_scale() for s in second] == [2.0**16, 2.0**15]
    assert amp_step(b, opt_b) == 2.0**16
    opts = [sgd(c) for c in controls]
    for _ in range(2):
        plain_step(controls[0], opts[0])
    plain_step(controls[1], opts[1])
    assert_same(a, controls[0])
    assert_same(b, controls[1])
    assert list(amp.state_dict()) == ["loss_scaler0", "loss_scaler1"]
