"""Engine tests: each numeric claim is checked against a control run with identical weights and data.

The control is the hand-written torch.amp loop that torch documents (autocast + GradScaler + unscale_ before
clipping); the treatment is the same run through ampkit.Engine. Where the recipes match, parameters must match
bitwise, and the loss scale exactly.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import ampkit
from ampkit import Engine, LossScaleCollapseError, ScalerConfig
from ampkit.training import _optimizer_step as optimizer_step

INF = float("inf")


def mlp(seed: int = 0, device: torch.device | str = "cpu") -> nn.Module:
    torch.manual_seed(seed)  # initialised on the CPU, then moved: every device starts from the same weights
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 3)).to(device)


def batches(n: int, size: int = 8, seed: int = 1, device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)  # drawn on the CPU and moved, so every device sees the same values
    return [(torch.randn(size, 8, generator=g).to(device), torch.randint(0, 3, (size,), generator=g).to(device)) for _ in range(n)]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.float(), y)


def assert_params_equal(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), f"parameter {name} differs"


def poison_grad(model: nn.Module) -> None:
    """Put an inf into the first layer's weight gradient, as an fp16 overflow would."""
    model[0].weight.grad[0, 0] = INF


# ------------------------------------------------------------------------------------- control vs treatment
@pytest.mark.parametrize("fused", [False, True], ids=["sgd", "fused-adamw"])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_16_mixed_matches_gradscaler_loop_bitwise(fused: bool, clip: float | None, device: torch.device) -> None:
    """Injected overflows at known steps: same skips, same scale, bitwise-equal parameters as torch's loop."""
    k, steps, poisoned = 2, 12, {3, 4, 9}
    cfg = {"init_scale": 2.0**10, "growth_interval": 3}

    def make_opt(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True) if fused else torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    control = mlp(device=device)
    c_opt = make_opt(control)
    gs = torch.amp.GradScaler(device.type, **cfg)
    treat = mlp(device=device)
    engine = Engine("16-mixed", accumulate=k, clip_grad_norm=clip, scaler=ScalerConfig(**cfg, min_scale=2.0**-20))
    treat, _t_opt = engine.setup(treat, make_opt(treat))

    data = batches(steps * k, device=device)
    skipped = 0
    for step in range(steps):
        for j in range(k):
            x, y = data[step * k + j]
            with torch.autocast(device.type, dtype=torch.float16):
                c_loss = loss_fn(control(x), y)
            gs.scale(c_loss / k).backward()
            with engine.autocast():
                t_loss = loss_fn(treat(x), y)
            engine.backward(t_loss)
            if j == k - 1 and step in poisoned:
                poison_grad(control)
                poison_grad(treat)
            if j == k - 1:
                if clip is not None:
                    gs.unscale_(c_opt)
                    torch.nn.utils.clip_grad_norm_(control.parameters(), clip)
                gs.step(c_opt)
                gs.update()
                c_opt.zero_grad(set_to_none=True)
            assert engine.step() is (j == k - 1)
        skipped += step in poisoned
        assert engine.step_was_skipped is (step in poisoned)
        assert engine.scale == gs.get_scale(), f"scale differs after step {step}"
        assert_params_equal(treat, control)
    assert engine.steps == steps and engine.skipped_steps == skipped
    # Independent of both implementations: 2^10, grown once per 3 clean steps in a row, halved per overflow.
    expected, clean = 2.0**10, 0
    for step in range(steps):
        if step in poisoned:
            expected, clean = expected * 0.5, 0
        else:
            clean += 1
            if clean == 3:
                expected, clean = expected * 2, 0
    assert engine.scale == expected


