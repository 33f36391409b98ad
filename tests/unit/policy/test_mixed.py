"""Mixed-precision policies: fp32 weights, 16-bit compute under torch.autocast, checked against torch's own loop."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from collections.abc import Callable

    FakeGpu = Callable[[tuple[int, int], str], None]
from torch import nn

from ampkit.policy import BF16Mixed, FP16Mixed, Support, get_policy
from ampkit.policy._device import cpu_bf16_native

DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def inputs(seed: int = 1, device: torch.device | str = "cpu") -> torch.Tensor:
    # Drawn on the CPU and moved, so every device sees the same values.
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(seed)).to(device)


def skip_unless_supported(name: str, device: torch.device) -> None:
    support = get_policy(name).support(device)
    if not support.supported:
        pytest.skip(f"{name} does not run on {device}: {support.reason}")



# ------------------------------------------------------------------------------------- what they are
def test_bf16_mixed_describes_fp32_weights_bf16_compute_no_scaling() -> None:
    p = BF16Mixed()
    assert (p.name, p.param_dtype, p.compute_dtype) == ("bf16-mixed", torch.float32, torch.bfloat16)
    assert p.loss_scaling == "none" and p.master_weights is False


def test_16_mixed_describes_fp32_weights_fp16_compute_dynamic_scaling() -> None:
    p = FP16Mixed()
    assert (p.name, p.param_dtype, p.compute_dtype) == ("16-mixed", torch.float32, torch.float16)
    assert p.loss_scaling == "dynamic" and p.master_weights is False


# ------------------------------------------------------------------------------------- autocast behaviour
def test_bf16_mixed_autocasts_linear_to_bf16_and_leaves_fp32_softmax_in_fp32() -> None:
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with get_policy("bf16-mixed").forward_context("cpu"):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert lin(x).dtype == torch.bfloat16
        # softmax is not on CPU autocast's lower-precision list: fp32 in, fp32 out (its bf16 input would stay bf16).
        assert torch.softmax(x, dim=-1).dtype == torch.float32
    # Control: the same calls outside the policy stay fp32.
    assert lin(x).dtype == torch.float32
    assert not torch.is_autocast_enabled("cpu")


def test_16_mixed_autocasts_linear_to_fp16() -> None:
    lin = nn.Linear(4, 4)
    with get_policy("16-mixed").forward_context("cpu"):
        assert torch.get_autocast_dtype("cpu") == torch.float16
        assert lin(torch.randn(2, 4)).dtype == torch.float16


@pytest.mark.parametrize("name", list(DTYPES))
def test_forward_matches_torch_autocast_bitwise(name: str, device: torch.device) -> None:
    """Treatment: the policy's convert_module + forward_context. Control: the torch.autocast block torch documents."""
    skip_unless_supported(name, device)
    control, treat = mlp().to(device), mlp().to(device)
    policy = get_policy(name)
    policy.convert_module(treat, device.type)
    x = inputs(device=device)
    with torch.autocast(device.type, dtype=DTYPES[name]):
        expected = control(x)
    with policy.forward_context(device.type):
        out = treat(x)
    assert out.dtype == DTYPES[name] and out.device == device
    assert torch.equal(out, expected)


def test_bf16_mixed_forward_is_close_to_fp32_within_bf16_tolerance(device: torch.device) -> None:
    skip_unless_supported("bf16-mixed", device)
    model = mlp().to(device)
    x = inputs(device=device)
    reference = model(x)
    with get_policy("bf16-mixed").forward_context(device.type):
        out = model(x)
    assert not torch.equal(out.float(), reference), "bf16 compute should round somewhere; else nothing was tested"
    # bf16 keeps 8 significant bits (eps 2^-8 ~ 3.9e-3); allow a few roundings through three matmuls.
    torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=2e-2)
    rel = (out.float() - reference).norm() / reference.norm()
    assert rel < 2e-2


def test_16_mixed_forward_is_closer_to_fp32_than_bf16_mixed(device: torch.device) -> None:
    """fp16 has 3 more mantissa bits than bf16; on well-scaled activations its error must be smaller."""
    skip_unless_supported("bf16-mixed", device)
    model = mlp().to(device)
    x = inputs(device=device)
    reference = model(x)
    errors = {}
    for name in DTYPES:
        with get_policy(name).forward_context(device.type):
            errors[name] = ((model(x).float() - reference).norm() / reference.norm()).item()
    assert 0 < errors["16-mixed"] < errors["bf16-mixed"]


