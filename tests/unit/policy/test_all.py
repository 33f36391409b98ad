"""Rules every policy obeys, checked for each entry of ampkit.policy.POLICIES."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from ampkit._errors import UnsupportedPolicyError
from ampkit.policy import POLICIES, Policy, Support, get_policy
from ampkit.policy._lowbit import BF16TrueKahan, BF16TrueSR
from ampkit.policy._lowbit_optimizers import missing_library

NAMES = list(POLICIES)


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))


class Boom(Exception):
    pass


def _globals(device_type: str = "cpu") -> tuple:
    return (
        torch.is_autocast_enabled(device_type),
        torch.get_autocast_dtype(device_type),
        torch.get_default_dtype(),
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.allow_tf32,
    )


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return request.param


# ------------------------------------------------------------------------------------- identity
def test_registry_key_is_the_class_default_name(name: str) -> None:
    assert POLICIES[name]().name == name


def test_name_round_trips_through_get_policy(name: str) -> None:
    policy = get_policy(name)
    again = get_policy(policy.name)
    assert type(again) is type(policy) is POLICIES[name]
    assert again == policy
    assert get_policy(str(policy)) == policy


def test_str_is_the_name(name: str) -> None:
    assert str(get_policy(name)) == name
    assert str(get_policy(name, keep_fp32=["x"])) == name
    assert f"{get_policy(name)}" == name


def test_policy_is_a_frozen_hashable_value(name: str) -> None:
    policy = get_policy(name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.name = "other"  # type: ignore[misc]
    assert hash(policy) == hash(get_policy(name))
    assert policy != get_policy(name, keep_fp32=["x"])


def test_description_and_class_facts_are_consistent(name: str) -> None:
    policy = get_policy(name)
    assert isinstance(policy, Policy)
    assert policy.description.strip()
    assert policy.param_dtype in (torch.float32, torch.bfloat16, torch.float16)
    assert policy.compute_dtype in (None, torch.bfloat16, torch.float16)
    assert policy.loss_scaling in ("none", "dynamic")
    # Only fp16 can underflow gradients, so only an fp16 policy may scale the loss; bf16 and fp32 never do.
    if policy.loss_scaling == "dynamic":
        assert torch.float16 in (policy.param_dtype, policy.compute_dtype)
    if "bf16" in name or name in ("32-true", "tf32"):
        assert policy.loss_scaling == "none"
    # Master weights only make sense when the model itself is 16-bit; autocast never converts weights.
    if policy.master_weights:
        assert policy.param_dtype != torch.float32
    if policy.compute_dtype is not None:
        assert policy.param_dtype == torch.float32


# ------------------------------------------------------------------------------------- with_keep_fp32
def test_with_keep_fp32_returns_a_new_policy_and_leaves_the_original(name: str) -> None:
    original = get_policy(name)
    extended = original.with_keep_fp32("head", nn.LayerNorm)
    assert extended is not original
    assert type(extended) is type(original) and extended.name == original.name
    assert extended.keep_fp32 == ("head", nn.LayerNorm)
    assert original.keep_fp32 == ()
    again = extended.with_keep_fp32("tail")
    assert again.keep_fp32 == ("head", nn.LayerNorm, "tail")
    assert extended.keep_fp32 == ("head", nn.LayerNorm)


# ------------------------------------------------------------------------------------- support
@pytest.mark.parametrize("spelling", [None, "cpu", torch.device("cpu")])
def test_cpu_support_is_a_support_and_agrees_across_spellings(name: str, spelling: object) -> None:
    policy = get_policy(name)
    s = policy.support(spelling)  # type: ignore[arg-type]
    assert isinstance(s, Support)
    assert isinstance(s.supported, bool) and isinstance(s.fast, bool) and s.reason
    assert s == policy.support("cpu")
    assert not (s.fast and not s.supported), "an unsupported policy cannot be fast"


def test_check_device_raises_exactly_when_unsupported(name: str) -> None:
    policy = get_policy(name)
    if policy.support("cpu").supported:
        policy.check_device("cpu")
    else:
        with pytest.raises(UnsupportedPolicyError, match=f"Policy {name!r} cannot run on cpu: "):
            policy.check_device("cpu")


def test_support_on_the_pass_device_agrees_with_check_device(name: str, device: torch.device) -> None:
    policy = get_policy(name)
    s = policy.support(device)
    assert isinstance(s, Support) and s.reason and not (s.fast and not s.supported)
    if s.supported:
        policy.check_device(device)
    else:
        with pytest.raises(UnsupportedPolicyError, match=f"Policy {name!r} cannot run on {device}: "):
            policy.check_device(device)


def test_only_tf32_and_fp8_are_refused_on_cpu(name: str) -> None:
    policy = get_policy(name)
    missing = missing_library(policy.method) if isinstance(policy, (BF16TrueKahan, BF16TrueSR)) else None
    support = policy.support("cpu")
    if missing is not None:  # an optional library absent (the oldest-torch leg installs no extras): refused, naming the fix
        assert not support.supported and "ampkit[lowbit]" in support.reason
    elif name.startswith("fp8-"):  # no fp8 matmuls on a CPU: refused naming bf16-mixed, or the install without torchao
        assert not support.supported and ("bf16-mixed" in support.reason or "ampkit[fp8]" in support.reason)
    else:
        assert support.supported is (name != "tf32")


# ------------------------------------------------------------------------------------- forward_context
def test_forward_context_restores_globals_on_normal_exit(name: str, device: torch.device) -> None:
    before = _globals(device.type)
    with get_policy(name).forward_context(device.type):
        pass
    assert _globals(device.type) == before


def test_forward_context_restores_globals_when_the_body_raises(name: str, device: torch.device) -> None:
    before = _globals(device.type)
    with pytest.raises(Boom), get_policy(name).forward_context(device.type):
        torch.ones(1, device=device) @ torch.ones(1, device=device)
        raise Boom
    assert _globals(device.type) == before


def test_forward_context_restores_an_enclosing_autocast(name: str, device: torch.device) -> None:
    with torch.autocast(device.type, dtype=torch.float16):
        before = _globals(device.type)
        assert before[:2] == (True, torch.float16)
        with pytest.raises(Boom), get_policy(name).forward_context(device.type):
            raise Boom
        assert _globals(device.type) == before
    assert not torch.is_autocast_enabled(device.type)


def test_forward_context_restores_a_non_default_dtype(name: str, device: torch.device) -> None:
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(Boom), get_policy(name).forward_context(device.type):
            raise Boom
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)


def test_forward_context_can_be_used_repeatedly(name: str, device: torch.device) -> None:
    policy = get_policy(name)
    before = _globals(device.type)
    for _ in range(3):
        with policy.forward_context(device.type):
            pass
    assert _globals(device.type) == before


# ------------------------------------------------------------------------------------- convert_module
def test_convert_module_keeps_every_parameter_object(name: str, device: torch.device) -> None:
    model = mlp().to(device)
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    get_policy(name).convert_module(model, device.type)
    assert all(p is q for p, q in zip(model.parameters(), params))
    assert all(p is q for p, q in zip(opt.param_groups[0]["params"], params))


def test_converted_modules_are_exactly_the_ones_turned_16_bit(name: str, device: torch.device) -> None:
    """The engine builds fp32 masters for converted_modules' parameters; the two must never disagree."""
    model = mlp().to(device)
    policy = get_policy(name)
    claimed = {id(p) for m in policy.converted_modules(model) for p in m.parameters(recurse=False)}
    policy.convert_module(model, device.type)
    actual = {id(p) for p in model.parameters() if p.dtype != torch.float32}
    assert claimed == actual
    assert all(p.dtype == policy.param_dtype and p.device == device for p in model.parameters() if id(p) in actual)


def test_converted_model_answers_in_fp32_or_the_compute_dtype(name: str, device: torch.device) -> None:
    policy = get_policy(name)
    if device.type == "cuda" and not policy.support(device).supported:
        pytest.skip(f"{name} does not run on {device}: {policy.support(device).reason}")
    model = mlp().to(device)
    policy.convert_module(model, device.type)
    with policy.forward_context(device.type):
        out = model(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)).to(device))
    assert out.dtype == (policy.compute_dtype or torch.float32) and out.device == device
    assert torch.isfinite(out).all()


def test_cuda_without_cuda_is_unsupported_with_a_reason(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    policy = get_policy(name)
    s = policy.support("cuda")
    assert not s.supported and "CUDA is not available" in s.reason
    with pytest.raises(UnsupportedPolicyError, match="CUDA is not available"):
        policy.check_device("cuda:0")