def test_bf16_mixed_matches_autocast_loop_bitwise(device: torch.device) -> None:
    control, treat = mlp(device=device), mlp(device=device)
    c_opt = torch.optim.AdamW(control.parameters(), lr=1e-2)
    engine = Engine("bf16", clip_grad_norm=1.0)
    treat, _t_opt = engine.setup(treat, torch.optim.AdamW(treat.parameters(), lr=1e-2))
    assert engine.scaler is None
    for x, y in batches(10, device=device):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(control(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(control.parameters(), 1.0)
        c_opt.step()
        c_opt.zero_grad()
        with engine.autocast():
            loss = loss_fn(treat(x), y)
        engine.backward(loss)
        engine.step()
        assert engine.grad_norm == norm.item()
        assert_params_equal(treat, control)


def test_several_optimizers_and_losses_skip_per_optimizer_like_gradscaler(device: torch.device) -> None:
    """Two models, two losses, two optimizers; an overflow in one model's grads skips only its optimizer."""
    cfg = {"init_scale": 2.0**8, "growth_interval": 4}
    ca, cb, ta, tb = mlp(0, device), mlp(1, device), mlp(0, device), mlp(1, device)
    ca_opt, cb_opt = torch.optim.SGD(ca.parameters(), lr=0.1), torch.optim.SGD(cb.parameters(), lr=0.1)
    gs = torch.amp.GradScaler(device.type, **cfg)
    engine = Engine("16-mixed", scaler=ScalerConfig(**cfg))
    (ta, tb), _ta_opt, _tb_opt = engine.setup([ta, tb], torch.optim.SGD(ta.parameters(), lr=0.1), torch.optim.SGD(tb.parameters(), lr=0.1))
    for step, (x, y) in enumerate(batches(8, device=device)):
        with torch.autocast(device.type, dtype=torch.float16):
            l0, l1 = loss_fn(ca(x), y), loss_fn(cb(x), y)
        gs.scale(l0).backward()
        gs.scale(l1).backward()
        with engine.autocast():
            m0, m1 = loss_fn(ta(x), y), loss_fn(tb(x), y)
        engine.backward(m0)
        engine.backward(m1)
        if step == 2:
            poison_grad(cb)
            poison_grad(tb)
        gs.step(ca_opt)
        gs.step(cb_opt)
        gs.update()
        ca_opt.zero_grad()
        cb_opt.zero_grad()
        engine.step()
        assert engine.scale == gs.get_scale()
        assert_params_equal(ta, ca)
        assert_params_equal(tb, cb)
    assert engine.skipped_steps == 1


def test_stepping_one_optimizer_keeps_the_other_models_pending_gradients_under_masters() -> None:
    engine = Engine("bf16-true-masters")
    a, b = mlp(0), mlp(1)
    (a, b), opt_a, _opt_b = engine.setup([a, b], torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1))
    x, y = batches(1)[0]
    with engine.autocast():
        loss = loss_fn(a(x), y) + loss_fn(b(x), y)
    engine.backward(loss)
    engine.step(opt_a)
    assert all(p.grad is None for p in a.parameters())
    assert all(p.grad is not None for p in b.parameters())  # still there for opt_b


def test_clipping_spans_every_optimizer_of_the_step(device: torch.device) -> None:
    """A model split over two optimizers is clipped by its total norm, exactly as clip_grad_norm_ over it."""
    control, treat = mlp(device=device), mlp(device=device)
    c_opt = torch.optim.SGD(control.parameters(), lr=0.5)
    engine = Engine("32-true", clip_grad_norm=0.1)
    treat, *_ = engine.setup(
        treat, torch.optim.SGD(treat[0].parameters(), lr=0.5), torch.optim.SGD(list(treat[1].parameters()) + list(treat[3].parameters()), lr=0.5)
    )
    for x, y in batches(3, device=device):
        loss_fn(control(x), y).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(control.parameters(), 0.1)
        c_opt.step()
        c_opt.zero_grad()
        engine.backward(loss_fn(treat(x), y))
        engine.step()
        assert engine.grad_norm == ref_norm.item()
        assert_params_equal(treat, control)


def test_an_overflow_under_joint_clipping_skips_every_optimizer_of_the_step(device: torch.device) -> None:
    engine = Engine("16-mixed", clip_grad_norm=1.0)
    model = mlp(device=device)
    model, _opt_a, _opt_b = engine.setup(model, torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.SGD(model[3].parameters(), lr=0.1, weight_decay=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batches(1, device=device)[0]
    with engine.autocast():
        loss = loss_fn(model(x), y)
    engine.backward(loss)
    poison_grad(model)  # only opt_a's parameters overflow
    engine.step()
    assert engine.step_was_skipped and engine.skipped_steps == 1
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)  # opt_b did not step on gradients the inf norm had zeroed


# ------------------------------------------------------------------------------------- accumulation
def test_accumulation_equals_one_big_batch_in_fp32() -> None:
    """k micro-batches of b give the gradients of one batch of k*b (fp32, 1e-6 relative)."""
    k, b = 4, 8
    control, treat = mlp(), mlp()
    engine = Engine("32-true", accumulate=k)
    treat, _opt = engine.setup(treat, torch.optim.SGD(treat.parameters(), lr=0.5))
    c_opt = torch.optim.SGD(control.parameters(), lr=0.5)
    data = batches(3 * k, size=b)
    for step in range(3):
        chunk = data[step * k : (step + 1) * k]
        x = torch.cat([c[0] for c in chunk])
        y = torch.cat([c[1] for c in chunk])
        loss_fn(control(x), y).backward()
        for j, (xb, yb) in enumerate(chunk):
            engine.backward(loss_fn(treat(xb), yb))
            if j == k - 1:
                for p, q in zip(treat.parameters(), control.parameters()):
                    torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
            engine.step()
        c_opt.step()
        c_opt.zero_grad()
        for p, q in zip(treat.parameters(), control.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert engine.steps == 3


def test_short_last_window_is_divided_by_its_own_length() -> None:
    """10 micro-batches with accumulate=4: windows of 4, 4 and 2, each the mean over its own samples."""
    control, treat = mlp(), mlp()
    engine = Engine("32-true", accumulate=4)
    treat, _ = engine.setup(treat, torch.optim.SGD(treat.parameters(), lr=0.5))
    c_opt = torch.optim.SGD(control.parameters(), lr=0.5)
    data = batches(10)
    engine.start_epoch(len(data))
    boundaries = []
    for i, (x, y) in enumerate(data):
        engine.backward(loss_fn(treat(x), y))
        if engine.step():
            boundaries.append(i)
    for lo, hi in ((0, 4), (4, 8), (8, 10)):
        x = torch.cat([d[0] for d in data[lo:hi]])
        y = torch.cat([d[1] for d in data[lo:hi]])
        loss_fn(control(x), y).backward()
        c_opt.step()
        c_opt.zero_grad()
    assert boundaries == [3, 7, 9]
    for p, q in zip(treat.parameters(), control.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    # The next epoch starts a fresh window.
    engine.start_epoch(2)
    assert engine.is_boundary is False


def test_windows_run_across_epochs_without_start_epoch() -> None:
    engine = Engine(accumulate=3)
    model = mlp()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ends = []
    for i, (x, y) in enumerate(batches(7)):
        engine.backward(loss_fn(model(x), y))
        ends.append(engine.step())
    assert ends == [False, False, True, False, False, True, False]
    with pytest.raises(RuntimeError, match="pending"):
        engine.start_epoch(5)


def test_micro_batches_pending_counts_the_window_and_a_skipped_step_ends_it_too() -> None:
    engine = Engine(accumulate=3, skip_nonfinite=True)
    model = mlp()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    pending, skipped = [], []
    for i, (x, y) in enumerate(batches(7)):
        engine.backward(loss_fn(model(x), y))
        if i == 2:
            poison_grad(model)  # the first window's step is skipped
        ends = engine.step()
        pending.append(engine.micro_batches_pending)
        skipped.append(ends and engine.step_was_skipped)
    assert pending == [1, 2, 0, 1, 2, 0, 1]
    assert skipped == [False, False, True, False, False, False, False]
    with pytest.raises(RuntimeError, match="with 1 micro-batch"):
        engine.start_epoch(2)
    # A declared epoch's short last window (2 of 3) ends at 0 as well.
    for _ in range(2):
        engine.backward(loss_fn(model(x), y)); engine.step()
    engine.start_epoch(2)
    for expected in (1, 0):
        engine.backward(loss_fn(model(x), y)); engine.step()
        assert engine.micro_batches_pending == expected


def test_start_epoch_refuses_a_declared_epoch_that_ended_inside_a_window() -> None:
    """An epoch declared with 5 micro-batches that stops after 4 (accumulate=3) leaves one pending: start_epoch
    used to reset the counter and keep its gradient, which then joined the next epoch's first window."""
    engine = Engine(accumulate=3)
    model = mlp()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    engine.start_epoch(5)
    for x, y in batches(4):
        engine.backward(loss_fn(model(x), y)); engine.step()
    with pytest.raises(RuntimeError, match=r"(?s)declared with 5 micro-batches ended after 4.*start_epoch\(4\)"):
        engine.start_epoch(5)
    assert engine.micro_batches_pending == 1 and engine.step_state.to_dict() == {"micro": 4, "epoch_len": 5, "steps": 1}


def test_an_epoch_cut_short_at_a_window_boundary_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """Cut at a boundary nothing is pending and the next epoch starts fresh, but a checkpoint saved there would
    resume the unfinished epoch: the declaration is named once."""
    engine = Engine(accumulate=2)
    model = mlp()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        for _ in range(2):
            engine.start_epoch(5)
            for x, y in batches(4):
                engine.backward(loss_fn(model(x), y)); engine.step()
        engine.start_epoch(5)
    warned = [r.getMessage() for r in caplog.records if "start_epoch" in r.getMessage()]
    assert len(warned) == 1 and "declared with 5 micro-batches but 4 ran" in warned[0] and "start_epoch(4)" in warned[0]
    assert engine.step_state.to_dict() == {"micro": 0, "epoch_len": 5, "steps": 4}


def test_start_epoch_after_a_mid_epoch_load_continues_that_epoch() -> None:
    """Loaded 5 micro-batches into an epoch of 10 (accumulate=3, 2 pending), start_epoch(10) keeps the loaded
    position (the resume recipe's bitwise run: tests/unit/checkpoint/test_resume_loader.py); another length cannot
    resume that epoch and is refused."""
    def engine_at(state: dict | None = None) -> tuple[Engine, nn.Module]:
        engine = Engine(accumulate=3)
        model = mlp()
        model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        if state is not None:
            engine.load_state_dict(state)
        return engine, model

    engine, model = engine_at()
    engine.start_epoch(10)
    for x, y in batches(5):
        engine.backward(loss_fn(model(x), y)); engine.step()
    saved = engine.state_dict()
    resumed, _ = engine_at(saved)
    resumed.start_epoch(10)
    assert resumed.step_state.to_dict() == engine.step_state.to_dict() == {"micro": 5, "epoch_len": 10, "steps": 1}
    assert resumed.micro_batches_pending == 2
    other, _ = engine_at(saved)
    with pytest.raises(ValueError, match=r"start_epoch\(10\)"):
        other.start_epoch(8)


# ------------------------------------------------------------------------------------- clipping, schedulers
@pytest.mark.parametrize(
    ("precision", "rel"), [("16-mixed", 1e-2), ("bf16-mixed", 5e-2), ("16-true-masters", 2e-2), ("bf16-true-masters", 8e-2)]
)
def test_clipped_update_matches_the_fp32_control(precision: str, rel: float, device: torch.device) -> None:
    """Clipping sees unscaled (master) gradients: the norm and the weight update equal fp32's within tolerance."""
    updates, norms = {}, {}
    for p in ("32-true", precision):
        engine = Engine(p, clip_grad_norm=1e-3)  # far below the real norm: clipping decides the update
        model = mlp(device=device)
        start = [q.detach().clone() for q in model.parameters()]
        model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=1.0))
        x, y = batches(1, device=device)[0]
        with engine.autocast():
            loss = loss_fn(model(x), y)
        engine.backward(loss)
        engine.step()
        after = opt.param_groups[0]["params"]  # fp32 masters (fp32 norms) where the policy has them
        updates[p] = torch.cat([(a.float() - s).flatten() for a, s in zip(after, start)])
        norms[p] = engine.grad_norm
    assert 1e-3 < norms["32-true"] < 1e3  # a real norm, not a 2^16-scaled one
    assert norms[precision] == pytest.approx(norms["32-true"], rel=rel)
    assert torch.linalg.vector_norm(updates["32-true"]).item() == pytest.approx(1e-3, rel=1e-4)
    assert torch.linalg.vector_norm(updates[precision]).item() == pytest.approx(1e-3, rel=1e-3)
    error = torch.linalg.vector_norm(updates[precision] - updates["32-true"]) / torch.linalg.vector_norm(updates["32-true"])
    assert error.item() < rel


def test_scheduler_does_not_advance_on_a_skipped_step(device: torch.device) -> None:
    model = mlp(device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    engine = Engine("16-mixed")
    model, opt = engine.setup(model, opt, schedulers=sched)
    for step, (x, y) in enumerate(batches(5, device=device)):
        with engine.autocast():
            loss = loss_fn(model(x), y)
        engine.backward(loss)
        if step in (0, 3):
            poison_grad(model)
        engine.step()
    assert engine.skipped_steps == 2
    assert sched.last_epoch == 3  # 5 steps, 2 skipped
    assert opt.param_groups[0]["lr"] == 0.5**3


# ------------------------------------------------------------------------------------- master weights
def test_masters_match_a_hand_written_master_weight_loop_bitwise(device: torch.device) -> None:
    """bf16 model + fp32 masters + fp32 LayerNorm, against the same recipe written out by hand."""
    # Control: fp32 masters `ref`, a bf16 working copy `work` with its LayerNorm left in fp32.
    ref = mlp(device=device)
    work = copy.deepcopy(ref)
    work[0].to(torch.bfloat16)
    work[3].to(torch.bfloat16)
    c_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)

    def work_forward(x: torch.Tensor) -> torch.Tensor:
        h = work[0](x.to(torch.bfloat16))
        h = work[1](h.float()).to(torch.bfloat16)
        return work[3](work[2](h)).float()

    engine = Engine("bf16-true-masters")
    treat = mlp(device=device)
    treat, t_opt = engine.setup(treat, torch.optim.AdamW(treat.parameters(), lr=1e-2))
    assert {p.dtype for g in t_opt.param_groups for p in g["params"]} == {torch.float32}
    assert treat[0].weight.dtype == torch.bfloat16 and treat[1].weight.dtype == torch.float32

    for x, y in batches(6, device=device):
        loss_fn(work_forward(x), y).backward()
        for p_ref, p_work in zip(ref.parameters(), work.parameters()):
            p_ref.grad = p_work.grad.float()
        c_opt.step()
        c_opt.zero_grad()
        work.zero_grad()
        with torch.no_grad():
            for p_ref, p_work in zip(ref.parameters(), work.parameters()):
                p_work.copy_(p_ref)

        with engine.autocast():
            loss = loss_fn(treat(x), y)
        engine.backward(loss)
        engine.step()
        assert_params_equal(treat, work)
        for m, p_ref in zip(engine.masters.masters, [p for i in (0, 3) for p in ref[i].parameters()]):
            assert torch.equal(m, p_ref)


def test_masters_keep_updates_that_16_bit_weights_round_away(device: torch.device) -> None:
    """An update far below bf16's resolution vanishes in bf16-true and survives in the masters.

    d(mean(x @ w))/dw = 1 for x = ones, so 50 SGD steps of lr 1e-5 move each weight by 5e-4 < 2^-8.
    """
    results = {}
    for precision in ("bf16-true", "bf16-true-masters"):
        model = nn.Sequential(nn.Linear(8, 1, bias=False)).to(device)
        nn.init.constant_(model[0].weight, 1.0)
        engine = Engine(precision)
        model, _opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=1e-5))
        for _ in range(50):
            engine.backward(model(torch.ones(4, 8, device=device)).mean())
            engine.step()
        results[precision] = model[0].weight.float() if engine.masters is None else engine.masters.masters[0]
    assert torch.equal(results["bf16-true"], torch.ones(1, 8, device=device))  # every update rounded away
    torch.testing.assert_close(results["bf16-true-masters"], torch.full((1, 8), 1 - 50 * 1e-5, device=device), rtol=0, atol=1e-6)


