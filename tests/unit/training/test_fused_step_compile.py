"""A fused master step whose region fails to compile: the step is taken unfused, and so is the rest of the run,
after one warning; each run checked against a control with ``fused_step=False`` (same weights, same data), bitwise.
Errors that are not the compiler's (the step's own ops, the compiled code at run time) still propagate. And the
torch.compile arguments the region gets: one graph, inductor's loop reordering off where torch needs it."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from ampkit import Engine, _compat
from ampkit.training._fused_step_compile import region_compile_kwargs

AOT = {"backend": "aot_eager"}


def model(device: torch.device | str = "cpu") -> nn.Module:
    torch.manual_seed(0)  # built on the CPU, then moved: every device starts from the same weights
    return nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.LayerNorm(20), nn.Linear(20, 5)).to(device)


def batches(n: int, device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 12, generator=g).to(device), torch.randint(0, 5, (8,), generator=g).to(device)) for _ in range(n)]


def setup(fused: Any, net: nn.Module, precision: str = "16-true-masters", **engine_kwargs: Any) -> tuple[Engine, nn.Module, torch.optim.Optimizer]:
    engine = Engine(precision, fused_step=fused, clip_grad_norm=0.5, **engine_kwargs)
    net = copy.deepcopy(net)
    net, opt = engine.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1))
    return engine, net, opt


def backward(engine: Engine, net: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], overflow: bool = False) -> None:
    x, y = batch
    engine.backward(nn.functional.cross_entropy(net(x.to(net[0].weight.dtype)).float(), y))
    if overflow:
        net[3].weight.grad[0, 0] = float("inf")


def state(engine: Engine, net: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Everything a step writes or keeps: the 16-bit model, the masters, the optimizer's state (step counts with
    their device) and its groups' settings, the engine's counters and scaler."""
    out: dict[str, Any] = {f"model.{n}": p.detach().clone() for n, p in net.named_parameters()}
    for i, p in enumerate(q for g in opt.param_groups for q in g["params"]):
        out[f"param.{i}"] = p.detach().clone()
        out.update({f"state.{i}.{k}": v.clone() for k, v in opt.state[p].items()})
    out.update({f"group.{i}": {k: v for k, v in g.items() if k != "params"} for i, g in enumerate(opt.param_groups)})
    out.update({f"engine.{k}": v for k, v in engine.state_dict().items() if k != "masters"})
    out["engine.steps"], out["engine.scale"] = engine.steps, engine.scale
    return out


