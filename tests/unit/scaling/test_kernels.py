"""unscale_grads_ and grads_of: fused unscale + non-finite check, sparse handling as in torch's GradScaler.

Device-generic: data is drawn on the CPU from seeded generators and moved to ``device``; controls are computed on
the same device.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.scaling import _kernels as kernels
from ampkit.scaling._kernels import grads_of, unscale_grads_

INF = float("inf")
NAN = float("nan")


def _randn(*shape, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 1000).to(device=device, dtype=dtype)


def _sparse(indices, values, size):
    # check_invariants given explicitly: torch warns (an error under our filterwarnings) when left implicit.
    return torch.sparse_coo_tensor(indices, values, size, check_invariants=True)


def _zero(device):
    return torch.zeros((), device=device)


def _t(values, device, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype, device=device)


@pytest.mark.parametrize("inv", [2.0**-7, 1.0 / 3.0, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_unscale_multiplies_by_inv_scale(device, dtype, inv):
    # bfloat16 on CUDA goes through the foreach fallback (the kernel has no bf16 overload): same control.
    grads = [_randn(5, 3, dtype=dtype, seed=1, device=device), _randn(7, dtype=dtype, seed=2, device=device)]
    inv_scale = torch.tensor(inv, dtype=torch.float32, device=device)
    # Control: the same multiply done out of place by ordinary eager ops (fp32 math, rounded to dtype).
    expected = [(g.float() * inv_scale).to(dtype) for g in grads]
    found = _zero(device)
    out = unscale_grads_(grads, inv_scale, found)
    assert out is found
    assert found.item() == 0.0
    for g, e in zip(grads, expected):
        assert g.dtype == dtype
        assert torch.equal(g, e)


def test_unscale_is_in_place_on_the_given_tensors(device):
    p = nn.Parameter(torch.zeros(4, device=device))
    p.grad = _t([2.0, 4.0, 8.0, 16.0], device)
    grad_before = p.grad
    unscale_grads_([p.grad], _t(0.5, device), _zero(device))
    assert p.grad is grad_before
    assert torch.equal(p.grad, _t([1.0, 2.0, 4.0, 8.0], device))


@pytest.mark.parametrize("bad", [INF, -INF, NAN])
@pytest.mark.parametrize("where", [0, 1, 2])
def test_nonfinite_sets_found_inf(device, bad, where):
    grads = [_randn(4, seed=i, device=device) for i in range(3)]
    grads[where][2] = bad
    found = _zero(device)
    unscale_grads_(grads, _t(0.25, device), found)
    assert found.item() == 1.0


def test_finite_grads_leave_found_inf_zero_and_do_not_clear_it(device):
    found = _zero(device)
    unscale_grads_([_randn(8, device=device), _randn(3, 3, seed=4, device=device)], _t(0.5, device), found)
    assert found.item() == 0.0
    # found_inf accumulates across calls (several groups, several optimizers): a finite batch must not reset it.
    found.fill_(1.0)
    unscale_grads_([_randn(8, device=device)], _t(0.5, device), found)
    assert found.item() == 1.0


def test_check_only_with_inv_scale_one_leaves_grads_unchanged(device):
    grads = [_t([3.0, -5.0, 7.0], device), _t([1.0, INF], device)]
    before = [g.clone() for g in grads]
    found = _zero(device)
    unscale_grads_(grads, torch.ones((), device=device), found)
    assert found.item() == 1.0
    for g, b in zip(grads, before):
        assert torch.equal(g, b)


@pytest.mark.parametrize("bad_in", [None, "fp32", "half"])
def test_mixed_float32_and_half(device, half_dtype, bad_in):
    g32 = _randn(6, seed=5, device=device)
    g16 = _randn(2, 3, dtype=half_dtype, seed=6, device=device)
    if bad_in == "fp32":
        g32[0] = INF
    elif bad_in == "half":
        g16[1, 2] = NAN
    inv_scale = _t(2.0**-3, device)
    expected32 = g32 * inv_scale
    expected16 = (g16.float() * inv_scale).to(half_dtype)
    found = _zero(device)
    unscale_grads_([g32, g16], inv_scale, found)
    assert found.item() == (0.0 if bad_in is None else 1.0)
    assert g32.dtype == torch.float32 and g16.dtype == half_dtype
    assert torch.equal(g32, expected32)  # may hold inf, never NaN: torch.equal is exact
    # NaN != NaN, so compare the NaN mask and the finite part separately.
    assert torch.equal(g16.isnan(), expected16.isnan())
    finite = ~expected16.isnan()
    assert torch.equal(g16[finite], expected16[finite])


def test_empty_list_is_a_no_op(device):
    found = _zero(device)
    assert unscale_grads_([], _t(0.5, device), found) is found
    assert found.item() == 0.0


def test_the_kernel_is_handed_one_dtype_at_a_time(device, half_dtype, monkeypatch):
    """CUDA's kernel dispatches on its first tensor's dtype (and its fast route needs one dtype): GradScaler groups by
    (device, dtype), and so must we."""
    calls = []
    real = torch._amp_foreach_non_finite_check_and_unscale_

    def spy(group, found, inv):
        calls.append({g.dtype for g in group})
        return real(group, found, inv)

    monkeypatch.setattr(kernels, "amp_non_finite_check_and_unscale_", spy)
    monkeypatch.setattr(kernels, "_KERNEL_LACKS", set())
    grads = [_randn(4, device=device), _randn(3, dtype=half_dtype, device=device), _randn(5, seed=2, device=device)]
    unscale_grads_(grads, _t(0.5, device), _zero(device))
    assert calls and all(len(dtypes) == 1 for dtypes in calls)
    assert sorted(str(next(iter(d))) for d in calls) == sorted({str(g.dtype) for g in grads})


@pytest.mark.parametrize("bad", [None, INF, NAN])
@pytest.mark.parametrize("inv", [2.0**-7, 1.0 / 3.0, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_foreach_fallback_equals_the_kernel_bitwise(device, dtype, inv, bad, monkeypatch):
    """Control: torch's kernel on a dtype it has. Treatment: the fallback ampkit takes for dtypes it lacks."""
    grads = [_randn(5, 3, dtype=dtype, seed=1, device=device), _randn(1031, dtype=dtype, seed=2, device=device)]
    if bad is not None:
        grads[1][700] = bad
    control = [g.clone() for g in grads]
    found_control = _zero(device)
    torch._amp_foreach_non_finite_check_and_unscale_(control, found_control, _t(inv, device))
    monkeypatch.setattr(kernels, "_KERNEL_LACKS", {(device.type, dtype)})
    found = _zero(device)
    unscale_grads_(grads, _t(inv, device), found)
    assert found.item() == found_control.item() == (0.0 if bad is None else 1.0)
    for g, c in zip(grads, control):
        assert torch.equal(g.isnan(), c.isnan())
        assert torch.equal(g[~g.isnan()], c[~c.isnan()])