def test_16_true_masters_trains_like_fp32(device: torch.device) -> None:
    final = {}
    for precision in ("32-true", "16-true-masters"):
        model = mlp(device=device)
        engine = Engine(precision, clip_grad_norm=5.0)
        model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        data = batches(4, size=32, device=device)
        for epoch in range(10):
            for x, y in data:
                with engine.autocast():
                    loss = loss_fn(model(x), y)
                engine.backward(loss)
                engine.step()
        final[precision] = loss.item()
    assert final["16-true-masters"] == pytest.approx(final["32-true"], rel=0.05)
    assert final["32-true"] < 0.9  # it did learn (chance is ln 3 = 1.10)


# ------------------------------------------------------------------------------------- penalties, sparse
def test_gradient_penalty_matches_torch_recipe_bitwise(device: torch.device) -> None:
    """Double backward under scaling: engine.grad() returns unscaled gradients, as torch's documented recipe."""
    cfg = {"init_scale": 2.0**12}
    control, treat = mlp(device=device), mlp(device=device)
    c_opt = torch.optim.SGD(control.parameters(), lr=0.1)
    gs = torch.amp.GradScaler(device.type, **cfg)
    engine = Engine("16-mixed", scaler=ScalerConfig(**cfg))
    treat, _ = engine.setup(treat, torch.optim.SGD(treat.parameters(), lr=0.1))
    for x, y in batches(4, device=device):
        with torch.autocast(device.type, dtype=torch.float16):
            loss = loss_fn(control(x), y)
        scaled = torch.autograd.grad(gs.scale(loss), list(control.parameters()), create_graph=True)
        inv = 1.0 / gs.get_scale()
        unscaled = [g * inv for g in scaled]
        with torch.autocast(device.type, dtype=torch.float16):
            loss = loss + torch.stack([g.pow(2).sum() for g in unscaled]).sum().sqrt()
        gs.scale(loss).backward()
        gs.step(c_opt)
        gs.update()
        c_opt.zero_grad()

        with engine.autocast():
            t_loss = loss_fn(treat(x), y)
        grads = engine.grad(t_loss, list(treat.parameters()))
        for g, u in zip(grads, unscaled):
            assert torch.equal(g, u)
        with engine.autocast():
            t_loss = t_loss + torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
        engine.backward(t_loss)
        engine.step()
        assert_params_equal(treat, control)


