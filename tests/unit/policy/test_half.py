"""16-bit-weights policies: conversion in place, I/O casting hooks, fp32 norms for the master-weight forms.

Each forward is checked bitwise against a hand-built reference: the same fp32 weights cast with ``.to(dtype)``
(and, for the masters forms, the normalisation layers run in fp32 on ``h.float()`` and cast back).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from collections.abc import Callable

    FakeGpu = Callable[[tuple[int, int], str], None]
from torch import nn

from ampkit.policy import BF16True, BF16TrueMasters, FP16True, FP16TrueMasters, Policy, Support, get_policy
from ampkit.policy._device import cpu_bf16_native
from ampkit.policy._islands import is_fp32_island

HALF = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "bf16-true-masters": torch.bfloat16, "16-true-masters": torch.float16}
TRUE = ["bf16-true", "16-true"]
MASTERS = ["bf16-true-masters", "16-true-masters"]


def normed(seed: int = 0) -> nn.Sequential:
    """Linear, then one of each normalisation family, then Linear; BatchNorm's counter set to a known value."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.BatchNorm1d(8), nn.GroupNorm(2, 8), nn.ReLU(), nn.Linear(8, 3))
    model[2].num_batches_tracked.fill_(5)
    model[2].running_var.uniform_(0.5, 2.0)
    model[2].running_mean.uniform_(-1.0, 1.0)
    return model


def inputs(device: torch.device | str = "cpu", seed: int = 1) -> torch.Tensor:
    # Drawn on the CPU and moved, so every device sees the same values.
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(seed)).to(device)




def skip_unless_supported(name: str, device: torch.device) -> None:
    support = get_policy(name).support(device)
    if not support.supported:
        pytest.skip(f"{name} does not run on {device}: {support.reason}")


