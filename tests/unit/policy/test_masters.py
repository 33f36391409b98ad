"""fp32 master weights: cloned before the cast, swapped into the optimizer, and the model refreshed from them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.policy._masters import MasterWeights


def setup(dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> tuple[nn.Module, torch.optim.Optimizer, MasterWeights, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)).to(device)
    fp32 = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    masters = MasterWeights.clone(model.named_parameters(), [opt])
    model.to(dtype)
    return model, opt, masters, fp32


def test_masters_are_exact_fp32_copies_taken_before_the_cast(device: torch.device, half_dtype: torch.dtype) -> None:
    model, _, masters, fp32 = setup(half_dtype, device)
    assert masters.names == ["0.weight", "0.bias", "1.weight", "1.bias"]
    for m, ref in zip(masters.masters, fp32):
        assert m.dtype == torch.float32 and m.device == ref.device and torch.equal(m, ref)  # no 16-bit round trip
    assert all(p.dtype == half_dtype for p in model.parameters())


def test_optimizer_holds_the_masters_and_the_model_keeps_its_parameters() -> None:
    model, opt, masters, _ = setup()
    held = opt.param_groups[0]["params"]
    assert all(a is b for a, b in zip(held, masters.masters))
    assert all(a is b for a, b in zip(masters.model_params, model.parameters()))


def test_a_step_matches_an_fp32_step_then_rounds_into_the_model(device: torch.device, half_dtype: torch.dtype) -> None:
    model, opt, masters, fp32 = setup(half_dtype, device)
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(r.shape, generator=g).to(device) for r in fp32]
    for p, grad in zip(model.parameters(), grads):
        p.grad = grad.to(p.dtype)
    masters.copy_grads_to_masters()
    opt.step()
    masters.copy_masters_to_model()
    for m, p, ref, grad in zip(masters.masters, model.parameters(), fp32, grads):
        expected = ref.clone().add_(grad.to(half_dtype).float(), alpha=-0.1)  # SGD on fp32, 16-bit grad
        assert torch.equal(m, expected)
        assert torch.equal(p, expected.to(half_dtype))


def test_gradient_buffers_are_reused_between_steps() -> None:
    model, _, masters, _ = setup()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    masters.copy_grads_to_masters()
    first = [m.grad for m in masters.masters]
    masters.copy_grads_to_masters()
    assert all(a is m.grad for a, m in zip(first, masters.masters))


def test_missing_model_gradient_gives_the_master_none() -> None:
    model, _, masters, _ = setup()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    masters.copy_grads_to_masters()
    assert masters.masters[0].grad is not None and masters.masters[1].grad is None


def test_parameters_the_optimizer_does_not_hold_get_no_master() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    opt = torch.optim.SGD(model[1].parameters(), lr=0.1)
    masters = MasterWeights.clone(model.named_parameters(), [opt])
    assert masters.names == ["1.weight", "1.bias"]


def test_state_dict_round_trip_refreshes_the_model(device: torch.device) -> None:
    model, _, masters, fp32 = setup(device=device)
    state = {n: t.cpu() + 1.0 for n, t in masters.state_dict().items()}  # as a checkpoint loads: on the CPU
    masters.load_state_dict(state)
    for m, p, ref in zip(masters.masters, model.parameters(), fp32):
        assert m.device == ref.device and torch.equal(m, ref + 1.0) and torch.equal(p, (ref + 1.0).to(torch.bfloat16))


def test_state_dict_of_another_model_is_refused() -> None:
    _, _, masters, _ = setup()
    state = masters.state_dict()
    with pytest.raises(ValueError, match="missing"):
        masters.load_state_dict({k: v for k, v in state.items() if k != "0.bias"})
    state["0.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="shape"):
        masters.load_state_dict(state)
