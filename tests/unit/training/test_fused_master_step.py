"""The fused master step: each fused step checked against the unfused step from the same state (weights,
gradients, optimizer state), an overflowed step leaving everything as it was, a learning-rate schedule that does
not recompile, and the settings it refuses."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
from torch import nn

from ampkit import Engine

AOT = {"backend": "aot_eager"}  # traces through AOTAutograd and functionalization, as inductor does, without codegen


def model(width: int = 32, seed: int = 0) -> nn.Module:
    # A LayerNorm, which the masters policies keep in fp32 (stepped directly, without a master), between Linears
    # whose widths are not multiples of a vector length, so vectorised bodies and scalar tails are both exercised.
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(24, width), nn.GELU(), nn.LayerNorm(width), nn.Linear(width, 5))


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 24, generator=g), torch.randint(0, 5, (16,), generator=g)) for _ in range(n)]


def setup(fused: Any, precision: str, make_opt: Any, net: nn.Module, **engine_kwargs: Any) -> tuple[Engine, nn.Module, torch.optim.Optimizer]:
    net = copy.deepcopy(net)
    engine = Engine(precision, fused_step=fused, **engine_kwargs)
    net, opt = engine.setup(net, make_opt(net.parameters()))
    return engine, net, opt


def backward(engine: Engine, net: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = batch
    with engine.autocast():
        loss = nn.functional.cross_entropy(net(x.to(net[0].weight.dtype)).float(), y)
    engine.backward(loss)


def snapshot(engine: Engine, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every value a step writes: the 16-bit model, the masters, the fp32 parameters and the optimizer state."""
    out = {f"model.{n}": p.detach().clone() for n, p in engine.named_parameters()}
    out.update({f"master.{n}": m.detach().clone() for n, m in zip(engine.masters.names, engine.masters.masters)})
    for i, p in enumerate(q for g in opt.param_groups for q in g["params"]):
        out[f"param.{i}"] = p.detach().clone()
        for k, v in opt.state[p].items():
            out[f"state.{i}.{k}"] = torch.as_tensor(v).detach().clone().float()
    return out


OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True),
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
}


@pytest.mark.parametrize(
    "precision, optimizer, clip",
    [
        ("bf16-true-masters", "adamw", {"clip_grad_norm": 0.5}),
        ("bf16-true-masters", "sgd-nesterov", {"clip_grad_norm": 0.5}),
        ("16-true-masters", "adam-amsgrad", {"clip_grad_value": 0.01}),
        ("16-true-masters", "sgd-nesterov", {}),
    ],
)
def test_each_fused_step_matches_the_unfused_step_from_the_same_state(precision: str, optimizer: str, clip: dict[str, float]) -> None:
    net = model()
    plain, plain_net, plain_opt = setup(False, precision, OPTIMIZERS[optimizer], net, **clip)
    fused, fused_net, fused_opt = setup(AOT, precision, OPTIMIZERS[optimizer], net, **clip)
    for step, batch in enumerate(batches(4)):
        # From the same state each time: the fused engine is brought level with the plain one before its step,
        # so a difference is this step's and cannot grow over the run.
        if step:
            fused.load_state_dict(plain.state_dict())
            fused_opt.load_state_dict(copy.deepcopy(plain_opt.state_dict()))  # loading keeps the tensors it is given
            fused_net.load_state_dict(plain_net.state_dict())
        for engine, net_ in ((plain, plain_net), (fused, fused_net)):
            backward(engine, net_, batch)
            engine.step()
        if clip.get("clip_grad_norm"):
            torch.testing.assert_close(fused.step_state.norm, plain.step_state.norm)
        torch.testing.assert_close(snapshot(fused, fused_opt), snapshot(plain, plain_opt))
    assert fused.fused_step is not None and fused.fused_step.calls == 3  # the first step builds the state unfused
    # The 16-bit model is the master rounded, exactly.
    for p, m in zip(fused.masters.model_params, fused.masters.masters):
        assert torch.equal(p, m.to(p.dtype))
    assert all(isinstance(g["lr"], float) and not g.get("capturable") for g in fused_opt.param_groups)


def test_an_overflowed_step_changes_nothing_and_halves_the_scale() -> None:
    engine, net, opt = setup(AOT, "16-true-masters", OPTIMIZERS["adamw"], model(), clip_grad_norm=1.0)
    plain, plain_net, plain_opt = setup(False, "16-true-masters", OPTIMIZERS["adamw"], model(), clip_grad_norm=1.0)
    for batch in batches(2):
        for e, n in ((engine, net), (plain, plain_net)):
            backward(e, n, batch)
            e.step()
    before, scale = snapshot(engine, opt), engine.scale
    for e, n in ((engine, net), (plain, plain_net)):
        backward(e, n, batches(1, seed=5)[0])
        n[3].weight.grad[0, 0] = float("inf")  # one overflowed element in the 16-bit gradients
        e.step()
    assert engine.fused_step.calls == 2 and engine.step_was_skipped and plain.step_was_skipped
    assert engine.scale == scale / 2 == plain.scale
    after = snapshot(engine, opt)
    assert all(torch.equal(after[k], v) for k, v in before.items()), [k for k, v in before.items() if not torch.equal(after[k], v)]
    # The next clean step goes on from the untouched state as the unfused engine does.
    for e, n in ((engine, net), (plain, plain_net)):
        backward(e, n, batches(1, seed=6)[0])
        e.step()
    torch.testing.assert_close(snapshot(engine, opt), snapshot(plain, plain_opt))


