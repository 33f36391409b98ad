"""O1's casts: which ops run in 16 bits and which in fp32, custom-op registration, disable_casts."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampkit.apex import amp
from ampkit.apex._casts import cast_function


class OpProbe(nn.Module):
    """Runs representative ops on fp32 inputs and records each result's dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.ln = nn.LayerNorm(8)
        self.gn = nn.GroupNorm(2, 2)
        self.seen: dict[str, torch.dtype] = {}

    def forward(self, x: torch.Tensor, img: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        s = self.seen
        h = self.fc(x)
        s["linear"] = h.dtype
        s["conv"] = self.conv(img).dtype
        s["matmul"] = torch.matmul(x, x.t()).dtype
        s["@"] = (x @ x.t()).dtype
        s["mm"] = torch.mm(x, x.t()).dtype
        s["bmm"] = torch.bmm(x[None], x.t()[None]).dtype
        # fp32-list ops, fed the 16-bit output of the linear layer
        s["softmax"] = F.softmax(h, dim=-1).dtype
        s["log_softmax"] = h.log_softmax(dim=-1).dtype
        s["layer_norm"] = self.ln(h).dtype
        s["group_norm"] = self.gn(self.conv(img)).dtype
        s["sum"] = h.sum().dtype
        s["torch.sum"] = torch.sum(h).dtype
        s["pow"] = h.pow(2).dtype
        s["**"] = (h**2).dtype
        s["exp"] = torch.exp(h).dtype
        s["norm"] = h.norm().dtype
        s["std"] = h.std().dtype
        s["var"] = torch.var(h, dim=0).dtype
        s["cross_entropy"] = F.cross_entropy(h, target).dtype
        s["mse_loss"] = F.mse_loss(h, torch.zeros_like(h)).dtype
        # promotion: a 16-bit and an fp32 input meet
        s["add mixed"] = (h + x).dtype
        s["cat mixed"] = torch.cat([h, x]).dtype
        s["addcmul mixed"] = torch.addcmul(x, h, h).dtype
        s["add 16-bit"] = (h + h).dtype
        return h


HALF_OPS = ["linear", "conv", "matmul", "@", "mm", "bmm", "add 16-bit"]
FP32_OPS = ["softmax", "log_softmax", "layer_norm", "group_norm", "sum", "torch.sum", "pow", "**", "exp", "norm", "std", "var", "cross_entropy", "mse_loss"]
PROMOTED = ["add mixed", "cat mixed", "addcmul mixed"]


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_o1_op_output_dtypes(half, device):
    probe = OpProbe().to(device)
    opt = torch.optim.SGD(probe.parameters(), lr=0.1)
    probe, opt = amp.initialize(probe, opt, opt_level="O1", verbosity=0, half_dtype=half)
    g = torch.Generator().manual_seed(0)
    x, img = torch.randn(4, 8, generator=g).to(device), torch.randn(1, 2, 5, 5, generator=g).to(device)
    out = probe(x, img, torch.tensor([0, 1, 2, 3], device=device))
    seen = probe.seen
    assert {k: seen[k] for k in HALF_OPS} == {k: half for k in HALF_OPS}
    assert {k: seen[k] for k in FP32_OPS} == {k: torch.float32 for k in FP32_OPS}
    assert {k: seen[k] for k in PROMOTED} == {k: torch.float32 for k in PROMOTED}
    assert out.dtype == torch.float32  # outputs leave in fp32 so the loss outside runs in fp32
    assert probe.fc.weight.dtype == torch.float32  # O1 never touches the weights


def test_o1_casts_apply_only_inside_the_model():
    probe = nn.Linear(4, 4)
    probe, _ = amp.initialize(probe, torch.optim.SGD(probe.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    x = torch.randn(2, 4)
    assert (x @ x.t()).dtype == torch.float32
    assert not torch.is_autocast_enabled("cpu")


def test_cast_model_outputs_overrides_the_fp32_outputs():
    m = nn.Linear(4, 4)
    m, _ = amp.initialize(m, torch.optim.SGD(m.parameters(), lr=0.1), opt_level="O1", verbosity=0, cast_model_outputs=torch.bfloat16)
    assert m(torch.randn(2, 4)).dtype == torch.bfloat16


class UsesCustomOp(nn.Module):
    def __init__(self, ops: types.SimpleNamespace) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.ops = ops
        self.seen: dict[str, torch.dtype] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # 16-bit
        self.seen["half_op"] = self.ops.half_op(x, x).dtype  # fp32 inputs
        self.seen["float_op"] = self.ops.float_op(h, h).dtype
        self.seen["promote_op"] = self.ops.promote_op(h, x).dtype
        return h


def test_registered_functions_cast_inside_o1_even_when_registered_after_initialize():
    # The ops run without autocast inside (torch.mul is not an autocast op anyway), so their result dtype is
    # exactly the dtype they were cast to.
    ops = types.SimpleNamespace(half_op=torch.mul, float_op=torch.mul, promote_op=torch.mul)
    model = UsesCustomOp(ops)
    model, _ = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    amp.register_half_function(ops, "half_op")
    amp.register_float_function(ops, "float_op")
    amp.register_promote_function(ops, "promote_op")
    model(torch.randn(2, 4))
    assert model.seen == {"half_op": torch.bfloat16, "float_op": torch.float32, "promote_op": torch.float32}
    # Outside the model the registered functions behave exactly as before.
    assert ops.half_op(torch.ones(1), torch.ones(1)).dtype == torch.float32


def test_registering_twice_replaces_the_kind_instead_of_stacking():
    ops = types.SimpleNamespace(op=torch.mul)
    amp.register_half_function(ops, "op")
    amp.register_float_function(ops, "op")
    assert ops.op.__wrapped__ is torch.mul
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ops.op(torch.ones(1, dtype=torch.bfloat16), 2.0).dtype == torch.float32


def test_decorators():
    @amp.half_function
    def h(a, b):
        return a * b

    @amp.float_function
    def f(a, b):
        return a * b

    @amp.promote_function
    def p(a, b):
        return a * b

    a32, a16 = torch.ones(2), torch.ones(2, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert h(a32, a32).dtype == torch.bfloat16
        assert f(a16, a16).dtype == torch.float32
        assert p(a16, a32).dtype == torch.float32
        assert p(a16, a16).dtype == torch.bfloat16
    assert h(a32, a32).dtype == torch.float32  # no autocast: untouched
    assert h.__name__ == "h"


def test_promote_of_fp16_and_bf16_goes_to_fp32():
    p = cast_function(torch.add, "promote")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert p(torch.ones(1, dtype=torch.float16), torch.ones(1, dtype=torch.bfloat16)).dtype == torch.float32


def test_register_unknown_function_names_the_module():
    with pytest.raises(ValueError, match="No function named 'nope' in torch"):
        amp.register_half_function(torch, "nope")


def test_disable_casts_inside_an_o1_forward():
    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.inside: torch.dtype | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with amp.disable_casts():
                self.inside = self.fc(x).dtype
            return self.fc(x)

    m = Probe()
    m, _ = amp.initialize(m, torch.optim.SGD(m.parameters(), lr=0.1), opt_level="O1", verbosity=0, cast_model_outputs=torch.bfloat16)
    assert m(torch.randn(2, 4)).dtype == torch.bfloat16
    assert m.inside == torch.float32


def test_on_cuda_the_functions_its_autocast_leaves_16_bit_are_cast_to_fp32(monkeypatch: pytest.MonkeyPatch):
    # What the mode decides for CUDA tensors, seen on the CPU: the inputs are reported as CUDA ones under CUDA
    # autocast, so the mode leaves to autocast what CUDA's casts itself and upcasts only where it does not
    # (std and var, which Apex ran in fp32, stayed fp16 under O1 on CUDA).
    from ampkit.apex import _o1_functions
    from ampkit.apex._o1_functions import O1Functions

    monkeypatch.setattr(_o1_functions, "device_type_of", lambda args, kwargs: "cuda")
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: device_type == "cuda")
    h = torch.randn(4, 8).to(torch.bfloat16)
    with O1Functions():
        assert torch.std(h).dtype == h.var(dim=0).dtype == torch.float32
        assert F.local_response_norm(h[None], 2).dtype == F.multilabel_soft_margin_loss(h, (h > 0).float()).dtype == torch.float32
        assert torch.exp(h).dtype == h.sum().dtype == torch.bfloat16  # CUDA's autocast casts these itself
