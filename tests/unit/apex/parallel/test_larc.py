"""LARC: the update equals Apex's per-parameter formula, written out here one parameter at a time."""

from __future__ import annotations

import pytest
import torch

from ampkit.apex.parallel.LARC import LARC


def _reference_grads(params, grads, lr: float, weight_decay: float, trust: float, clip: bool, eps: float) -> list[torch.Tensor]:
    """Apex's LARC gradient rescaling, per parameter, in plain tensor arithmetic."""
    out = []
    for p, g in zip(params, grads):
        p_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
        if p_norm != 0 and g_norm != 0:
            rate = trust * p_norm / (g_norm + p_norm * weight_decay + eps)
            if clip:
                rate = min(rate / lr, 1)
            g = (g + weight_decay * p) * rate
        out.append(g)
    return out


def _setup(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    params = [
        torch.nn.Parameter(torch.randn(6, 4, generator=gen)),
        torch.nn.Parameter(torch.randn(4, generator=gen) * 1e-3),  # small weights: clip mode scales this one
        torch.nn.Parameter(torch.zeros(3)),  # zero norm: gradient left as it is
        torch.nn.Parameter(torch.randn(5, generator=gen)),  # zero gradient: left as it is, no decay
        torch.nn.Parameter(torch.randn(2, generator=gen)),  # no gradient at all
    ]
    grads = [torch.randn(6, 4, generator=gen) * 10, torch.randn(4, generator=gen), torch.randn(3, generator=gen), torch.zeros(5), None]
    return params, grads


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_update_equals_apex_formula(clip: bool, weight_decay: float):
    lr, trust, eps = 0.1, 0.02, 1e-8
    params, grads = _setup()
    start = [p.detach().clone() for p in params]
    for p, g in zip(params, grads):
        p.grad = None if g is None else g.clone()
    opt = LARC(torch.optim.SGD(params, lr=lr, weight_decay=weight_decay), trust_coefficient=trust, clip=clip, eps=eps)
    opt.step()

    live = [(s, g) for s, g in zip(start, grads) if g is not None]
    expected = _reference_grads([s for s, _ in live], [g for _, g in live], lr, weight_decay, trust, clip, eps)
    it = iter(expected)
    for p, s, g in zip(params, start, grads):
        want = s if g is None else s - lr * next(it)
        torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
    # Zero weights: the raw gradient steps them (no rate, no decay); a zero gradient moves nothing.
    torch.testing.assert_close(params[2].detach(), -lr * grads[2], rtol=0, atol=0)
    torch.testing.assert_close(params[3].detach(), start[3], rtol=0, atol=0)
    # The group's weight decay is the user's again after the step.
    assert opt.param_groups[0]["weight_decay"] == weight_decay


def test_clip_mode_caps_at_group_lr():
    # Tiny gradient on a large weight: the local rate is huge, and clip mode caps it at the optimizer's lr.
    w = torch.nn.Parameter(torch.full((4,), 10.0))
    w.grad = torch.full((4,), 1e-6)
    LARC(torch.optim.SGD([w], lr=0.5), clip=True).step()
    torch.testing.assert_close(w.detach(), torch.full((4,), 10.0 - 0.5e-6))


def test_weight_decay_restored_when_inner_step_raises():
    w = torch.nn.Parameter(torch.ones(2))
    w.grad = torch.ones(2)
    inner = torch.optim.SGD([w], lr=0.1, weight_decay=0.3)

    def boom(*args, **kwargs):
        raise RuntimeError("inner failure")

    inner.step = boom  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="inner failure"):
        LARC(inner).step()
    assert inner.param_groups[0]["weight_decay"] == 0.3


def test_group_without_weight_decay_key_is_left_without_one():
    class Plain(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        def step(self, closure=None):
            for g in self.param_groups:
                assert "weight_decay" not in g
                for p in g["params"]:
                    p.data.add_(p.grad, alpha=-g["lr"])

    w = torch.nn.Parameter(torch.ones(2))
    w.grad = torch.ones(2)
    opt = LARC(Plain([w]))
    opt.step()
    assert "weight_decay" not in opt.param_groups[0]


def test_runs_on_foreach_kernels_not_per_parameter_norms(monkeypatch: pytest.MonkeyPatch):
    params, grads = _setup()
    for p, g in zip(params, grads):
        p.grad = g
    for name in ("norm",):
        monkeypatch.setattr(torch, name, lambda *a, **k: pytest.fail("per-parameter torch.norm called"))
    monkeypatch.setattr(torch.linalg, "vector_norm", lambda *a, **k: pytest.fail("per-parameter vector_norm called"))
    monkeypatch.setattr(torch.Tensor, "norm", lambda *a, **k: pytest.fail("per-parameter Tensor.norm called"))
    LARC(torch.optim.SGD(params, lr=0.1, weight_decay=0.01)).step()


def test_half_precision_norms_do_not_overflow():
    # ||p|| of this fp16 tensor is ~1e5, beyond fp16's range; LARC's norms are fp32.
    w = torch.nn.Parameter(torch.full((4096,), 2000.0, dtype=torch.float16))
    w.grad = torch.full((4096,), 1.0, dtype=torch.float16)
    LARC(torch.optim.SGD([w], lr=1.0), trust_coefficient=1e-3, clip=False).step()
    rate = 1e-3 * (2000.0 * 64) / (64 + 1e-8)
    torch.testing.assert_close(w.detach().float(), torch.full((4096,), 2000.0 - rate), rtol=1e-3, atol=0.0)


def test_duck_typed_optimizer_delegates():
    w = torch.nn.Parameter(torch.ones(3))
    inner = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    opt = LARC(inner, trust_coefficient=0.05, clip=False, eps=1e-6)
    assert opt.optim is inner and opt.param_groups is inner.param_groups and opt.state is inner.state and opt.defaults is inner.defaults
    assert "LARC(trust_coefficient=0.05, clip=False, eps=1e-06)" in repr(opt) and "SGD" in repr(opt)

    loss = opt.step(lambda: (w * w).sum().backward() or torch.tensor(7.0))  # closure makes the gradients
    assert loss.item() == 7.0 and w.grad is not None
    sd = opt.state_dict()
    assert sd == inner.state_dict() and "momentum_buffer" in sd["state"][0]
    fresh = LARC(torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1, momentum=0.9))
    fresh.load_state_dict(sd)
    torch.testing.assert_close(fresh.state_dict()["state"][0]["momentum_buffer"], sd["state"][0]["momentum_buffer"])

    opt.zero_grad()
    assert w.grad is None
    w.grad = torch.ones(3)
    opt.zero_grad(set_to_none=False)
    assert w.grad is not None and not w.grad.any()

    extra = torch.nn.Parameter(torch.ones(2))
    opt.add_param_group({"params": [extra], "lr": 0.2})
    assert len(inner.param_groups) == 2
    opt.param_groups = inner.param_groups[:1]
    assert len(inner.param_groups) == 1


def test_sparse_gradients_are_refused_with_the_fix():
    emb = torch.nn.Embedding(4, 2, sparse=True)
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(TypeError, match=r"dense gradients.*sparse=False"):
        LARC(torch.optim.SGD(emb.parameters(), lr=0.1)).step()


def test_importable_under_apex_names():
    from ampkit.apex import install, uninstall

    install()
    try:
        from apex.parallel import LARC as by_package
        from apex.parallel.LARC import LARC as by_module

        assert by_module is LARC and by_package is LARC
    finally:
        uninstall()