def assert_identical(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            # Same device, dtype and bits: a step count left on the GPU by the region would show here.
            assert got[key].device == value.device and torch.equal(got[key], value), key
        else:
            assert got[key] == value and type(got[key]) is type(value), (key, got[key], value)  # a tensor lr is not a float


class FailingBackend:
    """A torch.compile backend that compiles its first ``good`` graphs as they are and fails on the next."""

    def __init__(self, good: int = 0) -> None:
        self.good, self.calls = good, 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        self.calls += 1
        if self.calls > self.good:
            raise RuntimeError("no kernels today\n(the rest of a long compiler message)")
        return gm.forward


def test_a_region_that_fails_to_compile_is_taken_unfused_for_the_rest_of_the_run(device: torch.device) -> None:
    backend = FailingBackend()
    runs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fused in ({"backend": backend}, False):
            engine, net, opt = setup(fused, model(device))
            for step, batch in enumerate(batches(5, device)):
                backward(engine, net, batch, overflow=step == 3)  # a skipped step: the scaler backs off in both
                engine.step()
            runs.append((engine, state(engine, net, opt)))
    (engine, got), (_, want) = runs
    # Step 1 builds the optimizer's state unfused; step 2 tries the region once; every step is then unfused.
    assert backend.calls == 1 and engine.fused_step.calls == 0
    assert engine.fused_step.failure == "BackendCompilerFailed: RuntimeError: no kernels today"
    assert_identical(got, want)
    assert engine.skipped_steps == 1
    ours = [w for w in caught if "ampkit" in str(w.message)]
    assert len(ours) == 1 and ours[0].category is UserWarning
    assert "BackendCompilerFailed: RuntimeError: no kernels today" in str(ours[0].message) and "fused_step=False" in str(ours[0].message)
    assert ours[0].filename == __file__  # the line that called engine.step(), not ampkit's


def test_a_failure_when_the_region_recompiles_takes_that_step_unfused_as_the_control_does() -> None:
    # The region compiles, steps twice, then a parameter without a gradient makes dynamo recompile, which fails.
    backend = FailingBackend(good=1)
    fused, fused_net, fused_opt = setup({"backend": backend}, model())
    plain, plain_net, plain_opt = setup(False, model())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, batch in enumerate(batches(5)):
            if step:  # from the control's state each time, so the step compared is this one alone
                fused.load_state_dict(plain.state_dict())
                fused_opt.load_state_dict(copy.deepcopy(plain_opt.state_dict()))
                fused_net.load_state_dict(plain_net.state_dict())
            for engine, net in ((fused, fused_net), (plain, plain_net)):
                backward(engine, net, batch)
                if step >= 3:
                    net[0].bias.grad = None
                engine.step()
            if step < 3:  # fused against unfused: the same update, rounded differently
                tensors = lambda d: {k: v for k, v in d.items() if isinstance(v, torch.Tensor)}
                torch.testing.assert_close(tensors(state(fused, fused_net, fused_opt)), tensors(state(plain, plain_net, plain_opt)))
            else:
                assert_identical(state(fused, fused_net, fused_opt), state(plain, plain_net, plain_opt))
    assert fused.fused_step.calls == 2 and backend.calls == 2  # no third attempt
    assert fused.fused_step.failure is not None and len([w for w in caught if "ampkit" in str(w.message)]) == 1


def test_a_collapse_reported_by_the_unfused_step_it_fell_back_to_still_turns_the_region_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # The collapse error is raised after the step is complete: the unfused step did succeed.
    from ampkit._errors import LossScaleCollapseError

    backend = FailingBackend()
    engine, net, _ = setup({"backend": backend}, model(), precision="bf16-true-masters", skip_nonfinite=True)
    monkeypatch.setattr(engine.optimizer_step, "diagnose_collapse", lambda: "the scale collapsed (a stand-in diagnosis)")
    data = batches(3)
    backward(engine, net, data[0])
    engine.step()
    backward(engine, net, data[1], overflow=True)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(LossScaleCollapseError, match="stand-in"):
        warnings.simplefilter("always")
        engine.step()
    assert len([w for w in caught if "failed to compile" in str(w.message)]) == 1
    assert engine.fused_step.failure is not None and engine.steps == 2 and engine.skipped_steps == 1
    backward(engine, net, data[2])
    engine.step()  # unfused, without another attempt (the suite's filterwarnings: no second warning either)
    assert backend.calls == 1


def test_an_error_of_the_steps_own_ops_propagates_as_the_unfused_step_raises_it() -> None:
    # A moment of the wrong shape: tracing reports it wrapped, as it would a compiler fault; the unfused step
    # raises it too, so it is the training's error, and the region stays on.
    errors = []
    for fused in (AOT, False):
        engine, net, opt = setup(fused, model())
        data = batches(2)
        backward(engine, net, data[0])
        engine.step()
        opt.state[opt.param_groups[0]["params"][0]]["exp_avg"] = torch.zeros(3)
        backward(engine, net, data[1])
        with pytest.raises(RuntimeError) as raised:
            engine.step()  # the suite's filterwarnings makes a fallback warning an error here too
        errors.append(raised.value)
        assert all(isinstance(g["lr"], float) for g in opt.param_groups)
        if fused:
            assert engine.fused_step.failure is None
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1])