def test_a_learning_rate_schedule_does_not_recompile() -> None:
    graphs = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm.forward

    runs = []
    for fused in ({"backend": counting}, False):
        net = model()
        engine = Engine("bf16-true-masters", fused_step=fused)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        net, opt = engine.setup(net, opt, schedulers=torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step))
        runs.append((engine, net, opt))
    (engine, net, opt), (plain, plain_net, plain_opt) = runs
    for batch in batches(6):
        for e, n in ((engine, net), (plain, plain_net)):
            backward(e, n, batch)
            e.step()
    assert engine.fused_step.calls == 5 and len(graphs) == 1
    assert opt.param_groups[0]["lr"] == plain_opt.param_groups[0]["lr"] == 1e-2 * 0.5**6
    # Each step used its own learning rate: the run matches the unfused one.
    # Loosely, and on the fp32 values: over several steps a last-bit difference can flip a bf16 rounding of the
    # model (and so the next gradients) by an ulp; a wrong rate would be off by a whole update, ~1e-2.
    fp32 = lambda snap: {k: v for k, v in snap.items() if not k.startswith("model.")}
    torch.testing.assert_close(fp32(snapshot(engine, opt)), fp32(snapshot(plain, plain_opt)), rtol=1e-3, atol=1e-4)


def test_inductor_fuses_a_step_that_matches_the_unfused_one_at_a_realistic_size() -> None:
    # Real codegen (C++ on this CPU, Triton on a GPU); widths with vector bodies and tails, one step from one state.
    net = model(width=515)
    plain, plain_net, plain_opt = setup(False, "bf16-true-masters", OPTIMIZERS["adamw"], net, clip_grad_norm=1.0)
    fused, fused_net, fused_opt = setup(True, "bf16-true-masters", OPTIMIZERS["adamw"], net, clip_grad_norm=1.0)
    for step, batch in enumerate(batches(2)):
        for e, n in ((plain, plain_net), (fused, fused_net)):
            backward(e, n, batch)
            e.step()
    assert fused.fused_step.calls == 1
    torch.testing.assert_close(snapshot(fused, fused_opt), snapshot(plain, plain_opt))


# ------------------------------------------------------------------------------------------ when it applies
def test_compile_brings_the_fused_step_where_it_can_run(caplog: pytest.LogCaptureFixture) -> None:
    engine, _, _ = setup(None, "bf16-true-masters", OPTIMIZERS["adamw"], model(), compile={"backend": "eager"})
    assert engine.fused_step is not None and engine.fused_step.options == {"backend": "eager"}
    assert setup(None, "bf16-true-masters", OPTIMIZERS["adamw"], model())[0].fused_step is None  # no compile
    assert setup(None, "bf16-mixed", OPTIMIZERS["adamw"], model(), compile={"backend": "eager"})[0].fused_step is None
    with caplog.at_level(logging.INFO, logger="ampkit"):
        engine, _, _ = setup(None, "bf16-true-masters", lambda ps: torch.optim.Adagrad(ps), model(), compile={"backend": "eager"})
    assert engine.fused_step is None and "stays unfused" in caplog.text and "Adagrad" in caplog.text


@pytest.mark.parametrize(
    "precision, make_opt, match",
    [
        ("bf16-mixed", OPTIMIZERS["adamw"], "only the master-weight policies"),
        ("bf16-true-masters", lambda ps: torch.optim.RMSprop(ps), "not RMSprop"),
        ("bf16-true-masters", lambda ps: torch.optim.Adam(ps, differentiable=True), "differentiable"),
    ],
)
def test_insisting_on_a_fused_step_that_cannot_run_is_refused_before_setup_changes_anything(precision: str, make_opt: Any, match: str) -> None:
    net = model()
    with pytest.raises(ValueError, match=match):
        Engine(precision, fused_step=True).setup(net, make_opt(net.parameters()))
    assert net[0].weight.dtype == torch.float32 and not net[0]._forward_pre_hooks  # the policy never touched it


def test_step_hooks_are_not_bypassed() -> None:
    net = model()
    opt = torch.optim.AdamW(net.parameters())
    opt.register_step_pre_hook(lambda *args: None)
    with pytest.raises(ValueError, match="step hooks"):
        Engine("bf16-true-masters", fused_step=True).setup(net, opt)


@pytest.mark.parametrize("spec", ["yes", 1, {1: 2}])
def test_a_fused_step_spec_that_is_not_understood_names_the_forms(spec: Any) -> None:
    with pytest.raises(ValueError, match="pass True, False, a dict"):
        Engine("bf16-true-masters", fused_step=spec)


def test_two_optimizers_step_together_as_the_unfused_step_does() -> None:
    # One total norm over both, each with its own parameters' state; SGD, whose update follows the gradient, so a
    # run of several steps stays within fp32's tolerance of the unfused one.
    runs = []
    for fused in (AOT, False):
        net = model()
        opts = [torch.optim.SGD(net[0].parameters(), lr=0.1, momentum=0.9), torch.optim.SGD([*net[2].parameters(), *net[3].parameters()], lr=0.05, momentum=0.5)]
        engine = Engine("16-true-masters", fused_step=fused, clip_grad_norm=0.5)
        net, *opts = engine.setup(net, *opts)
        for batch in batches(4):
            backward(engine, net, batch)
            engine.step()
        runs.append((engine, {f"{i}.{k}": v for i, o in enumerate(opts) for k, v in snapshot(engine, o).items()}))
    (fused_engine, got), (_, want) = runs
    assert fused_engine.fused_step.calls == 3
    torch.testing.assert_close(got, want)