def test_gradient_penalty_gradients_match_fp32() -> None:
    model = mlp()
    x, y = batches(1)[0]
    ref = torch.autograd.grad(loss_fn(model(x), y), list(model.parameters()))
    engine = Engine("16-mixed")
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with engine.autocast():
        loss = loss_fn(model(x), y)
    for g, r in zip(engine.grad(loss, list(model.parameters()), create_graph=False), ref):
        torch.testing.assert_close(g, r, rtol=2e-2, atol=1e-3)


class SparseNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 8, sparse=True)
        self.out = nn.Linear(8, 3)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(idx).mean(1))


def sparse_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randint(0, 50, (8, 5), generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def test_sparse_gradients_match_gradscaler_loop_bitwise() -> None:
    control, treat = SparseNet(), SparseNet()
    c_opt = torch.optim.SGD(control.parameters(), lr=0.5)
    gs = torch.amp.GradScaler("cpu")
    engine = Engine("16-mixed")
    treat, _ = engine.setup(treat, torch.optim.SGD(treat.parameters(), lr=0.5))
    for step, (idx, y) in enumerate(sparse_batches(6)):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_fn(control(idx), y)
        gs.scale(loss).backward()
        with engine.autocast():
            t_loss = loss_fn(treat(idx), y)
        engine.backward(t_loss)
        assert treat.emb.weight.grad.is_sparse
        if step == 2:  # an overflow inside the sparse gradient's values must be seen too
            control.emb.weight.grad._values()[0, 0] = INF
            treat.emb.weight.grad._values()[0, 0] = INF
        gs.step(c_opt)
        gs.update()
        c_opt.zero_grad()
        engine.step()
        assert engine.step_was_skipped is (step == 2)
        assert_params_equal(treat, control)


def test_sparse_gradients_are_clipped_by_the_global_norm() -> None:
    norms = {}
    for precision in ("32-true", "16-mixed"):
        model = SparseNet()
        engine = Engine(precision, clip_grad_norm=1e-2)
        model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.5))
        idx, y = sparse_batches(1)[0]
        expected = torch.linalg.vector_norm(
            torch.cat([g.coalesce()._values().flatten() if g.is_sparse else g.flatten() for g in torch.autograd.grad(loss_fn(model(idx), y), list(model.parameters()))])
        )
        with engine.autocast():
            loss = loss_fn(model(idx), y)
        engine.backward(loss)
        engine.step()
        norms[precision] = engine.grad_norm
        if precision == "32-true":
            assert norms[precision] == pytest.approx(expected.item(), rel=1e-5)
    assert norms["16-mixed"] == pytest.approx(norms["32-true"], rel=1e-2)


