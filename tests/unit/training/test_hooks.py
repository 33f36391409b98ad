"""Step hooks: the calls, their order and arguments, and the tools that attach through them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.memory._tracker import MemoryTracker
from ampkit.numerics._sampler import NumericsSampler
from ampkit.training._hooks import Hooks, StepHook


class Recorder:
    """A hook defining every method, recording what the engine shows it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def wrap_forward(self, engine, forward):
        self.calls.append(("forward", engine.is_boundary))
        return forward

    def before_backward(self, engine, loss):
        self.calls.append(("before_backward", float(loss.detach())))

    def after_backward(self, engine):
        self.calls.append(("after_backward", engine.micro_batches_pending))

    def before_optimizer_step(self, engine):
        grad = engine.models[0].weight.grad
        self.calls.append(("before_step", engine.steps, None if grad is None else float(grad.sum())))

    def after_optimizer_step(self, engine):
        self.calls.append(("after_step", engine.steps, engine.models[0].weight.grad is None))


def _run(engine: Engine, micro_batches: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Linear(3, 1)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for i in range(micro_batches):
        with engine.autocast():
            loss = model(torch.full((2, 3), float(i + 1))).sum()
        engine.backward(loss)
        engine.step()
    return model


def test_hooks_are_called_in_order_with_the_raw_loss_and_the_scaled_gradients():
    hook = Recorder()
    engine = Engine("16-mixed", accumulate=2, scaler=1024.0, hooks=[hook])
    model = _run(engine, 2)
    names = [c[0] for c in hook.calls]
    assert names == ["forward", "before_backward", "after_backward", "forward", "before_backward", "after_backward", "before_step", "after_step"]
    assert [c[1] for c in hook.calls if c[0] == "forward"] == [False, True]
    # before_backward sees the loss before it is divided by the window and scaled (control: the model's own output).
    torch.manual_seed(0)
    control = nn.Linear(3, 1)
    with torch.no_grad():
        expected = float(control(torch.full((2, 3), 1.0)).sum())
    assert hook.calls[1][1] == pytest.approx(expected, rel=1e-2)
    # before_optimizer_step sees the gradients as backward left them: scaled by 1024 (fp16 weights).
    _, steps, scaled_sum = hook.calls[6]
    assert steps == 1 and abs(scaled_sum) > 100
    assert hook.calls[7] == ("after_step", 1, True)  # the step is complete: gradients zeroed
    assert model.weight.grad is None


def test_a_hook_does_not_change_training():
    plain = _run(Engine("bf16-mixed", accumulate=2), 6)
    hooked = _run(Engine("bf16-mixed", accumulate=2, hooks=[Recorder()]), 6)
    for a, b in zip(plain.parameters(), hooked.parameters()):
        assert torch.equal(a, b)


def test_only_the_methods_a_hook_defines_are_called():
    class AfterOnly(StepHook):
        def __init__(self):
            self.steps = []

        def after_optimizer_step(self, engine):
            self.steps.append(engine.steps)

    hook = AfterOnly()
    hooks = Hooks([hook])
    assert [name for name, calls in hooks.calls.items() if calls] == ["after_optimizer_step"]
    engine = Engine(accumulate=3)
    engine.add_hook(hook)
    _run(engine, 7)
    assert hook.steps == [1, 2]


def test_bad_hooks_are_refused_with_the_fix():
    with pytest.raises(TypeError, match="no step hook.*subclass StepHook"):
        Engine(hooks=[object()])
    hook = Recorder()
    engine = Engine(hooks=[hook])
    with pytest.raises(ValueError, match="added to this engine already"):
        engine.add_hook(hook)


def test_numerics_as_an_argument_and_as_a_hook_sample_the_same():
    by_arg = Engine("bf16-mixed", numerics=2)
    _run(by_arg, 4)
    sampler = NumericsSampler(every=2)
    by_hook = Engine("bf16-mixed", hooks=[sampler])
    _run(by_hook, 4)
    assert by_arg.numerics.last.step == sampler.last.step == 4
    assert sorted(by_arg.numerics.last.modules) == sorted(sampler.last.modules)
    a, b = by_arg.numerics.last, sampler.last
    assert (a.scale, a.activations) == (b.scale, b.activations)
    for name, kinds in a.modules.items():
        assert {k: repr(v) for k, v in kinds.items()} == {k: repr(v) for k, v in b.modules[name].items()}


def test_the_memory_tracker_as_a_hook_finds_a_kept_graph_like_the_manual_calls():
    def loop(use_hook: bool) -> MemoryTracker:
        torch.manual_seed(0)
        model = nn.Linear(8, 2)
        tracker = MemoryTracker("cpu", watch=model, window=8, warmup=1, min_growth=64)
        engine = Engine(hooks=[tracker] if use_hook else [])
        model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.01))
        kept = []
        with tracker:
            for _ in range(12):
                loss = model(torch.randn(4, 8)).sum()
                engine.backward(loss)
                engine.step()
                kept.append(loss)  # the bug: each loss, with its graph, outlives its step
                if not use_hook:
                    tracker.step(loss)
        return tracker

    manual, hooked = loop(False), loop(True)
    assert manual.warning is not None and hooked.warning is not None
    assert "`kept`" in manual.warning and "`kept`" in hooked.warning  # named from the loop's variables
    assert len(hooked.samples) == len(manual.samples) == 12