@pytest.mark.parametrize("name", list(DTYPES))
def test_convert_module_keeps_fp32_weights_and_identity(name: str, device: torch.device) -> None:
    model = mlp().to(device)
    before = copy.deepcopy(model)
    params = list(model.parameters())
    policy = get_policy(name)
    policy.convert_module(model, device.type)
    assert policy.converted_modules(model) == []
    for p, q, r in zip(model.parameters(), params, before.parameters()):
        assert p is q and p.dtype == torch.float32 and torch.equal(p, r)
    assert not model._forward_pre_hooks and not model._forward_hooks


@pytest.mark.parametrize("name", list(DTYPES))
def test_keep_fp32_module_runs_in_fp32_inside_autocast(name: str, device: torch.device) -> None:
    skip_unless_supported(name, device)
    control, treat = mlp().to(device), mlp().to(device)
    policy = get_policy(name, keep_fp32=["3"])
    policy.convert_module(treat, device.type)
    seen = {}
    treat[3].register_forward_hook(lambda m, a, out: seen.update(inp=a[0].dtype, out=out.dtype))
    x = inputs(device=device)
    with policy.forward_context(device.type):
        treat(x)
    # The island receives the 16-bit activation of the autocast layer before it and still answers in fp32.
    assert seen == {"inp": DTYPES[name], "out": torch.float32}
    # Reference for that layer: fp32 math on the autocast output of the layers before it.
    with torch.autocast(device.type, dtype=DTYPES[name]):
        hidden = control[:3](x)
    expected = control[3](hidden.float())
    with policy.forward_context(device.type):
        got = treat[3](treat[:3](x))
    assert torch.equal(got, expected)


# ------------------------------------------------------------------------------------- support
def test_bf16_mixed_on_this_cpu_is_fast_exactly_when_the_cpu_has_bf16() -> None:
    s = BF16Mixed().support("cpu")
    assert s.supported is True
    assert s.fast is cpu_bf16_native()


@pytest.mark.parametrize("native, fast, words", [(True, True, "AMX/AVX512-BF16"), (False, False, "emulates bf16")])
def test_bf16_mixed_cpu_support_follows_the_cpu(monkeypatch: pytest.MonkeyPatch, native: bool, fast: bool, words: str) -> None:
    monkeypatch.setattr("ampkit.policy._mixed.cpu_bf16_native", lambda: native)
    s = BF16Mixed().support("cpu")
    assert (s.supported, s.fast) == (True, fast)
    assert words in s.reason
    BF16Mixed().check_device("cpu")


def test_16_mixed_on_cpu_runs_but_is_not_fast_and_points_to_bf16_mixed() -> None:
    s = FP16Mixed().support("cpu")
    assert s.supported is True and s.fast is False
    assert "'bf16-mixed'" in s.reason
    FP16Mixed().check_device("cpu")


def test_bf16_mixed_on_pre_ampere_gpu_is_unsupported_and_points_to_16_mixed(fake_gpu: FakeGpu) -> None:
    fake_gpu((7, 5), "Tesla T4")
    s = BF16Mixed().support("cuda:0")
    assert s.supported is False and "Tesla T4" in s.reason and "'16-mixed'" in s.reason
    assert FP16Mixed().support("cuda:0") == Support(True, True, "fp16 tensor cores")


def test_16_mixed_on_a_gpu_without_tensor_cores_runs_but_is_not_claimed_fast(fake_gpu: FakeGpu) -> None:
    fake_gpu((6, 1), "GeForce GTX 1080")  # Pascal: fp16 arithmetic at 1/64 of the fp32 rate, no tensor cores
    s = FP16Mixed().support("cuda:0")
    assert s.supported is True and s.fast is False
    assert "GeForce GTX 1080" in s.reason and "sm70" in s.reason
    FP16Mixed().check_device("cuda:0")


def test_bf16_mixed_on_ampere_is_supported_and_fast(fake_gpu: FakeGpu) -> None:
    fake_gpu((8, 0), "A100")
    assert BF16Mixed().support("cuda:0") == Support(True, True, "bf16 tensor cores")


@pytest.mark.parametrize("policy", [BF16Mixed(), FP16Mixed()], ids=str)
def test_other_devices_run_but_are_not_claimed_fast(policy: BF16Mixed | FP16Mixed) -> None:
    s = policy.support("meta")
    assert s.supported is True and s.fast is False and "meta" in s.reason
