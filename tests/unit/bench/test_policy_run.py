"""One policy's run measured alone: its memory figures against ampkit.memory's control, at any accumulation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.bench._results import BenchResult
from ampkit.bench._runner import run_bench
from ampkit.memory import measure
from ampkit.workloads._workload import Workload, default_optimizer

ROWS = 8
POLICIES = ["32-true", "bf16-mixed"]


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    )


def _workload(accumulate: int) -> Workload:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(ROWS, 3, 8, 8, generator=g), torch.randint(0, 4, (ROWS,), generator=g)) for _ in range(4)]
    return Workload(name="cnn", model=_cnn(), train_batches=batches, items_per_batch=ROWS, steps=2, warmup=1, accumulate=accumulate)


@pytest.fixture(scope="module")
def one_micro_batch() -> BenchResult:
    return run_bench(_workload(1), POLICIES, "cpu", rounds=1)


@pytest.mark.parametrize("precision", POLICIES)
def test_cpu_peak_is_the_live_tensor_peak_ampkit_memory_measures(one_micro_batch: BenchResult, precision: str) -> None:
    # One definition for both tools: the most bytes of live tensors during the step. The control is
    # ampkit.memory.measure (what `ampkit memory` predicts to the byte on the CPU) on the same model, batch,
    # optimizer, loss and clipping.
    w, run = _workload(1), one_micro_batch.run(precision)
    control = measure(w.model, w.train_batches[0], default_optimizer, precision, loss_fn=w.loss_fn, clip_grad_norm=w.clip_grad_norm)
    # The bench keeps each step's loss (a 4-byte scalar) for its loss curve: the only bytes it holds beyond the step.
    assert control.peak <= run.peak_memory_bytes <= control.peak + 4 * 2
    assert run.activation_bytes == control.activations


def test_accumulating_micro_batches_multiplies_the_work_not_the_activations_or_peak(one_micro_batch: BenchResult) -> None:
    one = one_micro_batch.run("32-true")
    four = run_bench(_workload(4), ["32-true"], "cpu", rounds=1).runs[0]  # 4 micro-batches like the one
    assert four.activation_bytes == one.activation_bytes  # each backward frees its micro-batch's graph
    # What accumulation does hold: the gradients summed so far live through the next micro-batch's forward and
    # backward, which a single micro-batch's step (gradients set to None after each update) does not. That is
    # the whole tolerance: at most one set of gradients (plus the loss scalars the bench keeps, 4 bytes each).
    gradients = one.memory_breakdown["gradients"]
    assert one.peak_memory_bytes <= four.peak_memory_bytes <= one.peak_memory_bytes + gradients + 4 * 8
    # The work does multiply: a step is K micro-batches, and its FLOPs (and throughput) count all of them.
    assert four.flops_per_step == 4 * one.flops_per_step and four.flops_by_format == {"fp32": four.flops_per_step}


class _CompilesAtCall(nn.Module):
    """A Linear whose ``at``-th forward goes through a compiled function, so that step compiles (as torchao's
    optimizer compiles its step at its second call, after the first built its state)."""

    def __init__(self, compiled: object, at: int | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.compiled, self.at, self.calls = nn.Linear(4, 3), compiled, at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        # On the input, a leaf: dynamo reading a non-leaf's .grad warns, which the suite's filterwarnings makes an error.
        return self.lin(self.compiled(x) if self.calls == self.at else x)  # type: ignore[operator]


@pytest.mark.parametrize("at", [None, 2], ids=["control", "compiles-in-the-first-timed-step"])
def test_a_step_that_compiles_after_the_warm_up_is_left_out_of_the_step_time(at: int | None) -> None:
    # With --warmup 1, bf16-true-sr's step compiled in the first timed step: a 2 s step among 8 ms ones made its
    # median and interval read "1411x slower". A step that compiles is compilation, not a step time.
    compiled = torch.compile(lambda t: t * 1.0, backend="eager")  # a fresh function: it compiles at its first call
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(ROWS, 4, generator=g), torch.randint(0, 3, (ROWS,), generator=g)) for _ in range(6)]
    workload = Workload(name="late", model=_CompilesAtCall(compiled, at), train_batches=batches, items_per_batch=ROWS, steps=6, warmup=1)
    run = run_bench(workload, ["32-true"], "cpu", rounds=1, count_flops=False).runs[0]
    if at is None:
        assert (run.compiling_steps, run.timed_steps, run.compile_time_s) == (0, 5, None)
        return
    assert run.error is None, run.error
    assert run.compiling_steps == 1 and run.timed_steps == 4 and len(run.step_times_s) == 4
    assert run.compile_time_s is not None and run.compile_time_s >= 0
    from ampkit.bench._table import run_notes

    assert "1 step(s) after the warm-up compiled: left out of the step time (raise --warmup)" in run_notes(run)


def test_engine_options_and_prepare_reach_the_engine_and_each_fresh_copy() -> None:
    # ampkit tune varies what the bench's runs fix: an Engine keyword (fused_step) and a change to the model copy
    # before setup (recompute). The control: the same run without them, same weights and batches.
    from ampkit.bench import PolicyRun
    from ampkit.memory import recompute, recomputed_modules
    from ampkit.policy import get_policy

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(ROWS, 6, generator=g), torch.randint(0, 3, (ROWS,), generator=g)) for _ in range(3)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(6, 16), nn.Tanh()), nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 3))
    workload = Workload(name="mlp", model=model, train_batches=batches, items_per_batch=ROWS, steps=3, warmup=1)

    def checkpoint_blocks(m: nn.Module) -> None:
        recompute(m, [nn.Sequential])

    plain = PolicyRun(workload, get_policy("32-true"), torch.device("cpu"), batches, seed=0)
    varied = PolicyRun(workload, get_policy("32-true"), torch.device("cpu"), batches, seed=0,
                       engine_options={"keep_fp32": ["2"]}, prepare=checkpoint_blocks)
    for run in (plain, varied):
        run.build()
        run.train(3, False)
    assert varied.engine.policy.keep_fp32 == ("2",) and plain.engine.policy.keep_fp32 == ()
    assert recomputed_modules(varied.model) and not recomputed_modules(plain.model) and not recomputed_modules(model)
    # Recomputing the forward in backward gives the same gradients: the same losses, bit for bit.
    assert torch.equal(torch.stack(varied.losses), torch.stack(plain.losses))


def test_train_asks_stop_before_each_step_and_reads_the_times_of_the_steps_it_ran() -> None:
    # A deadline inside a call: the steps run until stop() says so, and exactly those are timed (the plain call,
    # stop=None, runs them all).
    from ampkit.bench import PolicyRun
    from ampkit.policy import get_policy

    w = _workload(accumulate=1)
    batches = list(w.train_batches[:6])
    run = PolicyRun(w, get_policy("32-true"), torch.device("cpu"), batches, seed=0)
    run.build()
    asked: list[int] = []

    def stop() -> bool:
        asked.append(len(asked))
        return len(asked) > 2  # the third question says stop

    run.train(5, True, stop)
    assert len(asked) == 3 and len(run.times) == 2 and run.steps_done == 2
    run.train(3, True)
    assert len(run.times) == 5
