"""What ``AmpkitAccelerator`` refuses, each with the fix named, and the twin that shows the correct use passes silently."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os

import pytest
import torch
from accelerate.utils import AutocastKwargs, GradScalerKwargs
from torch import nn

import ampkit
from ampkit.accelerate import AmpkitAccelerator


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))


def test_a_second_mixed_precision_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="Drop mixed_precision='fp16': the precision policy replaces it"):
        AmpkitAccelerator("bf16-mixed", mixed_precision="fp16")
    assert AmpkitAccelerator("bf16-mixed", mixed_precision="no").state.mixed_precision == "no"  # the twin


def test_the_launchers_mixed_precision_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    with pytest.raises(ValueError, match="ACCELERATE_MIXED_PRECISION=bf16.*--mixed_precision no"):
        AmpkitAccelerator("16-mixed")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    AmpkitAccelerator("16-mixed")


def test_a_grad_scaler_handler_is_refused_with_the_scaler_config_that_scales_alike() -> None:
    with pytest.raises(ValueError, match=r"pass scaler=ampkit\.ScalerConfig\(init_scale=1024, growth_factor=2, backoff_factor=0\.5, growth_interval=100\)"):
        AmpkitAccelerator("16-mixed", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0, growth_interval=100)])
    accelerator = AmpkitAccelerator("16-mixed", scaler=ampkit.ScalerConfig(init_scale=1024, growth_factor=2, backoff_factor=0.5, growth_interval=100))
    assert accelerator.engine.scale == 1024.0


def test_an_autocast_handler_is_refused() -> None:
    with pytest.raises(ValueError, match="drop the handler .keep_fp32"):
        AmpkitAccelerator("bf16-mixed", kwargs_handlers=[AutocastKwargs(enabled=False)])


@pytest.mark.parametrize("plugin", ["fsdp_plugin", "deepspeed_plugin", "megatron_lm_plugin", "parallelism_config"])
def test_strategies_with_their_own_mixed_precision_are_refused(plugin: str) -> None:
    with pytest.raises(ValueError, match=f"Drop {plugin}; AmpkitAccelerator trains on one device, or DDP"):
        AmpkitAccelerator("bf16-mixed", **{plugin: object()})


def test_a_launcher_strategy_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="ACCELERATE_USE_FSDP=true"):
        AmpkitAccelerator("bf16-mixed")


def test_an_unknown_policy_names_the_closest() -> None:
    with pytest.raises(ampkit.PolicyError, match="bf16-mixed"):
        AmpkitAccelerator("bf16-mixd")


def test_a_wrapped_model_is_refused() -> None:
    accelerator = AmpkitAccelerator("bf16-mixed")
    with pytest.raises(ValueError, match="already wrapped in DataParallel; pass the plain model"):
        accelerator.prepare(nn.DataParallel(_net()))


def test_an_optimizer_before_its_model_is_refused_and_one_prepare_call_takes_both() -> None:
    accelerator = AmpkitAccelerator("bf16-true-masters")
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(RuntimeError, match=r"accelerator.prepare\(model, optimizer\)"):
        accelerator.prepare_optimizer(opt)
    opt, model = accelerator.prepare(opt, model)  # any order in one call
    assert opt.param_groups[0]["params"][0].dtype == torch.float32 and model[0].weight.dtype == torch.bfloat16


def test_models_are_set_up_in_one_prepare_call() -> None:
    accelerator = AmpkitAccelerator("bf16-mixed")
    accelerator.prepare(_net())
    with pytest.raises(RuntimeError, match="pass every model in one call"):
        accelerator.prepare(_net())
    AmpkitAccelerator("bf16-mixed").prepare(_net(), _net())  # the twin


def test_a_scheduler_attached_before_the_library_twin_replaces_its_optimizer_is_refused() -> None:
    accelerator = AmpkitAccelerator("bf16-true-kahan")
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(ValueError, match="Build the scheduler after prepare"):
        accelerator.prepare(model, opt, sched)


def test_clipping_inside_an_accumulation_window_is_refused() -> None:
    accelerator = AmpkitAccelerator("16-mixed", scaler=ampkit.ScalerConfig(init_scale=256), gradient_accumulation_steps=2)
    model = _net()
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.ones(2, 4)
    with accelerator.accumulate(model):
        accelerator.backward(model(x).float().sum())
        with pytest.raises(RuntimeError, match="inside an accumulation window"):
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
    with accelerator.accumulate(model):
        accelerator.backward(model(x).float().sum())
        assert accelerator.sync_gradients
        accelerator.clip_grad_norm_(model.parameters(), 1.0)  # the twin: at the window's end
        accelerator.clip_grad_norm_(model.parameters(), 1.0)  # twice in a step: unscaled once
        opt.step()
    assert accelerator.engine.steps == 1 and not opt.step_was_skipped


def test_a_closure_is_refused() -> None:
    accelerator = AmpkitAccelerator("bf16-mixed")
    model = _net()
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="cannot re-evaluate a closure"):
        opt.step(lambda: 0.0)


def test_an_accelerate_release_outside_the_tested_range_is_named(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import ampkit._util.framework_versions as versions
    import ampkit.accelerate

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.99.0" if name == "accelerate" else real(name))
    monkeypatch.setattr(versions, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        importlib.reload(ampkit.accelerate)
    assert "accelerate 1.99.0 is outside the releases ampkit is tested with" in caplog.text
    assert "pip install 'accelerate>=1.16,<1.17'" in caplog.text
    assert os.environ.get("ACCELERATE_USE_FSDP") is None
