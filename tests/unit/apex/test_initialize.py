"""amp.initialize: return shapes, what each opt level does to the model and optimizer, and users' mistakes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.apex import amp
from ampkit.apex._properties import OptLevelError


def net(device: torch.device | str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 2)).to(device)


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


# -------------------------------------------------------------------------------------------- shapes
def test_return_shapes_mirror_the_input():
    m1, m2 = net(), net()
    o1, o2 = sgd(m1), sgd(m2)
    out = amp.initialize(m1, o1, opt_level="O1", verbosity=0)
    assert isinstance(out, tuple) and out[0] is m1 and out[1] is o1
    m1, m2 = net(), net()
    o1, o2 = sgd(m1), sgd(m2)
    models, opts = amp.initialize([m1, m2], [o1, o2], opt_level="O1", verbosity=0)
    assert models == [m1, m2] and opts == [o1, o2]
    m1, m2 = net(), net()
    models, opt = amp.initialize([m1, m2], sgd(m1), opt_level="O1", verbosity=0)
    assert isinstance(models, list) and isinstance(opt, torch.optim.Optimizer)
    m1 = net()
    model, opts = amp.initialize(m1, [sgd(m1)], opt_level="O1", verbosity=0)
    assert model is m1 and isinstance(opts, list)
    m1 = net()
    assert amp.initialize(m1, opt_level="O1", verbosity=0) is m1  # inference: no optimizer


# -------------------------------------------------------------------------------------------- levels
HALF = "half"  # the device's default 16-bit type: fp16 on CUDA (as in Apex), bf16 on the CPU


@pytest.mark.parametrize(
    "level, weight, bn, masters",
    [
        ("O0", torch.float32, torch.float32, False),
        ("O1", torch.float32, torch.float32, False),
        ("O2", HALF, torch.float32, True),
        ("O3", HALF, HALF, False),
    ],
)
def test_what_each_level_does_on_the_device(level, weight, bn, masters, device, half_dtype):
    weight, bn = (half_dtype if t == HALF else t for t in (weight, bn))
    model = net(device)
    opt = sgd(model)
    model, opt = amp.initialize(model, opt, opt_level=level, verbosity=0)  # no half_dtype: the device's default
    assert model[0].weight.dtype == weight
    assert model[1].weight.dtype == bn and model[1].running_mean.dtype == bn
    # Apex kept only BatchNorm in fp32; LayerNorm goes 16-bit with the rest under O2/O3.
    assert model[3].weight.dtype == weight
    stepped = list(amp.master_params(opt))
    assert all(p.dtype == torch.float32 for p in stepped) == (masters or weight == torch.float32)
    assert (stepped[0] is model[0].weight) == (not masters)
    out = model(torch.randn(3, 4, device=device))
    assert out.dtype == torch.float32


def test_o2_inputs_cast_in_and_outputs_cast_to_cast_model_outputs():
    model = net()
    model, _ = amp.initialize(model, sgd(model), opt_level="O2", verbosity=0, cast_model_outputs=torch.bfloat16)
    assert model(torch.randn(3, 4, dtype=torch.float64)).dtype == torch.bfloat16


def test_o2_keep_batchnorm_fp32_false_and_string_overrides():
    model = net()
    model, _ = amp.initialize(model, sgd(model), opt_level="O2", keep_batchnorm_fp32="False", verbosity=0)
    assert model[1].weight.dtype == torch.bfloat16


def test_o2_cast_model_type_override_and_half_dtype_env(monkeypatch):
    model = net()
    model, _ = amp.initialize(model, sgd(model), opt_level="O2", cast_model_type=torch.float16, verbosity=0)
    assert model[0].weight.dtype == torch.float16
    monkeypatch.setenv("AMPKIT_APEX_HALF_DTYPE", "float16")
    model = net()
    model, _ = amp.initialize(model, sgd(model), opt_level="O3", verbosity=0)
    assert model[0].weight.dtype == torch.float16
    monkeypatch.setenv("AMPKIT_APEX_HALF_DTYPE", "int8")
    with pytest.raises(ValueError, match=r"AMPKIT_APEX_HALF_DTYPE='int8'.*bfloat16"):
        amp.initialize(net(), opt_level="O3", verbosity=0)


def test_o2_master_params_are_fp32_from_initialize_and_model_follows_them(device, half_dtype):
    model = net(device)
    opt = sgd(model)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    with amp.scale_loss(model(torch.randn(5, 4, device=device)).pow(2).mean(), opt) as scaled:
        scaled.backward()
    masters = list(amp.master_params(opt))
    assert all(p.dtype == torch.float32 and p.device == device and p.grad is not None for p in masters)
    opt.step()
    assert torch.equal(model[0].weight, masters[0].to(half_dtype))
    assert masters[0].grad is None  # cleared after the step: model.zero_grad() is enough


def test_o0_keeps_everything_fp32_and_exact(device):
    model = net(device)
    ref = net(device)
    model, _opt = amp.initialize(model, sgd(model), opt_level="O0", verbosity=0)
    x = torch.randn(3, 4, device=device)
    ref.eval(), model.eval()
    assert torch.equal(model(x), ref(x))


# -------------------------------------------------------------------------------------------- printout
def test_printout_at_verbosity_1_lists_defaults_then_overrides(capsys):
    model = net()
    amp.initialize(model, sgd(model), opt_level="O2", loss_scale=128.0)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Selected optimization level O2:  FP16 training with FP32 batchnorm and FP32 master weights."
    assert "Defaults for this optimization level are:" in out
    defaults = out[out.index("Defaults for this optimization level are:") + 1 :][:7]
    final = out[out.index("After processing overrides, optimization options are:") + 1 :][:7]
    assert defaults[-1] == "loss_scale             : dynamic"
    assert final[-1] == "loss_scale             : 128.0"
    assert final[2] == "cast_model_type        : torch.bfloat16"
    assert any("bfloat16" in line and "AMPKIT_APEX_HALF_DTYPE" in line for line in out)


def test_printout_only_on_rank_0(capsys, monkeypatch):
    monkeypatch.setattr("ampkit.apex._session.is_rank0", lambda: False)
    model = net()
    amp.initialize(model, sgd(model), opt_level="O1")
    assert capsys.readouterr().out == ""


# -------------------------------------------------------------------------------------------- mistakes
def test_digit_zero_for_letter_o():
    model = net()
    with pytest.raises(OptLevelError, match="Did you mean 'O1'"):
        amp.initialize(model, sgd(model), opt_level="01")
    with pytest.raises(RuntimeError):  # Apex raised RuntimeError; ampkit's error is one too
        amp.initialize(model, sgd(model), opt_level="O5")


def test_positional_opt_level_lands_in_enabled():
    model = net()
    with pytest.raises(TypeError, match=r"third positional argument, which is `enabled`.*opt_level='O2'"):
        amp.initialize(model, sgd(model), "O2")


def test_tuple_of_optimizers_or_models_asks_for_a_list():
    model = net()
    with pytest.raises(TypeError, match="got a tuple. Pass a list"):
        amp.initialize(model, (sgd(model), sgd(model)), opt_level="O1")
    with pytest.raises(TypeError, match="got a tuple"):
        amp.initialize((model, net()), sgd(model), opt_level="O1")


def test_initialize_twice_on_one_optimizer():
    model = net()
    opt = sgd(model)
    amp.initialize(model, opt, opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match="optimizer has already been through amp.initialize"):
        amp.initialize(net(), opt, opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match="model has already been through amp.initialize"):
        amp.initialize(model, sgd(model), opt_level="O1", verbosity=0)


def test_model_already_wrapped_in_data_parallel():
    model = nn.DataParallel(net())
    with pytest.raises(RuntimeError, match=r"already wrapped in DataParallel.*model = DDP\(model\)"):
        amp.initialize(model, sgd(model), opt_level="O1")


def test_model_already_in_half():
    model = net().half()
    with pytest.raises(RuntimeError, match=r"drop the \.half\(\)"):
        amp.initialize(model, sgd(model), opt_level="O2")


def test_not_a_model_or_optimizer():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        amp.initialize("model", opt_level="O1")
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        amp.initialize(net(), "adam", opt_level="O1")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(opt_level="O1", keep_batchnorm_fp32=True), "keep_batchnorm_fp32 must be None with O1"),
        (dict(opt_level="O1", master_weights=True), "master weights make no sense"),
        (dict(opt_level="O1", cast_model_type=torch.float16), "use opt_level='O2' or 'O3'"),
        (dict(opt_level="O2", patch_torch_functions=True), "select O1"),
        (dict(opt_level="O2", loss_scale="big"), "'dynamic' or a positive number"),
        (dict(opt_level="O2", loss_scale=-1.0), "positive finite"),
        (dict(opt_level="O2", keep_batchnorm_fp32="yes"), "the string 'True'/'False'"),
        (dict(opt_level="O1", num_losses=0), "num_losses must be an int >= 1"),
        (dict(opt_level="O1", min_loss_scale=2.0**25), "min_loss_scale <= max_loss_scale"),
        (dict(opt_level="O1", cast_model_outputs="float"), "floating torch.dtype"),
    ],
)
def test_invalid_overrides_are_refused_with_the_fix(kwargs, match):
    model = net()
    with pytest.raises((ValueError, RuntimeError), match=match):
        amp.initialize(model, sgd(model), verbosity=0, **kwargs)
