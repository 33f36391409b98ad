"""The bench's progress: plain lines in a log, as often as promised, with the steps the runner reports."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from ampkit.bench._policy_run import PolicyRun
from ampkit.bench._progress import PLAIN_INTERVAL_S, NullReporter, PlainReporter
from ampkit.bench._runner import run_bench
from ampkit.policy import get_policy
from ampkit.workloads._user import workload_from
from ampkit.workloads._workload import Batch, Workload


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_between_a_runs_start_and_end_a_line_comes_at_most_every_interval() -> None:
    out, clock = io.StringIO(), _Clock()
    reporter = PlainReporter(out, clock=clock)
    reporter.start(100)
    reporter.update("a: measuring memory")
    reporter.update("b: measuring memory")  # another run starts: printed, however soon
    for second in range(1, 91):  # a step a second, each reported, as a fast run's would be
        clock.now = 100.0 + second
        reporter.update("a: round 1/1", advance=1)
    clock.now += 0.5
    reporter.update("a: done", advance=1)  # a run ends: printed at once
    assert _lines(out)[1:] == [
        "[0:00] 0/100 steps: a: measuring memory",
        "[0:00] 0/100 steps: b: measuring memory",
        "[0:30] 30/100 steps: a: round 1/1",
        "[1:00] 60/100 steps: a: round 1/1",
        "[1:30] 90/100 steps: a: round 1/1",
        "[1:30] 91/100 steps: a: done",
    ]


def test_every_run_of_a_real_bench_prints_its_start_and_end_and_the_steps_add_up() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(2)]
    workload = workload_from(nn.Linear(4, 2), batches, steps=2, warmup=1)
    out = io.StringIO()
    run_bench(workload, ["32-true", "bf16-true"], rounds=1, count_flops=False, reporter=PlainReporter(out, interval=1e9))
    lines = _lines(out)
    total = int(lines[0].split()[1])
    assert lines[0].startswith("progress: ") and lines[-1] == f"{lines[-1].split()[0]} {total}/{total} steps: finished"
    for run in ("32-true", "bf16-true"):
        assert sum(line.endswith(f"steps: {run}: measuring memory") for line in lines) == 1
        assert sum(line.endswith(f"steps: {run}: done") for line in lines) == 1
    assert len(lines) == 1 + 2 * 2 + 1  # nothing between: the interval was never reached


def test_the_interval_is_what_the_help_says() -> None:
    from ampkit.cli._main import build_parser

    bench = next(a for a in build_parser()._actions if a.dest == "command").choices["bench"]
    no_progress = next(a for a in bench._actions if "--no-progress" in a.option_strings)
    assert f"most one every {PLAIN_INTERVAL_S:.0f} s" in no_progress.help  # the parsers import no bench: a copy


def test_a_run_that_starts_compiling_says_so_at_once() -> None:
    # On the H200 (2026-11-28) the log read "bf16-true-sr: measuring memory" and then nothing for more than 80 s: its
    # optimizer step was compiling. A phase the user waits on is printed when it starts, however soon after the last.
    out, clock = io.StringIO(), _Clock()
    reporter = PlainReporter(out, clock=clock)
    reporter.start(10)
    reporter.update("sr: measuring memory")
    clock.now += 1.0
    reporter.update("sr: compiling the optimizer step")
    clock.now += 1.0
    reporter.update("sr: measuring memory", advance=2)  # back to the phase it was in: nothing new to say
    assert _lines(out)[1:] == ["[0:00] 0/10 steps: sr: measuring memory", "[0:01] 0/10 steps: sr: compiling the optimizer step"]


def _sr_or_skip() -> None:
    from ampkit.policy._lowbit_optimizers import missing_library

    if missing_library("sr") is not None:
        pytest.skip(f"bf16-true-sr {missing_library('sr')}")


def _tiny() -> tuple[Workload, list[Batch]]:
    g = torch.Generator().manual_seed(0)
    batches: list[Batch] = [(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(2)]
    return workload_from(nn.Linear(4, 2), batches, steps=2, warmup=1), batches


def test_a_run_whose_engine_compiles_its_optimizer_step_names_it_once_where_it_may_compile(device: torch.device) -> None:
    # bf16-true-sr's engine steps through one compiled region (ampkit.training._fused_library_step). The run says so
    # once, when it builds an engine whose steps may compile: not during the memory measurement (an eager run's is
    # forced eager throughout, on every device: on CUDA its third warm-up step compiled the throwaway engine's region,
    # which the timed engine then compiled again), then at the timed build; the control (bf16-true: no region) never.
    _sr_or_skip()
    workload, batches = _tiny()
    told: dict[str, list[str]] = {}
    for precision in ("bf16-true", "bf16-true-sr"):
        run = PolicyRun(workload, get_policy(precision), device, batches, seed=0)
        run.on_phase = told.setdefault(precision, []).append
        run.measure_alone(4, flops=False)  # past the two steps that were always eager
        assert told[precision] == [], "an eager run's memory steps run eagerly: nothing compiles there"
        run.build()
        run.build()  # another engine, the same run: said once
    assert told == {"bf16-true": [], "bf16-true-sr": ["compiling the optimizer step"]}


@pytest.mark.parametrize(
    ("precision", "compiles"),
    [("32-true", "compiling the model"), ("bf16-true-masters", "compiling the model and the optimizer step")],
)
def test_a_compiled_run_names_what_it_compiles(precision: str, compiles: str) -> None:
    # compile=: the model compiles in the run's first steps, and a master-weight policy's step with it (the fused
    # master step, ampkit.training._fused_master_step). Only the engine is built here: nothing is traced.
    workload, batches = _tiny()
    told: list[str] = []
    run = PolicyRun(workload, get_policy(precision), torch.device("cpu"), batches, seed=0, compile={"backend": "eager"}, mode="model")
    run.on_phase = told.append
    run.build()
    assert told == [compiles]


def test_the_bench_tells_its_reporter_once_per_run_what_it_compiles() -> None:
    # The runner's wiring: the run's phase reaches the progress as "<run>: <phase>", once. The steps are forced
    # eager here (what compiles is not this test's subject, and inductor would take most of a minute on a CPU).
    _sr_or_skip()
    workload, _ = _tiny()
    seen: list[str] = []

    class Recording(NullReporter):
        def update(self, description: str, advance: int = 0) -> None:
            seen.append(description)

    with torch.compiler.set_stance("force_eager"):
        run_bench(workload, ["32-true", "bf16-true-sr"], rounds=1, count_flops=False, reporter=Recording())
    assert [d for d in seen if "compiling" in d] == ["bf16-true-sr: compiling the optimizer step"], seen
