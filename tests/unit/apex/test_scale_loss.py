"""scale_loss against control runs: several models, optimizers and losses, injected infs, skipped steps.

Three kinds of control, as in Apex's own tests but stricter:
* O0 with a dynamic scale against a hand-written fp32 loop: scaling by powers of two is exact in fp32, so the
  parameters must be bitwise equal, with the control skipping exactly the steps amp should skip;
* O1/O2 with injected infs against the same opt level without injection that simply does not step at those
  iterations: the scale differs only by powers of two, so again bitwise equal;
* O1/O2 against the fp32 control, within 16-bit tolerance.

The scenario tests are device-generic: on CUDA, O1 and O2 run Apex's default there, fp16 with a dynamic scale.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit.apex import amp

ITERS = 6


def make_models(n: int, device: torch.device) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)).to(device) for _ in range(n)]


def batches(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)  # drawn on the CPU: every device sees the same values
    data = [(torch.randn(12, 6, generator=g), torch.randint(0, 3, (12,), generator=g)) for _ in range(ITERS)]
    return [(x.to(device), y.to(device)) for x, y in data]


# Each scenario: models, optimizer -> model indices, losses -> (model indices summed, optimizers passed),
# and injections (iteration, loss id, model index whose first weight gradient gets an inf).
SCENARIOS = {
    "1 model, 1 optimizer, 1 loss": dict(models=1, opts=[[0]], losses=[([0], [0])], inject=[(2, 0, 0)]),
    "2 models, 1 optimizer, 2 losses": dict(models=2, opts=[[0, 1]], losses=[([0], [0]), ([1], [0])], inject=[(1, 1, 1), (4, 0, 0)]),
    "2 models, 2 optimizers, 2 losses": dict(
        models=2, opts=[[0], [1]], losses=[([0, 1], [0, 1]), ([1], [1])], inject=[(2, 0, 0), (4, 1, 1)]
    ),
    "3 models, 2 optimizers, 2 losses": dict(
        models=3, opts=[[0, 1], [2]], losses=[([0, 2], [0, 1]), ([1], [0])], inject=[(1, 1, 1), (3, 0, 2), (5, 0, 0)]
    ),
}


def expected_skips(sc: dict) -> dict[int, set[int]]:
    """Optimizer index -> iterations it must skip: every optimizer passed to a scale_loss that overflowed."""
    skips: dict[int, set[int]] = {i: set() for i in range(len(sc["opts"]))}
    for it, loss_id, _ in sc["inject"]:
        for o in sc["losses"][loss_id][1]:
            skips[o].add(it)
    return skips


def build(sc: dict, models: list[nn.Module]) -> list[torch.optim.Optimizer]:
    return [torch.optim.SGD([p for i in idx for p in models[i].parameters()], lr=0.1, momentum=0.9) for idx in sc["opts"]]


def run_amp(
    sc: dict, device: torch.device, opt_level: str, inject: bool, manual_skip: bool = False, **kw
) -> tuple[list[nn.Module], list[float]]:
    models = make_models(sc["models"], device)
    opts = build(sc, models)
    models, opts = amp.initialize(models, opts, opt_level=opt_level, num_losses=len(sc["losses"]), verbosity=0, **kw)
    skips = expected_skips(sc)
    for it, (x, y) in enumerate(batches(device)):
        for o in opts:
            o.zero_grad()
        outs = [m(x) for m in models]
        for loss_id, (members, opt_idx) in enumerate(sc["losses"]):
            loss = sum(nn.functional.cross_entropy(outs[i], y) for i in members)
            with amp.scale_loss(loss, [opts[o] for o in opt_idx], loss_id=loss_id) as scaled:
                scaled.backward(retain_graph=True)
                if inject and any(i == it and l == loss_id for i, l, _ in sc["inject"]):
                    target = next(m for i, l, m in sc["inject"] if i == it and l == loss_id)
                    models[target][0].weight.grad[0, 0] = float("inf")
        for o_idx, o in enumerate(opts):
            if manual_skip and it in skips[o_idx]:
                continue
            o.step()
    scales = [v.loss_scale() for v in amp._amp_state.loss_scalers]
    return models, scales


def run_fp32_control(sc: dict, device: torch.device) -> list[nn.Module]:
    models = make_models(sc["models"], device)
    opts = build(sc, models)
    skips = expected_skips(sc)
    for it, (x, y) in enumerate(batches(device)):
        for o in opts:
            o.zero_grad()
        outs = [m(x) for m in models]
        for members, _ in sc["losses"]:
            sum(nn.functional.cross_entropy(outs[i], y) for i in members).backward(retain_graph=True)
        for o_idx, o in enumerate(opts):
            if it not in skips[o_idx]:
                o.step()
    return models


def state(models: list[nn.Module]) -> dict[str, torch.Tensor]:
    return {f"{i}.{k}": v.float() for i, m in enumerate(models) for k, v in m.state_dict().items() if v.is_floating_point()}


def expected_scales(sc: dict) -> list[float]:
    return [2.0**16 * 0.5 ** sum(1 for _, l, _ in sc["inject"] if l == loss_id) for loss_id in range(len(sc["losses"]))]


@pytest.mark.parametrize("name", SCENARIOS)
def test_o0_dynamic_equals_fp32_control_bitwise(name, device):
    sc = SCENARIOS[name]
    treated, scales = run_amp(sc, device, "O0", inject=True, loss_scale="dynamic")
    control = run_fp32_control(sc, device)
    a, b = state(treated), state(control)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert scales == expected_scales(sc)


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_injected_overflow_skips_exactly_like_manual_skip(name, opt_level, device, half_dtype):
    sc = SCENARIOS[name]
    treated, scales = run_amp(sc, device, opt_level, inject=True)
    if opt_level == "O2":
        assert treated[0][0].weight.dtype == half_dtype  # Apex's default type: fp16 on CUDA (bf16 on the CPU)
    _amp_reset()
    reference, ref_scales = run_amp(sc, device, opt_level, inject=False, manual_skip=True)
    a, b = state(treated), state(reference)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert scales == expected_scales(sc)
    assert ref_scales == [2.0**16] * len(sc["losses"])
    # And the 16-bit run stays near the fp32 control that skipped the same steps.
    control = state(run_fp32_control(sc, device))
    for k in a:
        assert torch.allclose(a[k], control[k], rtol=5e-2, atol=2e-2), k


def _amp_reset() -> None:
    from ampkit.apex._state import _amp_state

    _amp_state.session = None


def test_accumulation_over_several_scale_loss_calls_equals_one_backward_of_the_sum():
    torch.manual_seed(0)
    model = nn.Linear(5, 2)
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O0", loss_scale="dynamic", verbosity=0)
    xs = torch.randn(3, 4, 5)
    for x in xs:
        with amp.scale_loss(model(x).pow(2).mean(), opt) as scaled:
            scaled.backward()
    sum(ref(x).pow(2).mean() for x in xs).backward()
    assert torch.equal(model.weight.grad, ref.weight.grad) or torch.allclose(model.weight.grad, ref.weight.grad, rtol=1e-6, atol=0)


@pytest.mark.parametrize("opt_level", ["O0", "O2"])
def test_delay_unscale_accumulates_scaled_then_unscales_once(opt_level):
    torch.manual_seed(0)
    model = nn.Linear(5, 2)
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw = {"loss_scale": "dynamic"} if opt_level == "O0" else {}
    model, opt = amp.initialize(model, opt, opt_level=opt_level, verbosity=0, **kw)
    xs = torch.randn(3, 4, 5)
    for i, x in enumerate(xs):
        with amp.scale_loss(model(x).pow(2).mean(), opt, delay_unscale=i < len(xs) - 1) as scaled:
            scaled.backward()
    grads = [p.grad.clone() for p in amp.master_params(opt)]
    sum(twin(x).pow(2).mean() for x in xs).backward()
    for g, p in zip(grads, twin.parameters()):
        assert g.dtype == torch.float32
        tol = dict(rtol=1e-6, atol=0) if opt_level == "O0" else dict(rtol=2e-2, atol=1e-2)
        assert torch.allclose(g, p.grad, **tol)


def test_step_with_grads_still_scaled_after_delay_unscale_raises():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    with amp.scale_loss(model(torch.ones(1, 2)).sum(), opt, delay_unscale=True) as scaled:
        scaled.backward()
    with pytest.raises(RuntimeError, match="delay_unscale"):
        opt.step()


def test_scale_grows_after_2000_clean_passes_up_to_the_ceiling_and_floor_holds():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0, max_loss_scale=2.0**17, min_loss_scale=2.0**15)
    view = amp._amp_state.loss_scalers[0]
    assert view.loss_scale() == 2.0**16

    def one(inf: bool = False) -> None:
        with amp.scale_loss(model(torch.ones(1, 2)).sum(), opt) as scaled:
            scaled.backward()
            if inf:
                model.weight.grad.fill_(float("nan"))
        opt.step()
        opt.zero_grad()

    for _ in range(2000):
        one()
    assert view.loss_scale() == 2.0**17
    for _ in range(2000):
        one()
    assert view.loss_scale() == 2.0**17  # ceiling
    for _ in range(3):
        one(inf=True)
    assert view.loss_scale() == 2.0**15  # floor


def test_skip_message_once_per_run_of_skips_then_a_summary(capsys):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=1)
    capsys.readouterr()
    for it in range(6):
        with amp.scale_loss(model(torch.ones(1, 2)).sum(), opt) as scaled:
            scaled.backward()
            if it < 4:
                model.weight.grad.fill_(float("inf"))
        opt.step()
        opt.zero_grad()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0"
    assert out[1] == "Gradient overflow: 4 steps skipped in a row; loss scaler 0 is now at 4096.0"
    assert len(out) == 2


def test_verbosity_zero_prints_nothing(capsys):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    with amp.scale_loss(model(torch.ones(1, 2)).sum(), opt) as scaled:
        scaled.backward()
        model.weight.grad.fill_(float("inf"))
    opt.step()
    assert capsys.readouterr().out == ""


def test_static_loss_scale_never_skips_as_in_apex():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", loss_scale=128.0, verbosity=0)
    with amp.scale_loss(model(torch.ones(1, 2)).sum(), opt) as scaled:
        assert scaled.item() == pytest.approx(128.0 * model(torch.ones(1, 2)).sum().item(), rel=1e-2)
        scaled.backward()
    grad = model.weight.grad.clone()
    before = model.weight.detach().clone()
    opt.step()
    assert torch.allclose(model.weight, before - 0.1 * grad)  # unscaled gradient was applied


def test_failed_backward_leaves_the_earlier_gradients_intact():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    with amp.scale_loss(model(torch.ones(1, 2)).sum(), opt) as scaled:
        scaled.backward()
    kept = model.weight.grad.clone()
    with pytest.raises(ValueError, match="boom"), amp.scale_loss(model(torch.ones(1, 2)).sum(), opt) as scaled:
        scaled.backward()
        raise ValueError("boom")
    assert torch.equal(model.weight.grad, kept)


def test_o3_static_one_yields_the_float_loss_untouched():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O3", verbosity=0)
    loss = model(torch.ones(1, 2)).sum()
    with amp.scale_loss(loss, opt) as scaled:
        assert scaled.dtype == torch.float32 and scaled.item() == loss.item()
        scaled.backward()
    assert model.weight.grad.dtype == torch.bfloat16
    opt.step()


# -------------------------------------------------------------------------------------------- mistakes
def test_o2_plain_backward_outside_scale_loss_is_refused_at_step():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(RuntimeError, match="inside `with amp.scale_loss"):
        opt.step()


def test_scale_loss_before_initialize_says_to_initialize():
    with pytest.raises(RuntimeError, match=r"before amp.initialize\(\).*amp.initialize\(model, optimizer"):
        amp.scale_loss(torch.ones(()), torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1))


def test_scale_loss_of_a_model_shows_the_with_form():
    model = nn.Linear(2, 1)
    with pytest.raises(TypeError, match=r"with amp.scale_loss\(loss, optimizer\) as scaled_loss:"):
        model = amp.scale_loss(model)


def test_scale_loss_without_optimizer_or_used_as_the_loss_shows_the_with_form():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    loss = model(torch.ones(1, 2)).sum()
    with pytest.raises(TypeError, match="as scaled_loss"):
        amp.scale_loss(loss)
    with pytest.raises(TypeError, match="context manager"):
        amp.scale_loss(loss, opt).backward()


def test_loss_id_beyond_num_losses_names_the_fix():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    with pytest.raises(ValueError, match="num_losses=2"):
        amp.scale_loss(model(torch.ones(1, 2)).sum(), opt, loss_id=1)


def test_optimizer_not_initialized_is_refused():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="not passed through amp.initialize"):
        amp.scale_loss(model(torch.ones(1, 2)).sum(), other)


def test_disabled_amp_is_a_no_op():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    m2, o2 = amp.initialize(model, opt, enabled=False)
    assert m2 is model and o2 is opt
    loss = model(torch.ones(1, 2)).sum()
    with amp.scale_loss(loss, opt) as scaled:
        assert scaled is loss
