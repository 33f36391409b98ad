"""Full-precision policies: ``32-true`` is the untouched reference; ``tf32`` is CUDA-only and restores globals."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from collections.abc import Callable

    FakeGpu = Callable[[tuple[int, int], str], None]
from torch import nn

from ampkit._compat import per_backend_fp32_precision
from ampkit._errors import PolicyError, UnsupportedPolicyError
from ampkit.policy import FullPrecision, Support, TF32Precision, _full as full_mod, get_policy
from ampkit.policy._islands import is_fp32_island


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))




# torch < 2.9 has one global fp32 precision rather than one per backend; the policy's legacy path is tested there
# by test_tf32_context_falls_back_to_the_legacy_api_on_older_torch (for real on the oldest-torch CI leg).
per_backend_api = pytest.mark.skipif(
    not per_backend_fp32_precision(), reason=f"torch {torch.__version__} has no per-backend fp32_precision (2.9+)"
)


@pytest.fixture
def matmul_precision() -> Iterator[None]:
    """Let a test change the CUDA backends' fp32 precision; put it back afterwards."""
    if not per_backend_fp32_precision():
        saved_legacy = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
        yield
        torch.set_float32_matmul_precision(saved_legacy[0])
        torch.backends.cudnn.allow_tf32 = saved_legacy[1]
        return
    saved = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    yield
    torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved


def cuda_matmuls_are_ieee() -> bool:
    if per_backend_fp32_precision():
        return torch.backends.cuda.matmul.fp32_precision == "ieee"
    return torch.get_float32_matmul_precision() == "highest"


def set_ieee_matmuls() -> None:
    """Plain fp32 matmuls on CUDA, through whichever API this torch has."""
    if per_backend_fp32_precision():
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    else:
        torch.set_float32_matmul_precision("highest")


def cuda_precisions() -> tuple[str, str]:
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision


# ------------------------------------------------------------------------------------- 32-true
def test_32_true_describes_fp32_everything() -> None:
    p = FullPrecision()
    assert p.name == "32-true"
    assert p.param_dtype == torch.float32 and p.compute_dtype is None
    assert p.loss_scaling == "none" and p.master_weights is False


@pytest.mark.parametrize("spelling", [None, "cpu", torch.device("cpu"), "meta"])
def test_32_true_runs_everywhere(spelling: object) -> None:
    s = FullPrecision().support(spelling)  # type: ignore[arg-type]
    assert s == Support(True, True, "runs everywhere")
    FullPrecision().check_device(spelling)  # type: ignore[arg-type]


def test_32_true_leaves_the_model_and_forward_untouched() -> None:
    control, treat = mlp(), mlp()
    policy = FullPrecision()
    params = list(treat.parameters())
    policy.convert_module(treat, "cpu")
    assert all(p is q for p, q in zip(params, treat.parameters()))
    assert all(t.dtype == torch.float32 for t in treat.state_dict().values())
    assert not treat._forward_hooks and not treat._forward_pre_hooks
    assert policy.converted_modules(treat) == []
    x = torch.randn(4, 6)
    with policy.forward_context("cpu"):
        assert not torch.is_autocast_enabled("cpu")
        out = treat(x)
    assert torch.equal(out, control(x))


def test_32_true_keep_fp32_still_makes_islands() -> None:
    model = mlp()
    FullPrecision(keep_fp32=("1",)).convert_module(model, "cpu")
    assert is_fp32_island(model[1])
    assert not is_fp32_island(model[0])


# ------------------------------------------------------------------------------------- tf32 support
@pytest.mark.parametrize("spelling", [None, "cpu", torch.device("cpu")])
def test_tf32_is_unsupported_on_cpu_and_names_alternatives(spelling: object) -> None:
    s = TF32Precision().support(spelling)  # type: ignore[arg-type]
    assert s.supported is False and s.fast is False
    assert "'bf16-mixed'" in s.reason and "'32-true'" in s.reason