# ------------------------------------------------------------------------------------- collapse, keep_fp32
class ExplodingGrad(nn.Module):
    """Wraps a layer whose weight gradient is always inf: no loss scale can save it."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.body = mlp(device=device)
        self.body[3].weight.register_hook(lambda g: g * INF)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_collapse_raises_naming_the_parameter_and_the_fix(device: torch.device) -> None:
    model = ExplodingGrad(device)
    engine = Engine("16-mixed", scaler=ScalerConfig(init_scale=2.0**4, min_scale=1.0))
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batches(1, device=device)[0]
    with pytest.raises(LossScaleCollapseError) as info:
        for _ in range(10):
            with engine.autocast():
                loss = loss_fn(model(x), y)
            engine.backward(loss)
            engine.step()
    message = str(info.value)
    assert "floor" in message and "body.3.weight" in message and "keep_fp32=['body.3']" in message and "bf16-mixed" in message
    assert engine.steps == 5  # 2^4 -> 1 in four back-offs; the fifth overflow, at the floor, is the collapse
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)  # every step was skipped


def test_collapse_can_warn_instead(caplog: pytest.LogCaptureFixture, device: torch.device) -> None:
    model = ExplodingGrad(device)
    engine = Engine("16-mixed", scaler=ScalerConfig(init_scale=2.0, max_consecutive_skips=3, on_collapse="warn"))
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batches(1, device=device)[0]
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        for _ in range(4):
            with engine.autocast():
                loss = loss_fn(model(x), y)
            engine.backward(loss)
            engine.step()
    assert engine.skipped_steps == 4
    assert any("body.3.weight" in r.message for r in caplog.records)


def test_collapse_is_diagnosed_with_a_fused_optimizer_too(device: torch.device) -> None:
    # Fused AdamW unscales inside its own kernel and needs no host read to skip; the diagnosis must not vanish.
    model = ExplodingGrad(device)
    engine = Engine("16-mixed", scaler=ScalerConfig(init_scale=2.0**4, min_scale=1.0))
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=0.1, fused=True))
    x, y = batches(1, device=device)[0]
    with pytest.raises(LossScaleCollapseError, match=r"floor.*body\.3\.weight"):
        for _ in range(10):
            with engine.autocast():
                loss = loss_fn(model(x), y)
            engine.backward(loss)
            engine.step()
    # The fifth step overflows at the floor. The CPU reads its outcome at once; on an accelerator the fused step
    # is not synced, so the collapse is learnt once its flag has reached the host (as the sixth step begins, or a
    # later one when the host runs ahead of the device), and that step completes first.
    if device.type == "cpu":
        assert engine.steps == 5
    else:
        assert engine.steps >= 6
    assert engine.skipped_steps == engine.steps


def test_deferred_outcome_of_fused_steps_is_counted_and_diagnosed_one_step_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator a fused step is not synced: the engine learns its outcome at the next step."""
    monkeypatch.setattr(optimizer_step, "reads_are_free", lambda device: False)  # behave as on CUDA
    model = ExplodingGrad()
    engine = Engine("16-mixed", scaler=ScalerConfig(init_scale=2.0**4, min_scale=1.0))
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=0.1, fused=True))
    x, y = batches(1)[0]

    def one_step() -> None:
        with engine.autocast():
            loss = loss_fn(model(x), y)
        engine.backward(loss)
        engine.step()

    one_step()
    assert engine.step_state.deferred is not None  # nothing read yet
    assert engine.step_was_skipped and engine.step_state.deferred is None
    with pytest.raises(LossScaleCollapseError, match=r"floor.*body\.3\.weight"):
        for _ in range(10):
            one_step()
    # The fifth step overflows at the floor; its outcome is read as the sixth begins, which completes (skipped
    # too) before the error is raised, so a caller that catches it holds a consistent state.
    assert engine.steps == 6 and engine.skipped_steps == 6
    assert all(p.grad is None for p in model.parameters())


