"""Clipping helpers: dense results equal torch's own; sparse gradients are clipped by the same global norm."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.clipping import clip_grad_norm, clip_grad_value


def dense_and_sparse(seed: int = 0) -> tuple[nn.Parameter, nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    dense = nn.Parameter(torch.zeros(4, 3))
    dense.grad = torch.randn(4, 3, generator=g)
    sparse = nn.Parameter(torch.zeros(10, 3))
    # Row 2 appears twice: the norm must be of the summed row, not of the two entries apart.
    sparse.grad = torch.sparse_coo_tensor(torch.tensor([[2, 2, 7]]), torch.randn(3, 3, generator=g), (10, 3), check_invariants=True)
    return dense, sparse


def test_dense_matches_torch_clip_grad_norm_exactly() -> None:
    a = [nn.Parameter(torch.zeros(5)) for _ in range(3)]
    b = [nn.Parameter(torch.zeros(5)) for _ in range(3)]
    for i, (p, q) in enumerate(zip(a, b)):
        p.grad = torch.arange(5.0) * (i + 1)
        q.grad = p.grad.clone()
    norm = clip_grad_norm(a, 2.0)
    ref = torch.nn.utils.clip_grad_norm_(b, 2.0)
    assert torch.equal(norm, ref)
    for p, q in zip(a, b):
        assert torch.equal(p.grad, q.grad)


def test_sparse_is_clipped_like_its_dense_equivalent() -> None:
    dense, sparse = dense_and_sparse()
    d2, s2 = nn.Parameter(torch.zeros(4, 3)), nn.Parameter(torch.zeros(10, 3))
    d2.grad, s2.grad = dense.grad.clone(), sparse.grad.to_dense()
    norm = clip_grad_norm([dense, sparse], 0.5)
    ref = torch.nn.utils.clip_grad_norm_([d2, s2], 0.5)
    assert norm.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(dense.grad, d2.grad, rtol=1e-6)
    assert torch.allclose(sparse.grad.to_dense(), s2.grad, rtol=1e-6)


def test_norm_below_the_limit_leaves_gradients_alone() -> None:
    dense, sparse = dense_and_sparse()
    before = dense.grad.clone(), sparse.grad.to_dense()
    clip_grad_norm([dense, sparse], 1e6)
    assert torch.allclose(dense.grad, before[0]) and torch.allclose(sparse.grad.to_dense(), before[1])


def test_parameters_without_gradients_are_ignored() -> None:
    p, q = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([3.0, 4.0])
    assert clip_grad_norm([p, q], 1.0).item() == pytest.approx(5.0)
    assert q.grad is None


def test_clip_grad_value_dense_and_sparse() -> None:
    dense, sparse = dense_and_sparse()
    expected_sparse = sparse.grad.coalesce().to_dense().clamp(-0.3, 0.3)
    expected_dense = dense.grad.clamp(-0.3, 0.3)
    clip_grad_value([dense, sparse], 0.3)
    assert torch.equal(dense.grad, expected_dense)
    assert torch.equal(sparse.grad.to_dense(), expected_sparse)  # clamped after summing duplicates
