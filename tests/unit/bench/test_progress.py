"""The bench's progress: plain lines in a log, as often as promised, with the steps the runner reports."""

from __future__ import annotations

import io

import torch
from torch import nn

from ampkit.bench.progress import PLAIN_INTERVAL_S, PlainReporter
from ampkit.bench.runner import run_bench
from ampkit.workloads.user import workload_from


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
    from ampkit.cli.main import build_parser

    bench = next(a for a in build_parser()._actions if a.dest == "command").choices["bench"]
    no_progress = next(a for a in bench._actions if "--no-progress" in a.option_strings)
    assert f"most one every {PLAIN_INTERVAL_S:.0f} s" in no_progress.help  # the parsers import no bench: a copy