def test_the_deferred_outcome_is_right_and_read_without_draining_the_stream(device: torch.device) -> None:
    """A fused step's skipped/overflow flag goes to pinned host memory behind an event (CUDA): reading it waits
    for that event only, not for device work queued after the step. On the CPU it is known at once."""
    model = mlp(device=device)
    engine = Engine("16-mixed", scaler=ScalerConfig(init_scale=2.0**8))
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True))
    poisoned = {1, 2}
    for step, (x, y) in enumerate(batches(4, device=device)):
        with engine.autocast():
            loss = loss_fn(model(x), y)
        engine.backward(loss)
        if step in poisoned:
            poison_grad(model)
        engine.step()
        if device.type == "cuda":
            assert engine.step_state.deferred is not None  # the step itself read nothing
            with torch.cuda.device(device):
                torch.cuda._sleep(500_000_000)  # a quarter second or so of device work queued after the step
            skipped = engine.step_was_skipped
            assert not torch.cuda.current_stream(device).query(), "reading the outcome waited for later work"
            torch.cuda.synchronize(device)
        else:
            assert engine.step_state.deferred is None  # the host reads a CPU flag for free
            skipped = engine.step_was_skipped
        assert skipped is (step in poisoned), f"step {step}"
    assert engine.skipped_steps == len(poisoned)