def test_a_dtype_the_kernel_refuses_falls_back_once(device, monkeypatch):
    """As torch's CUDA kernel refuses bfloat16: NotImplementedError from the dispatch, before any tensor is touched."""
    refused = []
    real = torch._amp_foreach_non_finite_check_and_unscale_

    def no_fp16(group, found, inv):
        if group[0].dtype == torch.float16:
            refused.append(len(group))
            raise NotImplementedError('"_amp_foreach_non_finite_check_and_unscale_cuda" not implemented for \'Half\'')
        return real(group, found, inv)

    monkeypatch.setattr(kernels, "amp_non_finite_check_and_unscale_", no_fp16)
    monkeypatch.setattr(kernels, "_KERNEL_LACKS", set())
    for step in range(2):
        g16 = _t([2.0, 6.0, INF if step else 4.0], device, torch.float16)
        g32 = _t([8.0], device)
        found = _zero(device)
        unscale_grads_([g16, g32], _t(0.5, device), found)
        assert found.item() == float(step)
        assert torch.equal(g16[:2], _t([1.0, 3.0], device, torch.float16)) and g32.item() == 4.0
    assert refused == [1]  # tried once, remembered
    assert kernels._KERNEL_LACKS == {(device.type, torch.float16)}


# --- grads_of -------------------------------------------------------------------------------------------


