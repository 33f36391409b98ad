"""Tests for the TensorBoard logs, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from ampkit._errors import AmpkitError
from ampkit.bench._results import BenchResult
from ampkit.bench._tensorboard import log_tensorboard, run_dir_name


def _load(run_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return events


def _scalars(events: EventAccumulator) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _verdict(events: EventAccumulator) -> str:
    (event,) = events.Tensors("bench/verdict/text_summary")
    return tensor_util.make_ndarray(event.tensor_proto).item().decode()


@pytest.fixture
def logged(bench_result: BenchResult, tmp_path: Path) -> Path:
    return log_tensorboard(bench_result, tmp_path / "tb")


def test_one_directory_per_policy(bench_result: BenchResult, logged: Path) -> None:
    assert sorted(p.name for p in logged.iterdir()) == sorted(r.precision for r in bench_result.runs)
    assert all(any(p.name.startswith("events.out.tfevents") for p in d.iterdir()) for d in logged.iterdir())


def test_loss_curve_and_summary_scalars(bench_result: BenchResult, logged: Path) -> None:
    ref = bench_result.runs[0]
    scalars = _scalars(_load(logged / "bf16-mixed"))
    run = bench_result.runs[1]
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, len(run.losses) + 1))
    assert [v for _, v in scalars["train/loss"]] == pytest.approx(run.losses, rel=1e-6)  # stored as float32
    last = len(run.losses)
    assert scalars["bench/step_time_ms"] == [(last, pytest.approx(12.5))]
    assert scalars["bench/throughput"] == [(last, pytest.approx(10240.0))]
    assert scalars["bench/peak_memory_mib"] == [(last, pytest.approx(19.0))]
    assert scalars["bench/speedup_vs_fp32"] == [(last, pytest.approx(1.6))]
    assert scalars["eval/accuracy"] == [(last, pytest.approx(0.9583))]
    assert scalars["eval/eval_loss"] == [(last, pytest.approx(0.1502))]
    assert "bench/final_loss_scale" not in scalars  # bf16 does not scale the loss
    assert _scalars(_load(logged / "16-mixed"))["bench/final_loss_scale"] == [(last, 32768.0)]
    assert _scalars(_load(logged / "32-true"))["eval/accuracy"][0][1] == pytest.approx(ref.eval_metric)


def test_diverged_run_logs_only_finite_losses(bench_result: BenchResult, logged: Path) -> None:
    scalars = _scalars(_load(logged / "16-true"))
    steps = [s for s, _ in scalars["train/loss"]]
    assert steps == list(range(1, 31))  # step 31 was inf, the rest NaN
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])


def test_verdicts_as_text(bench_result: BenchResult, logged: Path) -> None:
    for run in bench_result.runs:
        assert _verdict(_load(logged / run.precision)) == run.verdict


def test_failed_run_has_its_verdict_and_no_scalars(logged: Path) -> None:
    events = _load(logged / "bf16-true")
    assert events.Tags()["scalars"] == []
    assert "not implemented for 'Half'" in _verdict(events)


def test_throughput_only_workload_has_no_eval_scalars(throughput_result: BenchResult, tmp_path: Path) -> None:
    root = log_tensorboard(throughput_result, tmp_path)
    tags = _load(root / "32-true").Tags()["scalars"]
    assert "bench/throughput" in tags and not [t for t in tags if t.startswith("eval/")]


def test_run_directory_names_are_safe() -> None:
    assert run_dir_name("bf16-mixed") == "bf16-mixed"
    assert run_dir_name("../evil") == ".._evil"
    assert run_dir_name("") == "_"


def test_missing_tensorboard_says_how_to_install(
    bench_result: BenchResult, tmp_path: Path, block_import: Callable[[str], None]
) -> None:
    block_import("torch.utils.tensorboard")
    block_import("tensorboard")
    with pytest.raises(AmpkitError, match=r'pip install "ampkit\[bench\]"'):
        log_tensorboard(bench_result, tmp_path / "tb")
    assert not (tmp_path / "tb").exists()