@pytest.mark.gpu
def test_the_deferred_outcome_waits_for_the_copy_on_a_gpu_that_is_not_the_current_one(device: torch.device) -> None:
    if device.type != "cuda" or torch.cuda.device_count() < 2:
        pytest.skip("Requires: [GPUs>=2] (a model on a GPU other than the current device)")
    other = torch.device("cuda", (torch.cuda.current_device() + 1) % torch.cuda.device_count())
    model = mlp(device=other)
    engine = Engine("16-mixed")
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True))
    x, y = batches(1, device=other)[0]
    with engine.autocast():
        loss = loss_fn(model(x), y)
    engine.backward(loss)
    poison_grad(model)
    with torch.cuda.device(other):
        torch.cuda._sleep(500_000_000)  # the step's kernels and its flag's copy run only after this
    engine.step()
    assert engine.step_was_skipped  # an event on the current GPU's idle stream would let a stale flag be read


@contextlib.contextmanager
def no_host_device_sync(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail if the block makes the host wait for the device: torch's sync debug mode on CUDA; on the CPU, where
    reads are free, the engine is made to behave as on an accelerator and every host read of a tensor's value
    (what syncs there) is recorded."""
    if device.type == "cuda":
        with warnings.catch_warnings():
            # set_sync_debug_mode's own notice (a prototype; once per process, after setting the mode): under the
            # suite's "error" filter it raised with the mode already on "error", failing every later sync there.
            warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype feature")
            previous = torch.cuda.get_sync_debug_mode()
            try:
                torch.cuda.set_sync_debug_mode("error")
                yield
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        return
    reads: list[str] = []

    def counting(name: str, original: Callable[..., object]) -> Callable[..., object]:
        def read(self: torch.Tensor, *args: object) -> object:
            reads.append(f"Tensor.{name}")
            return original(self, *args)

        return read

    with monkeypatch.context() as patch:
        patch.setattr(optimizer_step, "reads_are_free", lambda device: False)
        for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
            patch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
        yield
    assert not reads, f"host reads of device values: {reads}"


def test_a_fused_step_with_clipping_makes_no_host_device_sync(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    """backward() and step() with a fused optimizer, loss scaling and clipping never make the host wait."""
    model = mlp(device=device)
    engine = Engine("16-mixed", clip_grad_norm=1.0)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True))
    for step, (x, y) in enumerate(batches(3, device=device)):
        with engine.autocast():
            loss = loss_fn(model(x), y)
        # The first step creates the optimizer's state and is free to do anything once.
        with no_host_device_sync(device, monkeypatch) if step else contextlib.nullcontext():
            engine.backward(loss)
            engine.step()
        # Read here, outside the checked block: the next step would otherwise wait on this step's event, long
        # passed in a real loop but a host wait all the same.
        assert not engine.step_was_skipped
    assert engine.steps == 3


def test_an_unfused_optimizer_reads_its_overflow_flag_once_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unfused optimizer must know on the host whether to step: one read, and only one, per step."""
    model = mlp()
    engine = Engine("16-mixed", clip_grad_norm=1.0)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    reads: list[str] = []
    with monkeypatch.context() as patch:
        patch.setattr(optimizer_step, "reads_are_free", lambda device: False)  # behave as on an accelerator
        for name in ("item", "tolist"):
            original = getattr(torch.Tensor, name)
            patch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _o=original: reads.append(_n) or _o(self, *a))
        for x, y in batches(3):
            with engine.autocast():
                loss = loss_fn(model(x), y)
            engine.backward(loss)
            engine.step()
    assert len(reads) == 3, reads


