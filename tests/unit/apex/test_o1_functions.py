"""O1Functions: the entries of Apex's lists that autocast does not cover (``.cpu()``, ``**``, ``gelu``, promotion
beside a 0-dim fp32 tensor...), each checked against the fp32 (or 16-bit) computation it stands for."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ampkit.apex import _o1_functions, amp
from ampkit.apex._o1_functions import CUDA_AUTOCAST_GAPS, FP32_FUNCTIONS, PROMOTE_FUNCTIONS, O1Functions

HALVES = [torch.bfloat16, torch.float16]


class _Ops(TorchDispatchMode):
    """The aten ops a block dispatches, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same type and bitwise the same values (torch.equal alone compares values across types)."""
    return a.dtype == b.dtype and torch.equal(a, b)


@pytest.fixture
def seen_as_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the mode decides for CUDA tensors, seen on the CPU: inputs reported as CUDA ones under CUDA autocast."""
    monkeypatch.setattr(_o1_functions, "device_type_of", lambda args, kwargs: "cuda")
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: device_type == "cuda")


@pytest.fixture
def init(request: pytest.FixtureRequest):
    """``amp.init`` in the test's 16-bit type, deactivated afterwards."""
    handle = amp.init(half_dtype=request.param)
    yield request.param
    handle._deactivate()


# ------------------------------------------------------------------------------------------------ Tensor.cpu
@pytest.mark.parametrize("init", HALVES, indirect=True)
def test_cpu_of_a_cpu_tensor_is_the_tensor_itself(init):
    # Apex cast only CUDA tensors, and on the CPU nothing is copied: x.cpu() stays x, 16-bit included.
    x = torch.randn(3, dtype=init)
    assert x.cpu() is x and x.cpu().dtype == init


