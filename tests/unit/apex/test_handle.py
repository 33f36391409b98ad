"""amp.init(): Apex's process-wide O1 casts, its handle, banned functions, and the handle after initialize."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampkit.apex import amp
from ampkit.apex._state import _amp_state


def _autocast_state(device_type: str = "cpu") -> tuple:
    return (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type), torch.is_autocast_cache_enabled())


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_init_casts_process_wide_until_deactivated(half, device):
    before = _autocast_state(device.type)
    a, b = torch.randn(4, 4, device=device), torch.randn(4, 4, device=device)
    handle = amp.init(half_dtype=half)
    try:
        assert handle.is_active()
        # Outside any model: Apex's FP16 list runs in 16 bits, its FP32 list in fp32 even on 16-bit inputs.
        assert torch.mm(a, b).dtype == half
        assert nn.Linear(4, 4, device=device)(a).dtype == half
        assert torch.mv(a, b[0]).dtype == half  # on Apex's FP16 list; CPU autocast leaves it alone
        assert F.softmax(a.to(half), dim=-1).dtype == torch.float32
        assert a.to(half).sum().dtype == a.to(half).std().dtype == torch.float32
    finally:
        handle._deactivate()
    assert torch.mm(a, b).dtype == torch.float32
    assert F.softmax(a.to(half), dim=-1).dtype == half
    assert _autocast_state(device.type) == before


def test_init_values_match_the_16_bit_reference():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    handle = amp.init()
    try:
        got = torch.mm(a, b)
    finally:
        handle._deactivate()
    assert torch.equal(got, torch.mm(a.bfloat16(), b.bfloat16()))


def test_init_disabled_changes_nothing():
    before = _autocast_state()
    handle = amp.init(enabled=False)
    assert not handle.is_active()
    assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float32
    assert _autocast_state() == before
    loss = torch.ones(())
    with handle.scale_loss(loss, None) as scaled:
        assert scaled is loss
    handle._deactivate()
    assert not hasattr(_amp_state, "handle")  # Apex did not record a no-op handle either


def test_disable_casts_of_the_handle():
    handle = amp.init()
    try:
        with handle._disable_casts():
            assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float32
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.bfloat16
    finally:
        handle._deactivate()


def test_init_handle_is_recorded_and_initialize_o1_records_one():
    handle = amp.init()
    handle._deactivate()
    assert _amp_state.handle is handle
    m = nn.Linear(4, 4)
    m, _opt = amp.initialize(m, torch.optim.SGD(m.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    h = _amp_state.handle
    assert h is not handle and h.is_active()
    x = torch.randn(2, 4)
    with h._disable_casts():
        assert m(x).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    # Apex's tests end with _amp_state.handle._deactivate(): the model's casts stop, the model still runs.
    h._deactivate()
    assert not h.is_active()
    assert torch.equal(m(x), nn.functional.linear(x, m.weight, m.bias))


# ------------------------------------------------------------------------------------------ banned functions
def _bce_calls(half: torch.dtype):
    target = torch.rand(4, 3)
    return [lambda x: nn.BCELoss()(x, target), lambda x: F.binary_cross_entropy(x, target)]


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_bce_on_16_bit_inputs_raises_apex_message_under_init(half):
    handle = amp.init(half_dtype=half)
    try:
        for fn in _bce_calls(half):
            with pytest.raises(NotImplementedError, match="(?s)BCEWithLogitsLoss.*allow_banned=True"):
                fn(torch.rand(4, 3).to(half))
            assert fn(torch.rand(4, 3)).dtype == torch.float32  # fp32 inputs are fine, as in Apex
    finally:
        handle._deactivate()


def test_bce_runs_in_fp32_with_allow_banned():
    x = torch.rand(4, 3)
    target = torch.rand(4, 3)
    reference = F.binary_cross_entropy(x.bfloat16().float(), target)
    handle = amp.init(allow_banned=True)
    try:
        got = F.binary_cross_entropy(x.bfloat16(), target)
    finally:
        handle._deactivate()
    assert got.dtype == torch.float32
    assert torch.equal(got, reference)


def test_bce_inside_an_o1_forward_is_banned_too():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x, target):
            return F.binary_cross_entropy(torch.sigmoid(self.fc(x)), target)

    m = Net()
    m, _ = amp.initialize(m, torch.optim.SGD(m.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    with pytest.raises(NotImplementedError, match="BCEWithLogitsLoss"):
        m(torch.randn(2, 3), torch.rand(2, 3))


def test_in_place_fp32_list_function_on_16_bit_raises():
    x = torch.randn(4)
    handle = amp.init()
    try:
        x.exp_()  # fp32: fine
        with pytest.raises(NotImplementedError, match=r"in-place function exp_ with torch.bfloat16.*x.exp\("):
            x.bfloat16().exp_()
        with pytest.raises(NotImplementedError, match="log_"):
            torch.log_(x.bfloat16())
    finally:
        handle._deactivate()
    assert x.bfloat16().exp_().dtype == torch.bfloat16  # untouched once deactivated