def masters_reference(fp32_model: nn.Sequential, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Apex O2 by hand: Linear layers in ``dtype``, each norm in fp32 on the upcast activation, cast back."""
    ref = copy.deepcopy(fp32_model)
    h = x.to(dtype)
    for layer in ref:
        if isinstance(layer, (nn.LayerNorm, nn.BatchNorm1d, nn.GroupNorm)):
            h = layer(h.float()).to(dtype)
        else:
            h = layer.to(dtype)(h)
    return h.float()


# ------------------------------------------------------------------------------------- what they are
@pytest.mark.parametrize(
    "policy, dtype, masters, scaling",
    [
        (BF16True(), torch.bfloat16, False, "none"),
        (FP16True(), torch.float16, False, "none"),  # Apex O3: no scaling
        (BF16TrueMasters(), torch.bfloat16, True, "none"),
        (FP16TrueMasters(), torch.float16, True, "dynamic"),  # Apex O2
    ],
    ids=str,
)
def test_class_attributes(policy: Policy, dtype: torch.dtype, masters: bool, scaling: str) -> None:
    assert policy.param_dtype == dtype
    assert policy.master_weights is masters
    assert policy.loss_scaling == scaling
    assert policy.compute_dtype is None


@pytest.mark.parametrize("name", list(HALF))
def test_forward_context_does_not_autocast(name: str, device: torch.device) -> None:
    with get_policy(name).forward_context(device.type):
        assert not torch.is_autocast_enabled(device.type)


# ------------------------------------------------------------------------------------- conversion
@pytest.mark.parametrize("name", TRUE)
def test_true_converts_every_floating_param_and_buffer_keeping_identity(name: str, device: torch.device) -> None:
    dtype = HALF[name]
    model, original = normed().to(device), normed().to(device)
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before conversion, as the engine asks
    get_policy(name).convert_module(model, device.type)

    state, before = model.state_dict(), original.state_dict()
    for key, tensor in state.items():
        if key.endswith("num_batches_tracked"):
            continue
        assert tensor.dtype == dtype, key
        assert torch.equal(tensor, before[key].to(dtype)), f"{key} is not the fp32 value rounded once"
    assert all(p is q for p, q in zip(model.parameters(), params))
    assert all(p is q for p, q in zip(opt.param_groups[0]["params"], params))
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())


@pytest.mark.parametrize("name", TRUE)
def test_optimizer_built_before_conversion_steps_the_converted_weights(name: str, device: torch.device) -> None:
    skip_unless_supported(name, device)
    model = normed().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    get_policy(name).convert_module(model, device.type)
    before = [p.detach().clone() for p in model.parameters()]
    model(inputs(device)).square().mean().backward()
    opt.step()
    assert all(p.dtype == HALF[name] and p.grad.dtype == HALF[name] for p in model.parameters())
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before)), "the optimizer moved nothing"


@pytest.mark.parametrize("name", list(HALF))
def test_integer_buffers_are_left_alone(name: str) -> None:
    model = normed()
    model.register_buffer("token_ids", torch.arange(5))
    model.register_buffer("mask", torch.tensor([True, False]))
    get_policy(name).convert_module(model, "cpu")
    assert model[2].num_batches_tracked.dtype == torch.int64
    assert model[2].num_batches_tracked.item() == 5
    assert model.token_ids.dtype == torch.int64 and torch.equal(model.token_ids, torch.arange(5))
    assert model.mask.dtype == torch.bool


@pytest.mark.parametrize("name", list(HALF))
def test_absent_buffers_are_skipped(name: str) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.Linear(8, 2))
    assert model[1].running_mean is None
    get_policy(name).convert_module(model, "cpu")
    assert model[1].running_mean is None
    assert model(inputs()).dtype == torch.float32


@pytest.mark.parametrize("name", MASTERS)
def test_masters_keep_every_norm_layer_in_fp32(name: str, device: torch.device) -> None:
    dtype = HALF[name]
    model, original = normed().to(device), normed().to(device)
    params = list(model.parameters())
    get_policy(name).convert_module(model, device.type)
    for index in (1, 2, 3):
        assert is_fp32_island(model[index])
        for key, tensor in model[index].state_dict().items():
            expected = torch.int64 if key == "num_batches_tracked" else torch.float32
            assert tensor.dtype == expected, f"{index}.{key}"
            assert torch.equal(tensor, original[index].state_dict()[key])
    for index in (0, 5):
        assert not is_fp32_island(model[index])
        assert all(p.dtype == dtype for p in model[index].parameters())
    assert all(p is q for p, q in zip(model.parameters(), params))


@pytest.mark.parametrize(
    "make_norm",
    [lambda: nn.InstanceNorm1d(8, affine=True), lambda: nn.RMSNorm(8), lambda: nn.LocalResponseNorm(2)],
    ids=["InstanceNorm1d", "RMSNorm", "LocalResponseNorm"],
)
def test_masters_keep_the_other_norm_types_in_fp32_too(make_norm: Callable[[], nn.Module]) -> None:
    model = nn.Sequential(nn.Linear(8, 8), make_norm(), nn.Linear(8, 8))
    BF16TrueMasters().convert_module(model, "cpu")
    assert is_fp32_island(model[1])
    assert all(p.dtype == torch.float32 for p in model[1].parameters())
    assert model[0].weight.dtype == torch.bfloat16


@pytest.mark.parametrize("name", list(HALF))
def test_converted_modules_exclude_island_members(name: str) -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    model = nn.Sequential()
    model.add_module("stem", nn.Linear(4, 8))
    model.add_module("norm", nn.LayerNorm(8))
    model.add_module("block", block)
    model.add_module("head", nn.Linear(8, 2))
    policy = get_policy(name, keep_fp32=["block"])
    converted = {id(m) for m in policy.converted_modules(model)}
    expected = {id(model), id(model.stem), id(model.head)}
    if not policy.master_weights:
        expected.add(id(model.norm))
    assert converted == expected
    # And conversion does exactly that: parameters of converted modules 16-bit, the rest fp32.
    policy.convert_module(model, "cpu")
    for m in model.modules():
        for p in m.parameters(recurse=False):
            assert p.dtype == (HALF[name] if id(m) in converted else torch.float32)


# ------------------------------------------------------------------------------------- forward and hooks
@pytest.mark.parametrize("name", TRUE)
def test_true_forward_equals_the_model_cast_by_hand(name: str, device: torch.device) -> None:
    skip_unless_supported(name, device)
    dtype = HALF[name]
    model = normed().to(device)
    reference = copy.deepcopy(model).to(dtype)
    get_policy(name).convert_module(model, device.type)
    seen = []
    model[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    x = inputs(device)
    out = model(x)
    expected = reference(x.to(dtype)).float()
    assert seen == [dtype], "the input should reach the first layer already cast"
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)
    # BatchNorm in train mode updated its running stats in 16 bits, exactly like the reference.
    assert torch.equal(model[2].running_mean, reference[2].running_mean)
    assert model[2].num_batches_tracked.item() == reference[2].num_batches_tracked.item() == 6


@pytest.mark.parametrize("name", MASTERS)
def test_masters_forward_runs_norms_in_fp32_and_casts_their_outputs_back(name: str, device: torch.device) -> None:
    skip_unless_supported(name, device)
    dtype = HALF[name]
    model = normed().to(device)
    fp32_copy = copy.deepcopy(model)
    get_policy(name).convert_module(model, device.type)
    outs: dict[int, torch.dtype] = {}
    for index in (1, 2, 3):
        model[index].register_forward_hook(lambda m, a, out, i=index: outs.__setitem__(i, out.dtype))
    x = inputs(device)
    out = model(x)
    assert outs == {1: dtype, 2: dtype, 3: dtype}
    assert out.dtype == torch.float32
    assert torch.equal(out, masters_reference(fp32_copy, x, dtype))
    # Running statistics were accumulated in fp32.
    assert model[2].running_mean.dtype == torch.float32
    # Control: the all-16-bit policy of the same dtype computes something different.
    all_half = normed().to(device)
    get_policy(name.removesuffix("-masters")).convert_module(all_half, device.type)
    assert not torch.equal(all_half(x), out)


@pytest.mark.parametrize("name", list(HALF))
def test_keep_fp32_module_computes_in_fp32_and_hands_back_16_bit(name: str, device: torch.device) -> None:
    skip_unless_supported(name, device)
    dtype = HALF[name]
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)).to(device)
    fp32_copy = copy.deepcopy(model)
    get_policy(name, keep_fp32=["1"]).convert_module(model, device.type)
    assert model[1].weight.dtype == torch.float32
    x = inputs(device)
    h = fp32_copy[0].to(dtype)(x.to(dtype))
    h = fp32_copy[1](h.float()).to(dtype)
    expected = fp32_copy[2].to(dtype)(h).float()
    assert torch.equal(model(x), expected)


class KwargsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor, ids: torch.Tensor) -> dict:
        self.seen = (x.dtype, bias.dtype, ids.dtype)
        y = self.lin(x) + bias
        return {"y": y, "pair": (y * 2, ids), "n": 3}


@pytest.mark.parametrize("name", list(HALF))
def test_hooks_cast_args_and_kwargs_in_and_nested_outputs_out(name: str) -> None:
    dtype = HALF[name]
    net = KwargsNet()
    get_policy(name).convert_module(net, "cpu")
    ids = torch.tensor([1, 2])
    out = net(torch.randn(2, 4), bias=torch.ones(4), ids=ids)
    assert net.seen == (dtype, dtype, torch.int64)
    assert out["y"].dtype == torch.float32 and out["pair"][0].dtype == torch.float32
    assert out["pair"][1] is ids and out["n"] == 3


@pytest.mark.parametrize("name", list(HALF))
def test_convert_module_twice_registers_the_hooks_once(name: str) -> None:
    once, twice = normed(), normed()
    policy = get_policy(name)
    policy.convert_module(once, "cpu")
    policy.convert_module(twice, "cpu")
    policy.convert_module(twice, "cpu")
    assert len(twice._forward_pre_hooks) == len(once._forward_pre_hooks) == 1
    assert len(twice._forward_hooks) == len(once._forward_hooks) == 1
    for a, b in zip(once.state_dict().values(), twice.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b)
    x = inputs()
    assert torch.equal(once(x), twice(x))


@pytest.mark.parametrize("name", list(HALF))
def test_converted_model_survives_deepcopy(name: str, device: torch.device) -> None:
    skip_unless_supported(name, device)
    model = normed().to(device)
    get_policy(name).convert_module(model, device.type)
    clone = copy.deepcopy(model)
    x = inputs(device)
    expected = model(x)
    assert torch.equal(clone(x), expected)
    with torch.no_grad():
        clone[0].weight.zero_()
    assert torch.equal(model(x), expected), "the copy must compute with its own weights, not the original's"
    assert not torch.equal(clone(x), expected)


# ------------------------------------------------------------------------------------- support
@pytest.mark.parametrize("name", ["16-true", "16-true-masters"])
def test_fp16_on_cpu_runs_but_is_slow_and_points_to_bf16_true_masters(name: str) -> None:
    s = get_policy(name).support("cpu")
    assert s.supported is True and s.fast is False
    assert "'bf16-true-masters'" in s.reason


@pytest.mark.parametrize("name", ["bf16-true", "bf16-true-masters"])
def test_bf16_on_this_cpu_is_fast_exactly_when_the_cpu_has_bf16(name: str) -> None:
    s = get_policy(name).support("cpu")
    assert s.supported is True and s.fast is cpu_bf16_native()


@pytest.mark.parametrize("native, fast, words", [(True, True, "AMX/AVX512-BF16"), (False, False, "emulates bf16")])
def test_bf16_cpu_support_follows_the_cpu(monkeypatch: pytest.MonkeyPatch, native: bool, fast: bool, words: str) -> None:
    monkeypatch.setattr("ampkit.policy._half.cpu_bf16_native", lambda: native)
    s = BF16True().support("cpu")
    assert (s.supported, s.fast) == (True, fast) and words in s.reason


def test_pre_ampere_gpu_refuses_bf16_and_runs_fp16(fake_gpu: FakeGpu) -> None:
    fake_gpu((7, 0), "Tesla V100")
    for policy in (BF16True(), BF16TrueMasters()):
        s = policy.support("cuda:0")
        assert s.supported is False and "Tesla V100" in s.reason and "'16-true-masters'" in s.reason
    for policy in (FP16True(), FP16TrueMasters()):
        assert policy.support("cuda:0") == Support(True, True, "16-bit tensor cores")


def test_a_gpu_without_tensor_cores_runs_fp16_but_is_not_claimed_fast(fake_gpu: FakeGpu) -> None:
    fake_gpu((6, 1), "GeForce GTX 1080")  # Pascal: fp16 arithmetic at 1/64 of the fp32 rate, no tensor cores
    for policy in (FP16True(), FP16TrueMasters()):
        s = policy.support("cuda:0")
        assert s.supported is True and s.fast is False
        assert "GeForce GTX 1080" in s.reason and "sm70" in s.reason
    assert BF16TrueMasters().support("cuda:0").supported is False


def test_ampere_gpu_runs_all_16_bit_policies_fast(fake_gpu: FakeGpu) -> None:
    fake_gpu((8, 6), "RTX 3090")
    for name in HALF:
        assert get_policy(name).support("cuda:0") == Support(True, True, "16-bit tensor cores")


@pytest.mark.parametrize("name", list(HALF))
def test_other_devices_run_but_are_not_claimed_fast(name: str) -> None:
    s = get_policy(name).support("meta")
    assert s.supported is True and s.fast is False and "meta" in s.reason


# ------------------------------------------------------------------------------------- bugs
def test_masters_make_norms_fp32_even_when_the_model_arrives_in_16_bits() -> None:
    model = normed().to(torch.bfloat16)
    BF16TrueMasters().convert_module(model, "cpu")
    assert all(p.dtype == torch.float32 for p in model[1].parameters())
    assert model(inputs()).dtype == torch.float32


def test_keep_fp32_module_with_children_becomes_fp32_when_the_model_arrives_in_16_bits() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2))).bfloat16()
    get_policy("bf16-true-masters", keep_fp32=["1"]).convert_module(model, "cpu")
    assert all(p.dtype == torch.float32 for p in model[1].parameters())
    assert model[0].weight.dtype == torch.bfloat16
    assert model(torch.randn(3, 4)).dtype == torch.float32