def test_cpu_inside_an_o1_forward_on_the_cpu_keeps_the_16_bit_type():
    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.host: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            self.host = h.cpu()
            return h

    m = Probe()
    m, _ = amp.initialize(m, torch.optim.SGD(m.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    m(torch.randn(2, 4))
    assert m.host is not None and m.host.dtype == torch.bfloat16


@pytest.mark.parametrize("half", HALVES)
def test_cpu_of_an_accelerator_tensor_is_cast_to_fp32_before_the_copy(half, seen_as_cuda):
    x = torch.randn(4, 3).to(half).requires_grad_()
    with O1Functions():
        host = x.cpu()
        kept = torch.randn(2, dtype=torch.float64).cpu()
    assert host.dtype == torch.float32 and same(host, x.detach().float())
    assert kept.dtype == torch.float64  # Apex cast a CUDA double down to fp32 too; ampkit leaves it alone
    (host * torch.arange(3.0)).sum().backward()
    assert x.grad is not None and x.grad.dtype == half  # the cast is differentiable, as Apex's was
    assert same(x.grad, torch.arange(3.0).expand(4, 3).to(half))
    assert x.cpu().dtype == half  # outside O1 untouched


@pytest.mark.gpu
@pytest.mark.parametrize("half", HALVES)
def test_cpu_of_a_16_bit_cuda_tensor_is_fp32_under_o1(half, device):
    if device.type != "cuda":
        pytest.skip("Requires: [CUDA] (a device-to-host copy)")
    x = torch.randn(4, 3, device=device).to(half).requires_grad_()
    handle = amp.init(half_dtype=half)
    try:
        host = x.cpu()
        host.sum().backward()
    finally:
        handle._deactivate()
    assert host.device.type == "cpu" and host.dtype == torch.float32
    assert same(host, x.detach().float().cpu())
    assert x.grad is not None and x.grad.dtype == half
    assert x.cpu().dtype == half  # once deactivated, torch's own .cpu()

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.host: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)  # 16-bit under O1
            self.host = h.cpu()
            return h

    m = Probe().to(device)
    m, _ = amp.initialize(m, torch.optim.SGD(m.parameters(), lr=0.1), opt_level="O1", verbosity=0, half_dtype=half)
    m(torch.randn(2, 3, device=device))
    assert m.host is not None and m.host.dtype == torch.float32


# ------------------------------------------------------------------------------------------------ fp32 entries
@pytest.mark.parametrize("init", HALVES, indirect=True)
def test_reflected_and_augmented_power_run_in_fp32(init):
    h = torch.rand(5, dtype=init) + 0.5
    assert same(2 ** h, 2 ** h.float())  # Tensor.__rpow__, on Apex's tensor fp32 list
    y = h
    y **= 3  # Tensor.__ipow__: a new fp32 tensor, the 16-bit one is left as it was
    assert y.dtype == torch.float32 and same(y, h.float() ** 3)
    assert h.dtype == init and y is not h
    with pytest.raises(NotImplementedError, match="pow_"):
        h.pow_(2)  # the in-place form still refuses a 16-bit self, as Apex's did


@pytest.mark.parametrize("init", HALVES, indirect=True)
def test_gelu_runs_in_fp32(init):
    h = torch.randn(6, dtype=init)
    assert same(F.gelu(h), F.gelu(h.float()))
    assert same(nn.GELU(approximate="tanh")(h), F.gelu(h.float(), approximate="tanh"))


def test_on_cuda_gelu_grid_sample_and_ctc_loss_are_cast_to_fp32(seen_as_cuda):
    # CUDA's autocast has none of them on its fp32 list (grid_sampler only promotes, so 16-bit inputs stay 16-bit).
    h = torch.randn(1, 1, 4, 4).to(torch.bfloat16)
    grid = torch.zeros(1, 2, 2, 2, dtype=torch.bfloat16)
    log_probs = torch.randn(5, 2, 3).log_softmax(2).to(torch.bfloat16)
    targets, lengths, target_lengths = torch.tensor([[1, 1], [1, 2]]), torch.tensor([5, 5]), torch.tensor([2, 2])
    with O1Functions():
        assert F.gelu(h).dtype == torch.float32
        assert F.grid_sample(h, grid, align_corners=False).dtype == torch.float32
        assert F.ctc_loss(log_probs, targets, lengths, target_lengths).dtype == torch.float32
        assert (2 ** h).dtype == torch.bfloat16  # CUDA's autocast runs pow(Scalar, Tensor) in fp32 itself


# ------------------------------------------------------------------------------------------------ promotion
@pytest.mark.parametrize("init", HALVES, indirect=True)
def test_a_16_bit_tensor_beside_a_0_dim_fp32_one_runs_in_fp32(init):
    h, w = torch.randn(4, dtype=init), torch.tensor(0.3)
    # torch alone keeps these 16-bit (a 0-dim tensor does not widen a dimensioned one); Apex ran them in fp32.
    assert same(h * w, h.float() * w)
    assert same(h / w, h.float() / w)
    assert same(h + w, h.float() + w) and same(w - h, w - h.float())
    assert same(torch.add(h, w, alpha=2), torch.add(h.float(), w, alpha=2))
    one, above = torch.ones(2, dtype=init), torch.tensor(1.0001)  # 1.0001 rounds to 1.0 in 16 bits
    assert not (one >= above).any()  # compared in fp32, as Apex did; torch alone would round `above` and say True
    assert same(torch.addcmul(h, h, w), torch.addcmul(h.float(), h.float(), w))
    assert (h * 0.3).dtype == init and (h * h).dtype == init  # Python scalars and one type: nothing to promote


@pytest.mark.parametrize("init", HALVES, indirect=True)
def test_promotion_that_torch_does_itself_adds_no_cast(init):
    h, x = torch.randn(4, 4, dtype=init), torch.randn(4, 4)
    with _Ops() as ops:
        out = h + x
    assert out.dtype == torch.float32 and ops.names == ["add"]  # no _to_copy of h: torch's kernel widens it


@pytest.mark.parametrize("init", HALVES, indirect=True)
def test_cross_dot_and_bilinear_of_mixed_types_run_in_fp32(init):
    # torch refuses mixed types here; Apex (and CUDA's autocast) promote them.
    h, x = torch.randn(4, 3, dtype=init), torch.randn(4, 3)
    weight = torch.randn(2, 3, 3)
    assert same(torch.cross(h, x, dim=1), torch.cross(h.float(), x, dim=1))
    assert same(torch.dot(h[0], x[0]), torch.dot(h[0].float(), x[0]))
    assert same(F.bilinear(h, x, weight), F.bilinear(h.float(), x, weight))


def test_fp16_beside_bf16_is_promoted_to_fp32():
    handle = amp.init()
    try:
        a, b = torch.randn(3, dtype=torch.float16), torch.tensor(2.0, dtype=torch.bfloat16)
        assert same(a * b, a.float() * b.float())
    finally:
        handle._deactivate()


def test_the_cuda_gaps_are_on_apex_lists_and_autocast_covers_the_rest(seen_as_cuda):
    assert CUDA_AUTOCAST_GAPS <= FP32_FUNCTIONS | PROMOTE_FUNCTIONS
    h, w = torch.randn(3).to(torch.bfloat16), torch.tensor(2.0)
    with O1Functions():
        assert (h * w).dtype == torch.float32  # not on CUDA autocast's lists: cast here
        assert torch.addcmul(h, h, w).dtype == torch.bfloat16  # on its promote list: left to autocast