def test_tf32_check_device_on_cpu_raises_unsupported_policy_error() -> None:
    with pytest.raises(UnsupportedPolicyError, match=r"Policy 'tf32' cannot run on cpu: .*'bf16-mixed'") as info:
        get_policy("tf32").check_device("cpu")
    assert isinstance(info.value, PolicyError) and isinstance(info.value, ValueError)
    with pytest.raises(UnsupportedPolicyError, match="cannot run on cpu"):
        get_policy("tf32").check_device(None)


def test_tf32_on_pre_ampere_gpu_is_unsupported_naming_the_gpu_and_16_mixed(fake_gpu: FakeGpu) -> None:
    fake_gpu((7, 0), "Tesla V100")
    s = TF32Precision().support("cuda:0")
    assert s.supported is False and s.fast is False
    assert "Tesla V100" in s.reason and "'16-mixed'" in s.reason
    with pytest.raises(UnsupportedPolicyError, match="cannot run on cuda:0: Tesla V100"):
        TF32Precision().check_device("cuda:0")


def test_tf32_on_ampere_is_supported_and_fast(fake_gpu: FakeGpu) -> None:
    fake_gpu((8, 0), "A100")
    assert TF32Precision().support("cuda:0") == Support(True, True, "TF32 tensor cores")
    TF32Precision().check_device("cuda:0")


# ------------------------------------------------------------------------------------- tf32 forward context
@per_backend_api
@pytest.mark.parametrize("previous", ["ieee", "none"])
def test_tf32_context_sets_the_cuda_backends_to_tf32_and_restores_them(matmul_precision: None, previous: str) -> None:
    torch.backends.cuda.matmul.fp32_precision = previous
    torch.backends.cudnn.conv.fp32_precision = previous
    with TF32Precision().forward_context("cuda"):
        assert cuda_precisions() == ("tf32", "tf32")
    assert cuda_precisions() == (previous, previous)


@per_backend_api
def test_tf32_context_leaves_the_cpu_backend_alone(matmul_precision: None) -> None:
    before = torch.backends.mkldnn.matmul.fp32_precision
    with TF32Precision().forward_context("cuda"):
        assert torch.backends.mkldnn.matmul.fp32_precision == before
    assert torch.get_float32_matmul_precision() == "highest"  # the legacy getter still works afterwards


@per_backend_api
def test_tf32_context_restores_after_an_exception(matmul_precision: None) -> None:
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    with pytest.raises(KeyError, match="boom"), TF32Precision().forward_context("cuda"):
        assert cuda_precisions()[0] == "tf32"
        raise KeyError("boom")
    assert cuda_precisions()[0] == "ieee"


@per_backend_api
def test_tf32_contexts_nest(matmul_precision: None) -> None:
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    policy = TF32Precision()
    with policy.forward_context("cuda"):
        with policy.forward_context("cuda"):
            assert cuda_precisions()[0] == "tf32"
        assert cuda_precisions()[0] == "tf32"
    assert cuda_precisions()[0] == "ieee"


def test_tf32_context_falls_back_to_the_legacy_api_on_older_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(full_mod, "_per_backend_api", lambda: False)
    previous = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with TF32Precision().forward_context("cuda"):
            assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32 is True
        assert torch.get_float32_matmul_precision() == previous[0] and torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.backends.cudnn.allow_tf32 = previous[1]


@per_backend_api
def test_tf32_forward_context_is_fresh_each_call(matmul_precision: None) -> None:
    # A generator-based context manager can be entered once; the policy must hand out a new one per call, and each
    # must switch TF32 on and put the caller's setting back (a reusable do-nothing context would pass the first part).
    torch.backends.cuda.matmul.fp32_precision = torch.backends.cudnn.conv.fp32_precision = "ieee"
    policy = TF32Precision()
    first, second = policy.forward_context("cuda"), policy.forward_context("cuda")
    assert first is not second
    for context in (first, second):
        with context:
            assert cuda_precisions() == ("tf32", "tf32")
        assert cuda_precisions() == ("ieee", "ieee")


