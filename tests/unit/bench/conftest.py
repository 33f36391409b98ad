"""Synthetic bench results for the presentation tests: every status, with and without an eval metric.

The figures are made up but consistent (speed-ups and savings match the times and memory), so a test can
check that what it reads back is the figure it put in.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable

import pytest

from ampkit.bench._results import BenchResult, RunResult

MiB = 2**20
STEPS = 60
FAILED_ERROR = "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'"
UNSUPPORTED_ERROR = "16-mixed needs CUDA: CPU autocast has no float16 loss scaling here"


def _curve(start: float, end: float, steps: int = STEPS) -> list[float]:
    """A decaying loss curve with a little deterministic wiggle, like a real one."""
    return [end + (start - end) * math.exp(-4 * i / steps) + 0.02 * math.sin(i) for i in range(steps)]


def _breakdown(params: int, master: int = 0, activations: int = 0) -> dict[str, int]:
    out = {"parameters": params, "gradients": params, "optimizer_state": 2 * params, "activations": activations}
    if master:
        out["master_weights"] = master
    return out


def reference_run(**overrides: object) -> RunResult:
    """32-true: the reference, with every figure a CPU run produces (MFU stays None on a CPU)."""
    breakdown = _breakdown(4 * MiB, activations=6 * MiB)
    fields: dict[str, object] = dict(
        precision="32-true",
        step_time_median_s=0.0200,
        step_time_p10_s=0.0190,
        step_time_p90_s=0.0230,
        timed_steps=50,
        throughput=6400.0,
        throughput_unit="samples",
        speedup_vs_fp32=1.0,
        peak_memory_bytes=sum(breakdown.values()),
        memory_breakdown=breakdown,
        activation_bytes=6 * MiB,
        peak_rss_bytes=350 * MiB,
        memory_saved_vs_fp32=0.0,
        losses=_curve(2.3, 0.25),
        final_loss=0.2512,
        eval_metric_name="accuracy",
        eval_metric=0.9611,
        eval_metrics={"accuracy": 0.9611, "eval_loss": 0.1423},
        within_tolerance=True,
        flops_per_step=2.4e9,
        achieved_flops=1.2e11,
        verdict="32-true: the fp32 reference",
    )
    fields.update(overrides)
    return RunResult(**fields)  # type: ignore[arg-type]


def bf16_mixed_run(**overrides: object) -> RunResult:
    """bf16-mixed: 1.6x faster, activations halved, accuracy within tolerance."""
    breakdown = _breakdown(4 * MiB, activations=3 * MiB)
    fields: dict[str, object] = dict(
        precision="bf16-mixed",
        step_time_median_s=0.0125,
        step_time_p10_s=0.0121,
        step_time_p90_s=0.0139,
        timed_steps=50,
        throughput=10240.0,
        speedup_vs_fp32=1.6,
        peak_memory_bytes=sum(breakdown.values()),
        memory_breakdown=breakdown,
        activation_bytes=3 * MiB,
        peak_rss_bytes=330 * MiB,
        memory_saved_vs_fp32=3 / 22,
        losses=_curve(2.3, 0.26),
        final_loss=0.2634,
        eval_metric_name="accuracy",
        eval_metric=0.9583,
        eval_metrics={"accuracy": 0.9583, "eval_loss": 0.1502},
        within_tolerance=True,
        flops_per_step=2.4e9,
        achieved_flops=1.92e11,
        mfu=0.0123,
        verdict="bf16-mixed: 1.60x faster, 14% less memory, accuracy 0.9583 within 0.02 of 32-true (0.9611): pays",
    )
    fields.update(overrides)
    return RunResult(**fields)  # type: ignore[arg-type]


def diverged_run() -> RunResult:
    """16-true: fp16 weights without loss scaling; the loss turns NaN at step 31 (index 30)."""
    losses = _curve(2.3, 0.5)[:30] + [float("inf")] + [float("nan")] * (STEPS - 31)
    return RunResult(
        precision="16-true",
        status="diverged",
        step_time_median_s=0.0110,
        step_time_p10_s=0.0105,
        step_time_p90_s=0.0131,
        timed_steps=50,
        throughput=11636.0,
        speedup_vs_fp32=20 / 11,
        peak_memory_bytes=5 * MiB,
        memory_breakdown={"parameters": 2 * MiB, "gradients": 2 * MiB, "activations": 1 * MiB},
        activation_bytes=1 * MiB,
        memory_saved_vs_fp32=1 - 5 / 22,
        losses=losses,
        final_loss=float("nan"),
        eval_metric_name="accuracy",
        eval_metric=0.1,
        within_tolerance=False,
        skipped_steps=0,
        verdict="16-true: 1.82x faster, 77% less memory, accuracy 0.1 OUTSIDE 0.02 of 32-true: the loss diverged",
    )


def failed_run() -> RunResult:
    """bf16-true broke on its first step: an error and no figures at all."""
    return RunResult(
        precision="bf16-true",
        status="failed",
        error=FAILED_ERROR + "\nTraceback (most recent call last):\n  ...",
        verdict=f"bf16-true: failed: {FAILED_ERROR}",
    )


def scaled_run() -> RunResult:
    """16-mixed with dynamic loss scaling: a few skipped steps and a final scale."""
    return bf16_mixed_run(
        precision="16-mixed",
        skipped_steps=3,
        final_loss_scale=32768.0,
        mfu=None,
        losses=_curve(2.4, 0.28),
        final_loss=0.2788,
        verdict="16-mixed: 1.60x faster, 14% less memory, accuracy 0.9583 within 0.02 of 32-true (0.9611): pays",
    )


@pytest.fixture
def bench_result() -> BenchResult:
    """A digits-like bench on CPU: reference, a faster bf16-mixed, a scaled 16-mixed, a diverged and a failed run."""
    return BenchResult(
        workload="digits-mlp",
        description="A small MLP on scikit-learn's digits.",
        command="ampkit bench digits --precision bf16-mixed,16-mixed,16-true,bf16-true --steps 60",
        date="2026-11-22T22:00:00+00:00",
        torch="2.13.0+cpu",
        ampkit="0.1.0",
        device={"type": "cpu", "name": "Test CPU @ 2.0GHz", "threads": 2, "bf16_native": False, "fp16_native": False},
        settings={"steps": STEPS, "warmup": 10, "rounds": 5, "seed": 0, "size": "tiny"},
        workload_info={"parameters": 1_048_576, "input_shape": [64, 64]},
        eval_tolerance="accuracy within 0.02 of 32-true",
        runs=[reference_run(), bf16_mixed_run(), scaled_run(), diverged_run(), failed_run()],
    )


@pytest.fixture
def throughput_result() -> BenchResult:
    """A throughput-only workload (no eval metric), tokens/s, no peak RSS, no MFU, one unsupported policy."""
    ref = reference_run(
        eval_metric_name=None, eval_metric=None, eval_metrics={}, within_tolerance=None,
        peak_rss_bytes=None, memory_breakdown={}, throughput_unit="tokens", throughput=1.2e6,
    )
    fast = bf16_mixed_run(
        eval_metric_name=None, eval_metric=None, eval_metrics={}, within_tolerance=None,
        peak_rss_bytes=None, memory_breakdown={}, throughput_unit="tokens", throughput=1.92e6, mfu=None,
    )
    fast.verdict = "bf16-mixed: 1.60x faster, 14% less memory: pays on this model and device"
    unsupported = RunResult(precision="16-mixed", status="unsupported", error=UNSUPPORTED_ERROR)
    return BenchResult(
        workload="gpt-tiny",
        command="ampkit bench gpt --size tiny",
        device={"type": "cpu", "name": "Test CPU"},
        settings={"steps": STEPS},
        runs=[ref, fast, unsupported],
    )


BlockImport = Callable[[str], None]


@pytest.fixture
def block_import(monkeypatch: pytest.MonkeyPatch) -> BlockImport:
    """Make ``import <name>`` (and its submodules) fail as if the package were not installed.

    Patching ``builtins.__import__`` rather than ``sys.modules`` also catches submodules that an earlier test
    already imported, which ``sys.modules[name] = None`` alone would not.
    """
    blocked: list[str] = []
    real_import = builtins.__import__

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", fake_import)
    return blocked.append
