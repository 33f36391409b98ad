"""Clipping helpers: dense results equal torch's own; sparse gradients are clipped by the same global norm; fp16
gradients are clipped by their true norm. Device-generic: data is drawn on the CPU and moved to ``device``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.training._clipping import clip_grad_norm, clip_grad_value


def dense_and_sparse(device: torch.device, seed: int = 0) -> tuple[nn.Parameter, nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    dense = nn.Parameter(torch.zeros(4, 3, device=device))
    dense.grad = torch.randn(4, 3, generator=g).to(device)
    sparse = nn.Parameter(torch.zeros(10, 3, device=device))
    # Row 2 appears twice: the norm must be of the summed row, not of the two entries apart.
    sparse.grad = torch.sparse_coo_tensor(
        torch.tensor([[2, 2, 7]]), torch.randn(3, 3, generator=g), (10, 3), check_invariants=True
    ).to(device)
    return dense, sparse


def test_dense_matches_torch_clip_grad_norm_exactly(device: torch.device) -> None:
    a = [nn.Parameter(torch.zeros(5, device=device)) for _ in range(3)]
    b = [nn.Parameter(torch.zeros(5, device=device)) for _ in range(3)]
    for i, (p, q) in enumerate(zip(a, b)):
        p.grad = torch.arange(5.0, device=device) * (i + 1)
        q.grad = p.grad.clone()
    norm = clip_grad_norm(a, 2.0)
    ref = torch.nn.utils.clip_grad_norm_(b, 2.0)
    assert torch.equal(norm, ref)
    for p, q in zip(a, b):
        assert torch.equal(p.grad, q.grad)


def test_sparse_is_clipped_like_its_dense_equivalent(device: torch.device) -> None:
    dense, sparse = dense_and_sparse(device)
    d2, s2 = nn.Parameter(torch.zeros(4, 3, device=device)), nn.Parameter(torch.zeros(10, 3, device=device))
    d2.grad, s2.grad = dense.grad.clone(), sparse.grad.to_dense()
    norm = clip_grad_norm([dense, sparse], 0.5)
    ref = torch.nn.utils.clip_grad_norm_([d2, s2], 0.5)
    assert norm.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(dense.grad, d2.grad, rtol=1e-6)
    assert torch.allclose(sparse.grad.to_dense(), s2.grad, rtol=1e-6)


def test_norm_below_the_limit_leaves_gradients_alone(device: torch.device) -> None:
    dense, sparse = dense_and_sparse(device)
    before = dense.grad.clone(), sparse.grad.to_dense()
    clip_grad_norm([dense, sparse], 1e6)
    assert torch.allclose(dense.grad, before[0]) and torch.allclose(sparse.grad.to_dense(), before[1])


def test_parameters_without_gradients_are_ignored(device: torch.device) -> None:
    p, q = nn.Parameter(torch.zeros(2, device=device)), nn.Parameter(torch.zeros(2, device=device))
    p.grad = torch.tensor([3.0, 4.0], device=device)
    assert clip_grad_norm([p, q], 1.0).item() == pytest.approx(5.0)
    assert q.grad is None


@pytest.mark.parametrize("with_sparse", [False, True])
def test_fp16_gradients_are_clipped_by_their_true_norm(device: torch.device, with_sparse: bool) -> None:
    """Every fp16 gradient finite, their norm past fp16's 65504: control is the same clip on fp32 copies."""
    g = torch.Generator().manual_seed(3)
    half = [nn.Parameter(torch.zeros(n, dtype=torch.float16, device=device)) for n in (4096, 777)]
    for p in half:
        p.grad = (torch.randn(p.numel(), generator=g) * 3000).to(device=device, dtype=torch.float16)
    params = list(half)
    if with_sparse:
        params.extend(dense_and_sparse(device)[1:])
    assert all(torch.isfinite(p.grad if not p.grad.is_sparse else p.grad._values()).all() for p in params)
    control = [nn.Parameter(torch.zeros(p.shape, device=device)) for p in params]
    for c, p in zip(control, params):
        c.grad = p.grad.float().to_dense() if p.grad.is_sparse else p.grad.float()
    ref = torch.nn.utils.clip_grad_norm_(control, 1.0)
    assert ref.item() > 65504
    norm = clip_grad_norm(params, 1.0)
    assert norm.dtype == torch.float32
    torch.testing.assert_close(norm, ref, rtol=1e-5, atol=0)
    for c, p in zip(control, params):
        got = p.grad.to_dense() if p.grad.is_sparse else p.grad
        torch.testing.assert_close(got.float(), c.grad, rtol=2e-3, atol=1e-5)  # one fp16 rounding apart


def test_clip_grad_value_dense_and_sparse(device: torch.device) -> None:
    dense, sparse = dense_and_sparse(device)
    expected_sparse = sparse.grad.coalesce().to_dense().clamp(-0.3, 0.3)
    expected_dense = dense.grad.clamp(-0.3, 0.3)
    clip_grad_value([dense, sparse], 0.3)
    assert torch.equal(dense.grad, expected_dense)
    assert torch.equal(sparse.grad.to_dense(), expected_sparse)  # clamped after summing duplicates