def test_an_error_of_the_compiled_code_at_run_time_propagates() -> None:
    def out_of_memory(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        def run(*args: Any) -> Any:
            raise torch.OutOfMemoryError("out of memory (raised by the compiled step)")

        return run

    engine, net, opt = setup({"backend": out_of_memory}, model())
    for i, batch in enumerate(batches(2)):
        backward(engine, net, batch)
        if i == 0:
            engine.step()
    with pytest.raises(torch.OutOfMemoryError, match="raised by the compiled step"):
        engine.step()
    assert engine.fused_step.failure is None and all(isinstance(g["lr"], float) for g in opt.param_groups)


@pytest.mark.parametrize("torch_asserts", [True, False], ids=["torch-2.11", "torch-2.12+"])
def test_inductor_failing_in_its_scheduler_falls_back_and_the_region_compiles_without_loop_reordering_where_needed(
    torch_asserts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The crash of issue 34 (an assert in inductor's fusion pass), on this CPU: fuse_nodes records the setting it
    # runs under, then asserts. The user's process-wide setting is on, as torch 2.10 and 2.11 default to.
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor.scheduler import Scheduler

    seen = []

    def fuse_nodes(self: Scheduler, nodes: list[Any]) -> list[Any]:
        seen.append(inductor_config.loop_ordering_after_fusion)
        raise AssertionError  # bare, as inductor's `assert isinstance(snode, SchedulerNode)` (pytest rewrites ours)

    monkeypatch.setattr(Scheduler, "fuse_nodes", fuse_nodes)
    monkeypatch.setattr(_compat._compile, "INDUCTOR_FOREACH_REORDER_ASSERTS", torch_asserts)
    engine, net, _ = setup(True, model(), precision="bf16-true-masters")

    def train() -> None:
        for batch in batches(3):
            backward(engine, net, batch)
            engine.step()

    # A cached graph would skip the scheduler: no caches.
    caches = {"enable_autograd_cache": False} if hasattr(functorch_config, "enable_autograd_cache") else {}
    with inductor_config.patch(loop_ordering_after_fusion=True, fx_graph_cache=False), functorch_config.patch(caches):
        # InductorError on recent torch (2.11, 2.13); older releases leave an uncached compile's error to dynamo's
        # BackendCompilerFailed.
        with pytest.warns(UserWarning, match="(InductorError|BackendCompilerFailed): AssertionError at .*in fuse_nodes") as caught:
            train()
        assert inductor_config.loop_ordering_after_fusion is True  # the user's setting, untouched outside the region
    assert len(seen) == 1 and seen[0] is not torch_asserts  # off for the region only where this torch asserts
    assert engine.fused_step.calls == 0 and "AssertionError at" in engine.fused_step.failure
    assert len([w for w in caught if "ampkit" in str(w.message)]) == 1


@pytest.mark.parametrize(
    "options, torch_asserts, want",
    [
        ({}, True, {"fullgraph": True, "options": {"loop_ordering_after_fusion": False}}),
        ({}, False, {"fullgraph": True}),
        ({"fullgraph": False, "dynamic": False}, False, {"fullgraph": False, "dynamic": False}),
        # The user's own option for the region wins over ampkit's.
        ({"options": {"loop_ordering_after_fusion": True}}, True, {"fullgraph": True, "options": {"loop_ordering_after_fusion": True}}),
        # Another backend takes no inductor options.
        ({"backend": "aot_eager"}, True, {"fullgraph": True, "backend": "aot_eager"}),
    ],
)
def test_the_region_is_one_graph_with_the_inductor_settings_this_torch_needs(
    options: dict[str, Any], torch_asserts: bool, want: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_compat._compile, "INDUCTOR_FOREACH_REORDER_ASSERTS", torch_asserts)
    assert region_compile_kwargs(options) == want


def test_a_mode_becomes_the_options_it_stands_for_next_to_the_region_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.compile takes mode or options, not both; torch itself turns a mode into options this way.
    from torch._inductor import list_mode_options

    monkeypatch.setattr(_compat._compile, "INDUCTOR_FOREACH_REORDER_ASSERTS", True)
    kwargs = region_compile_kwargs({"mode": "max-autotune-no-cudagraphs"})
    assert "mode" not in kwargs
    assert kwargs["options"] == {"loop_ordering_after_fusion": False, **list_mode_options("max-autotune-no-cudagraphs")}
    torch.compile(lambda x: x, **kwargs)  # accepted: torch.compile checks every option's name against inductor's config
