"""apex.fp16_utils: half models with fp32 batch norm, and master copies that round-trip exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.apex.fp16_utils import (
    BN_convert_float,
    DynamicLossScaler,
    FP16_Optimizer,
    FP16Model,
    LossScaler,
    clip_grad_norm,
    convert_module,
    convert_network,
    master_params_to_model_params,
    model_grads_to_master_grads,
    network_to_half,
    prep_param_lists,
    to_python_float,
    tofp16,
)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.BatchNorm1d(4, affine=False), nn.Linear(4, 2))


def test_to_python_float():
    assert to_python_float(torch.tensor([2.5])) == 2.5 and to_python_float(torch.tensor(3)) == 3.0
    assert to_python_float(1) == 1.0 and to_python_float([0.25, 9]) == 0.25
    assert isinstance(to_python_float(torch.tensor(3)), float)


def test_network_to_half_keeps_affine_batchnorm_fp32():
    net = network_to_half(_net())
    assert isinstance(net[0], tofp16)
    inner = net[1]
    assert inner[0].weight.dtype == torch.float16 and inner[3].weight.dtype == torch.float16
    assert inner[1].weight.dtype == torch.float32 and inner[1].running_mean.dtype == torch.float32
    assert inner[2].running_mean.dtype == torch.float16  # affine=False batch norm goes to half (Apex's rule)
    assert BN_convert_float(inner) is inner


def test_convert_network_keeps_parameter_objects_and_converts_grads():
    net = _net()
    params = list(net.parameters())
    for p in params:
        p.grad = torch.ones_like(p)
    assert convert_network(net, torch.float16) is net
    assert all(a is b for a, b in zip(net.parameters(), params))
    assert net[0].weight.dtype == net[0].weight.grad.dtype == torch.float16
    assert net[1].weight.dtype == net[1].weight.grad.dtype == torch.float32
    assert net[2].running_var.dtype == torch.float16


def test_convert_module_is_not_recursive():
    net = _net()
    convert_module(net, torch.float16)  # the Sequential has no parameters of its own
    assert net[0].weight.dtype == torch.float32
    buf = nn.Module()
    buf.register_buffer("steps", torch.tensor(3))
    convert_module(buf, torch.float16)
    assert buf.steps.dtype == torch.int64  # only floating tensors are cast


def test_convert_network_reflattens_rnns():
    rnn = convert_network(nn.LSTM(3, 4), torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in rnn.parameters())
    assert rnn(torch.randn(2, 1, 3, dtype=torch.bfloat16))[0].dtype == torch.bfloat16


def test_fp16_model_casts_only_floating_inputs():
    class Lookup(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(5, 3)

        def forward(self, ids: torch.Tensor, scale: torch.Tensor, *, shift: torch.Tensor) -> torch.Tensor:
            return self.emb(ids) * scale + shift

    model = FP16Model(Lookup())
    out = model(torch.tensor([1, 4]), torch.tensor(2.0), shift=torch.tensor(1.0))
    assert model.network.emb.weight.dtype == torch.float16 and out.dtype == torch.float16


def test_prep_param_lists_copies_to_fp32_masters():
    model = _net().half()
    model[3].bias.requires_grad_(False)
    model_params, masters = prep_param_lists(model)
    assert len(model_params) == len(masters) == 5 and all(p.requires_grad for p in model_params)
    for p, m in zip(model_params, masters):
        assert m.dtype == torch.float32 and m.requires_grad and m.is_leaf and m.data_ptr() != p.data_ptr()
        torch.testing.assert_close(m, p.float(), rtol=0, atol=0)

    model_params, (flat,) = prep_param_lists(model, flat_master=True)
    assert isinstance(flat, nn.Parameter) and flat.dtype == torch.float32 and flat.numel() == sum(p.numel() for p in model_params)
    torch.testing.assert_close(flat, torch.cat([p.float().reshape(-1) for p in model_params]), rtol=0, atol=0)
    assert flat.grad is not None and not flat.grad.any()


@pytest.mark.parametrize("flat", [False, True])
def test_grads_and_weights_round_trip_exactly(flat: bool):
    model = _net().half()
    model_params, masters = prep_param_lists(model, flat_master=flat)
    gen = torch.Generator().manual_seed(3)
    for p in model_params:
        p.grad = torch.randn(p.shape, generator=gen).half()
    model_params[2].grad = None
    model_grads_to_master_grads(model_params, masters, flat_master=flat)
    if flat:
        expected = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).float().reshape(-1) for p in model_params])
        torch.testing.assert_close(masters[0].grad, expected, rtol=0, atol=0)
    else:
        assert masters[2].grad is None
        for p, m in zip(model_params, masters):
            if p.grad is not None:
                assert m.grad.dtype == torch.float32
                torch.testing.assert_close(m.grad, p.grad.float(), rtol=0, atol=0)

    # An optimizer step on the masters, then back into the half model: values rounded to fp16 once.
    torch.optim.SGD(masters, lr=0.1).step()
    master_params_to_model_params(model_params, masters, flat_master=flat)
    flat_values = masters[0].detach() if flat else torch.cat([m.detach().reshape(-1) for m in masters])
    torch.testing.assert_close(torch.cat([p.detach().reshape(-1) for p in model_params]), flat_values.half(), rtol=0, atol=0)
    # fp16 -> fp32 -> fp16 is exact: values representable in fp16 come back bit for bit.
    before = [p.detach().clone() for p in model_params]
    _, again = prep_param_lists(model, flat_master=flat)
    master_params_to_model_params(model_params, again, flat_master=flat)
    for a, b in zip(before, model_params):
        assert torch.equal(a, b.detach())


def test_master_grads_reuse_existing_buffers():
    model = nn.Linear(2, 2)
    model_params, masters = prep_param_lists(model)
    for p in model_params:
        p.grad = torch.ones_like(p)
    model_grads_to_master_grads(model_params, masters)
    buffers = [m.grad for m in masters]
    model_grads_to_master_grads(model_params, masters)
    assert all(m.grad is b for m, b in zip(masters, buffers))


def test_mismatched_lists_raise_with_the_fix():
    model_params, masters = prep_param_lists(_net())
    with pytest.raises(ValueError, match=r"6 model parameters but 4 master parameters: pass the two lists prep_param_lists returned"):
        master_params_to_model_params(model_params, masters[:4])
    with pytest.raises(ValueError, match=r"flat_master=True expects the one flat master.*same flat_master value"):
        model_grads_to_master_grads(model_params, masters, flat_master=True)


def test_flat_master_needs_one_device():
    model = _net()
    model[0].to("meta")
    with pytest.raises(ValueError, match=r"one device.*use flat_master=False"):
        prep_param_lists(model, flat_master=True)


def test_clip_grad_norm_is_torchs():
    assert clip_grad_norm is torch.nn.utils.clip_grad_norm_


@pytest.mark.parametrize(
    ("cls", "args", "fix"),
    [
        (FP16_Optimizer, (torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),), r'amp\.initialize\(model, optimizer, opt_level="O2"\)'),
        (LossScaler, (128.0,), r'opt_level="O2", loss_scale=128\.0\)'),
        (DynamicLossScaler, (), r'amp\.initialize\(model, optimizer, opt_level="O2"\) \(dynamic loss scaling'),
    ],
)
def test_removed_classes_point_to_amp(cls: type, args: tuple, fix: str):
    with pytest.raises(NotImplementedError, match=rf"apex\.fp16_utils\.{cls.__name__} is not provided.*{fix}.*amp\.scale_loss"):
        cls(*args)


def test_importable_under_apex_names():
    from ampkit.apex import install, uninstall

    install()
    try:
        from apex.fp16_utils import FP16Model as by_apex

        assert by_apex is FP16Model
    finally:
        uninstall()