def test_grads_of_dense_returns_the_grads_themselves_and_skips_none():
    a = nn.Parameter(torch.ones(2))
    b = nn.Parameter(torch.ones(3))  # grad stays None
    c = nn.Parameter(torch.ones(4))
    a.grad = torch.full((2,), 2.0)
    c.grad = torch.full((4,), 3.0)
    out = grads_of([a, b, c])
    assert len(out) == 2
    assert out[0] is a.grad and out[1] is c.grad


def test_grads_of_all_none_is_empty():
    assert grads_of([nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(1))]) == []


def _embedding_with_sparse_grad():
    torch.manual_seed(0)
    emb = nn.Embedding(6, 3, sparse=True)
    (emb(torch.tensor([1, 4, 1, 2])) * torch.arange(12.0).view(4, 3)).sum().backward()
    assert emb.weight.grad.is_sparse
    return emb


def test_grads_of_sparse_returns_values_which_alias_the_grad():
    emb = _embedding_with_sparse_grad()
    dense_before = emb.weight.grad.to_dense()
    (values,) = grads_of(emb.parameters())
    assert not values.is_sparse
    assert torch.equal(values, emb.weight.grad._values())
    # Unscaling the returned values must unscale the parameter's sparse grad itself.
    found = torch.zeros(())
    unscale_grads_([values], torch.tensor(0.5), found)
    assert found.item() == 0.0
    assert torch.equal(emb.weight.grad.to_dense(), dense_before * 0.5)


def test_inf_in_sparse_grad_values_is_detected():
    emb = _embedding_with_sparse_grad()
    emb.weight.grad._values()[1, 0] = INF
    found = torch.zeros(())
    unscale_grads_(grads_of(emb.parameters()), torch.tensor(0.5), found)
    assert found.item() == 1.0


def test_grads_of_coalesces_uncoalesced_fp16_sparse_grad():
    p = nn.Parameter(torch.zeros(4, dtype=torch.float16))
    p.grad = _sparse(torch.tensor([[0, 2, 0]]), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16), (4,))
    assert not p.grad.is_coalesced()
    (values,) = grads_of([p])
    assert p.grad.is_coalesced()
    assert torch.equal(p.grad._indices(), torch.tensor([[0, 2]]))
    assert torch.equal(values, torch.tensor([4.0, 2.0], dtype=torch.float16))
    assert torch.equal(values, p.grad._values())
    # The returned values alias the (new, coalesced) p.grad.
    unscale_grads_([values], torch.tensor(0.5), torch.zeros(()))
    assert torch.equal(p.grad.to_dense(), torch.tensor([2.0, 0.0, 1.0, 0.0], dtype=torch.float16))


def test_fp16_sparse_overflow_hidden_by_duplicate_indices_is_detected():
    # Each value is finite in fp16 (max 65504), but the summed gradient at index 1 is not.
    p = nn.Parameter(torch.zeros(3, dtype=torch.float16))
    values = torch.tensor([40000.0, 40000.0], dtype=torch.float16)
    p.grad = _sparse(torch.tensor([[1, 1]]), values, (3,))
    assert bool(torch.isfinite(p.grad._values()).all())
    found = torch.zeros(())
    unscale_grads_(grads_of([p]), torch.tensor(2.0**-4), found)
    assert found.item() == 1.0


def test_grads_of_mixes_dense_sparse_and_none_in_parameter_order():
    emb = _embedding_with_sparse_grad()
    lin = nn.Linear(3, 2)
    lin(torch.ones(1, 3)).sum().backward()
    lin.bias.grad = None
    out = grads_of([lin.weight, emb.weight, lin.bias])
    assert len(out) == 2
    assert out[0] is lin.weight.grad
    assert torch.equal(out[1], emb.weight.grad._values())
