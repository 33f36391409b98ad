"""Checkpoint and restore at O0-O3, master weights restored exactly, add_param_group mid-training, amp state."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from ampkit.apex import amp
from ampkit.apex._state import _amp_state


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def train(model: nn.Module, opt: torch.optim.Optimizer, batches, inject_at: int | None = None) -> None:
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
            if i == inject_at:
                next(model.parameters()).grad.fill_(float("inf"))
        opt.step()


def fresh(opt_level: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return amp.initialize(model, opt, opt_level=opt_level, verbosity=0)


@pytest.mark.parametrize("opt_level", ["O0", "O1", "O2", "O3"])
def test_checkpoint_and_restore_resumes_bitwise(opt_level, tmp_path):
    batches = data(10)
    model, opt = fresh(opt_level)
    # O0 and O3 scale statically and so, as in Apex, never skip: only O1/O2 get an overflow to skip.
    train(model, opt, batches[:5], inject_at=2 if opt_level in ("O1", "O2") else None)
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "amp": amp.state_dict()}
    torch.save(ckpt, tmp_path / "ckpt.pt")
    train(model, opt, batches[5:])
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    scale = amp._amp_state.loss_scalers[0].loss_scale()

    # The Apex-documented order: initialize, then load model, optimizer and amp state.
    model2, opt2 = fresh(opt_level)
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    model2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["optimizer"])
    amp.load_state_dict(loaded["amp"])
    train(model2, opt2, batches[5:])
    got = model2.state_dict()
    for k, value in expected.items():
        assert torch.equal(got[k], value), k
    assert amp._amp_state.loss_scalers[0].loss_scale() == scale


def test_o2_model_state_dict_is_the_exact_fp32_masters():
    model, opt = fresh("O2")
    train(model, opt, data(3))
    sd = model.state_dict()
    masters = amp.state_dict()["master_weights"]
    assert sd["0.weight"].dtype == torch.float32
    assert torch.equal(sd["0.weight"], masters["0.weight"])
    # ...and it is not just the 16-bit weight cast up: that is what Apex returned, and it is rounded.
    assert not torch.equal(sd["0.weight"], model[0].weight.float())


def test_o2_resume_from_rounded_weights_would_drift_but_masters_do_not(tmp_path):
    """What Apex lost: masters rebuilt from 16-bit weights diverge from the uninterrupted run."""
    batches = data(8)
    model, opt = fresh("O2")
    train(model, opt, batches[:4])
    rounded = {k: v.to(torch.bfloat16).float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    exact = copy.deepcopy(model.state_dict())
    opt_state = copy.deepcopy(opt.state_dict())
    amp_state = amp.state_dict()
    train(model, opt, batches[4:])
    expected = model.state_dict()["0.weight"].clone()

    outcomes = {}
    for name, weights in (("exact", exact), ("rounded", rounded)):
        m, o = fresh("O2")
        m.load_state_dict(weights)
        o.load_state_dict(opt_state)
        amp.load_state_dict({k: v for k, v in amp_state.items() if k != "master_weights"})
        train(m, o, batches[4:])
        outcomes[name] = torch.equal(m.state_dict()["0.weight"], expected)
    assert outcomes == {"exact": True, "rounded": False}


def test_amp_state_dict_is_apex_format_and_loads_apex_checkpoints():
    model, opt = fresh("O1")
    train(model, opt, data(3), inject_at=1)
    sd = amp.state_dict()
    assert list(sd) == ["loss_scaler0"]
    assert sd["loss_scaler0"] == {"loss_scale": 32768.0, "unskipped": 1}
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7}})
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 1024.0, "unskipped": 7}


def test_amp_load_state_dict_rejects_a_whole_checkpoint_and_warns_on_count_mismatch(capsys):
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", num_losses=2, verbosity=1)
    capsys.readouterr()
    with pytest.raises(RuntimeError, match=r"unexpected key\(s\) 'model'.*checkpoint\['amp'\]"):
        amp.load_state_dict({"model": {}, "loss_scaler0": {"loss_scale": 1.0, "unskipped": 0}})
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 8.0, "unskipped": 0}})
    assert "contains 1 loss scalers, while 2 are used" in capsys.readouterr().out
    assert amp._amp_state.loss_scalers[0].loss_scale() == 8.0


def test_state_calls_before_initialize():
    with pytest.raises(RuntimeError, match="before amp.initialize"):
        amp.state_dict()
    with pytest.raises(RuntimeError, match="initialize, then load"):
        amp.load_state_dict({})
    assert not hasattr(_amp_state, "opt_properties")


def test_amp_state_exposes_apex_attributes():
    fresh("O2")
    assert _amp_state.opt_properties.opt_level == "O2"
    assert _amp_state.loss_scalers[0]._loss_scale == 2.0**16


# -------------------------------------------------------------------------------------------- add_param_group
@pytest.mark.parametrize("opt_level", ["O0", "O1", "O2"])
def test_add_param_group_mid_training_against_fp32_control(opt_level):
    batches = data(8)

    def run(amp_level: str | None) -> nn.Module:
        model = net()
        opt = torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=0.9)
        if amp_level is not None:
            kw = {"loss_scale": "dynamic"} if amp_level == "O0" else {}
            model, opt = amp.initialize(model, opt, opt_level=amp_level, verbosity=0, **kw)
        for i, (x, y) in enumerate(batches):
            if i == 3:
                opt.add_param_group({"params": list(model[3].parameters()), "lr": 0.05})
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            if amp_level is None:
                loss.backward()
            else:
                with amp.scale_loss(loss, opt) as scaled:
                    scaled.backward()
            opt.step()
        if amp_level is not None:
            assert all(p.dtype == torch.float32 for p in amp.master_params(opt))
        return model

    control = run(None).state_dict()
    treated = run(opt_level).state_dict()
    initial = net().state_dict()
    assert not torch.equal(treated["3.weight"], initial["3.weight"])  # the added group was stepped
    for k in control:
        if opt_level == "O0":
            assert torch.equal(treated[k], control[k]), k
        else:
            assert torch.allclose(treated[k].float(), control[k].float(), rtol=5e-2, atol=2e-2), k


def test_lr_scheduler_wraps_the_patched_step():
    """A scheduler made after amp.initialize wraps amp's step: the steps still go through amp, the scheduler sees them
    and its lr is the one the fp32 masters step with. Control: the same O2 run with the lr halved by hand."""
    batches = data(4)

    def run(halve: str | None) -> list[torch.Tensor]:
        model, opt = fresh("O2")
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if halve == "scheduler" else None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch warns when the scheduler did not see optimizer.step() run
            train(model, opt, batches[:2])
            if sched is not None:
                sched.step()
            elif halve == "by hand":
                for group in opt.param_groups:
                    group["lr"] *= 0.5
            train(model, opt, batches[2:])
        assert opt.param_groups[0]["lr"] == (5e-3 if halve else 1e-2)
        # The 16-bit weights and the fp32 masters (O2's state_dict): both move only through amp's step.
        return [p.detach().clone() for p in model.parameters()] + list(model.state_dict().values())

    scheduled, control, constant = run("scheduler"), run("by hand"), run(None)
    assert all(torch.equal(a, b) for a, b in zip(scheduled, control, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(scheduled, constant, strict=True)), "the halved lr must show"