def test_tf32_keeps_fp32_weights_and_does_not_autocast() -> None:
    model = mlp()
    reference = copy.deepcopy(model)
    policy = TF32Precision()
    assert policy.param_dtype == torch.float32 and policy.compute_dtype is None and policy.loss_scaling == "none"
    policy.convert_module(model, "cpu")
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.dtype == torch.float32 and torch.equal(p, q)
    with policy.forward_context("cpu"):
        assert not torch.is_autocast_enabled("cpu")
        assert model(torch.randn(2, 6)).dtype == torch.float32


def test_tf32_forward_is_fp32_within_tf32_rounding(device: torch.device, matmul_precision: None) -> None:
    """Treatment: a matmul-heavy forward under the tf32 policy; control: the same forward in IEEE fp32 on the same
    device. TF32 keeps 10 mantissa bits (eps 2^-11), so the two differ, by little."""
    policy = TF32Precision()
    if not policy.support(device).supported:
        pytest.skip(f"tf32 does not run on {device}: {policy.support(device).reason}")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64)).to(device)
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(1)).to(device)
    set_ieee_matmuls()
    reference = model(x)
    with policy.forward_context(device.type):
        out = model(x)
    assert out.dtype == torch.float32 and cuda_matmuls_are_ieee()
    assert not torch.equal(out, reference), "TF32 rounds the matmul inputs; an equal result means it was not used"
    assert ((out - reference).norm() / reference.norm()).item() < 1e-2


@per_backend_api
def test_tf32_context_works_alongside_torch_per_backend_precision_api() -> None:
    saved = (torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        with TF32Precision().forward_context("cpu"):
            assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision = saved


# ------------------------------------------------------------------------------------- tf32 backward
class _Tf32AnyDevice(TF32Precision):
    """tf32 with its device check lifted, so the engine's use of its contexts runs on the CPU."""

    def _support(self, device: torch.device) -> Support:
        return Support(True, True, "test: contexts only")


def _tf32_seen_in_forward_and_backward(engine_grad: bool) -> tuple[bool, bool]:
    from ampkit import Engine
    from ampkit._compat import cuda_allows_tf32

    model = mlp()
    engine = Engine(_Tf32AnyDevice())
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    seen: dict[str, bool] = {}
    x = torch.randn(4, 6, requires_grad=engine_grad)
    with engine.autocast():
        hidden = model[0](x)
        seen["forward"] = cuda_allows_tf32("matmul")
        # The hook runs when the backward reaches this tensor: the matmuls beneath it run under the same setting.
        hidden.register_hook(lambda g: seen.__setitem__("backward", cuda_allows_tf32("matmul")))
        loss = model[3](model[2](model[1](hidden))).sum()
    if engine_grad:
        engine.grad(loss, [x])
    else:
        engine.backward(loss)
    return seen["forward"], seen["backward"]


@pytest.mark.parametrize("engine_grad", [False, True], ids=["backward", "grad"])
def test_tf32_runs_the_backwards_matmuls_in_tf32_too(matmul_precision: None, engine_grad: bool) -> None:
    # The backward holds two of every three matmul FLOPs; it used to run outside the forward's context, in fp32.
    set_ieee_matmuls()
    forward, backward = _tf32_seen_in_forward_and_backward(engine_grad)
    assert (forward, backward) == (True, True)
    assert cuda_matmuls_are_ieee()  # the user's setting is back after the backward


def test_32_true_runs_its_backward_with_the_users_setting(matmul_precision: None) -> None:
    # Control: the plain policy's backward context changes nothing.
    set_ieee_matmuls()
    with FullPrecision().backward_context("cuda"):
        assert cuda_matmuls_are_ieee()