def test_the_fused_master_step_makes_no_host_device_sync(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled master step undoes an overflow inside the region: no host read decides whether to step."""
    model = mlp(device=device)
    engine = Engine("16-true-masters", clip_grad_norm=1.0, fused_step={"backend": "aot_eager"})
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    for step, (x, y) in enumerate(batches(4, device=device)):
        with engine.autocast():
            loss = loss_fn(model(x.to(torch.float16)), y)
        # Step 0 creates the optimizer's state unfused, step 1 compiles the region: free to do anything once.
        with no_host_device_sync(device, monkeypatch) if step > 1 else contextlib.nullcontext():
            engine.backward(loss)
            engine.step()
        assert not engine.step_was_skipped  # read outside the checked block, as a loop would read it later
    assert engine.fused_step.calls == 3


def test_collapse_warning_is_logged_once_per_episode(caplog: pytest.LogCaptureFixture, device: torch.device) -> None:
    model = mlp(device=device)
    engine = Engine("16-mixed", scaler=ScalerConfig(init_scale=2.0, max_consecutive_skips=2, on_collapse="warn"))
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batches(1, device=device)[0]
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        for poisoned in [True] * 5 + [False] + [True] * 3:
            with engine.autocast():
                loss = loss_fn(model(x), y)
            engine.backward(loss)
            if poisoned:
                poison_grad(model)
            engine.step()
    collapses = [r for r in caplog.records if "collapsed" in r.message]
    assert len(collapses) == 2  # one for the first run of skips, one after the clean step broke it
    assert engine.skipped_steps == 8


def test_keep_fp32_runs_the_named_module_in_fp32_under_autocast(device: torch.device, mixed_policy: str, half_dtype: torch.dtype) -> None:
    engine = Engine(mixed_policy, keep_fp32=["3"])
    model = mlp(device=device)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with engine.autocast():
        hidden = model[0](torch.randn(2, 8, device=device))
        out = model(torch.randn(2, 8, device=device))
    assert hidden.dtype == half_dtype and out.dtype == torch.float32


def test_skip_nonfinite_without_scaling(device: torch.device) -> None:
    model = mlp(device=device)
    engine = Engine("bf16-mixed", skip_nonfinite=True)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batches(1, device=device)[0]
    with engine.autocast():
        loss = loss_fn(model(x), y)
    engine.backward(loss)
    model[0].weight.grad[0, 0] = math.nan
    engine.step()
    assert engine.step_was_skipped and engine.skipped_steps == 1
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


# ------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"accumulate": 0}, "accumulate must be an int >= 1"),
        ({"accumulate": "4"}, "accumulate must be an int >= 1"),
        ({"accumulate": True}, "accumulate must be an int >= 1"),
        ({"clip_grad_norm": -1.0}, "clip_grad_norm must be a positive number"),
        ({"clip_grad_norm": 1.0, "clip_grad_value": 1.0}, "not both"),
        ({"scaler": "bogus"}, "scaler='bogus' is not understood"),
        ({"precision": "16-mixed", "skip_nonfinite": False}, "must skip steps"),
        ({"precision": "01"}, "Did you mean 'O1'"),
    ],
)
def test_bad_engine_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Engine(**kwargs)


def test_tf32_on_cpu_is_refused_with_the_alternative() -> None:
    engine = Engine("tf32")
    with pytest.raises(ampkit.UnsupportedPolicyError, match="bf16-mixed"):
        engine.setup(mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1))


def test_call_order_mistakes() -> None:
    engine = Engine()
    loss = mlp()(torch.randn(2, 8)).sum()
    with pytest.raises(RuntimeError, match="before engine.setup"):
        engine.backward(loss)
    with pytest.raises(RuntimeError, match="before engine.setup"):
        engine.step()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="nn.Module"):
        engine.setup(opt)
    with pytest.raises(TypeError, match="Optimizer"):
        engine.setup(model, model)
    engine.setup(model, opt)
    with pytest.raises(RuntimeError, match="already"):
        engine.setup(model, opt)
    with pytest.raises(ValueError, match="not passed to engine.setup"):
        engine.step(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="loss tensor"):
        engine.backward(1.0)
    with pytest.raises(ValueError, match="positive int"):
        engine.start_epoch(0)


def test_bad_schedulers() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    other = torch.optim.SGD(mlp().parameters(), lr=0.1)
    with pytest.raises(TypeError, match="ReduceLROnPlateau"):
        Engine().setup(model, opt, schedulers=torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
    with pytest.raises(ValueError, match="built on one of the optimizers"):
        Engine().setup(model, opt, schedulers=torch.optim.lr_scheduler.StepLR(other, 1))


# ------------------------------------------------------------------------- optimizers that do not fit the model
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true-masters"])
def test_setup_refuses_an_optimizer_of_another_model(precision: str) -> None:
    model, other = mlp(), mlp()
    with pytest.raises(ValueError, match=r"optimizer 0 \(AdamW\) holds none of the model's parameters.*AdamW\(model.parameters\(\)"):
        Engine(precision).setup(model, torch.optim.AdamW(other.parameters()))


def test_setup_names_a_foreign_parameter_mixed_into_the_optimizer() -> None:
    model, stray = mlp(), nn.Parameter(torch.zeros(3, 5))
    opt = torch.optim.SGD([{"params": list(model.parameters())}, {"params": [stray], "lr": 0.01}], lr=0.1)
    with pytest.raises(ValueError) as info:
        Engine("bf16-mixed").setup(model, opt)
    message = str(info.value)
    assert "param_groups[1]['params'][0] (torch.float32 tensor of shape (3, 5))" in message
    assert "setup([model, other], optimizer)" in message


def test_setup_accepts_the_owner_of_every_optimized_parameter_among_its_models() -> None:
    model, head = mlp(), nn.Linear(8, 2)
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
    (m, h), _ = Engine("32-true").setup([model, head], opt)
    assert m is model and h is head


def test_setup_accepts_frozen_layers_and_trains_like_the_plain_loop() -> None:
    # A model parameter in no optimizer is a frozen layer, not a mistake: the run must match plain torch.
    torch.manual_seed(0)
    treatment = mlp()
    control = copy.deepcopy(treatment)
    x, y = torch.randn(16, 8), torch.randn(16, 3)

    def trainable(m: nn.Module) -> list[nn.Parameter]:
        return [p for n, p in m.named_parameters() if not n.startswith("0.")]  # the first layer stays frozen

    engine = Engine("32-true")
    model, opt = engine.setup(treatment, torch.optim.SGD(trainable(treatment), lr=0.1))
    control_opt = torch.optim.SGD(trainable(control), lr=0.1)
    frozen = control[0].weight.detach().clone()
    for _ in range(3):
        opt.zero_grad()
        engine.backward(nn.functional.mse_loss(model(x), y))
        engine.step()
        control_opt.zero_grad()
        nn.functional.mse_loss(control(x), y).backward()
        control_opt.step()
    for a, b in zip(treatment.parameters(), control.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(treatment[0].weight, frozen)
