"""Steps fake tensors cannot run: the grouped matmul of MoE experts in fp32 runs; a value-dependent shape is named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.memory import EstimateError, estimate, measure
from ampkit.memory._fake import FakeCopies

if not hasattr(torch, "_grouped_mm"):
    pytest.skip("Requires: torch._grouped_mm (torch 2.8+)", allow_module_level=True)


class _Experts(nn.Module):
    """Two experts applied to consecutive row groups by one grouped matmul, as transformers' MoE layers run them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weight, self.head = nn.Parameter(torch.randn(2, 8, 16) * 0.1), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offsets = torch.tensor([x.shape[0] // 2, x.shape[0]], dtype=torch.int32)
        return self.head(torch._grouped_mm(x, self.weight, offs=offsets))


def test_fp32_grouped_matmul_runs_on_fake_tensors_with_the_real_kernels_dtype() -> None:
    x = torch.randn(6, 8)
    real = _Experts()(x)
    with FakeCopies() as fake:
        out = fake.model(_Experts(), torch.device("cpu"))(fake.tensor(x, torch.device("cpu")))
    assert (out.shape, out.dtype) == (real.shape, real.dtype) == (torch.Size([6, 4]), torch.float32)


@pytest.mark.parametrize("policy", ["32-true", "bf16-mixed"])
def test_an_fp32_experts_layer_is_estimated_to_the_byte(policy: str) -> None:
    batch = (torch.randn(6, 8), torch.randint(0, 4, (6,)))
    e, m = estimate(_Experts(), batch, policy=policy), measure(_Experts(), batch, policy=policy)
    assert (e.total, e.activations, e.peak) == (m.total, m.activations, m.peak)


class _Router(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.score, self.head = nn.Linear(8, 1), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[self.score(x).squeeze(-1) > 0]  # as many rows as score positive: known only from the values
        return self.head(torch.cat([kept, x]))[-x.shape[0]:]


def test_a_value_dependent_shape_raises_estimate_error_naming_the_op_and_measure() -> None:
    batch = (torch.randn(6, 8), torch.randint(0, 4, (6,)))
    with pytest.raises(EstimateError, match=r"cannot run the bf16-mixed step on fake tensors \(.*nonzero.*measure\(\) runs") as caught:
        estimate(_Router(), batch, policy="bf16-mixed")
    assert caught.value.policy == "bf16-mixed" and "nonzero" in caught.value.reason
    assert measure(_Router(), batch, policy="bf16-mixed").peak > 0  # the real step runs
