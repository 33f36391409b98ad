"""The figures one ``ampkit bench`` produces, and results.json, the file that keeps them.

results.json (``BenchResult.to_dict()``) holds:

- ``schema``: the format version (1); ``workload``, ``description``, ``command``, ``date`` (UTC, ISO 8601),
  ``torch``, ``ampkit``, ``device`` (``type``, ``name``, and for CPUs the bf16/fp16 instruction support),
  ``settings`` (steps, warm-up, seed, size, interleaving chunk, ``nproc``: the processes that trained each run,
  1 without torchrun, and ``strategy``: ``"ddp"`` under torchrun, else None; the recipe: ``batch_size`` (rows
  of a micro-batch), ``accumulate`` (micro-batches per optimizer step), ``step_items`` (samples or tokens of
  one step), ``clip_grad_norm`` (None: off), ``tolerance`` (None: the metric's own), ``compile`` (None, or what
  ``Engine(compile=...)`` was given), ``channels_last`` (the model and its 4-D inputs in NHWC)), ``workload_info``
  (parameter count, shapes; ``framework``: ``"lightning"`` or ``"transformers"`` for a model from one, whose
  closing advice is printed in its terms).
- ``reference``: the policy speed-ups and memory savings are measured against (``32-true``).
- ``runs``: one object per policy (and with ``compile``, one more per policy: its compiled twin, ``compile`` set),
  the fields of :class:`RunResult`. Times are seconds, memory is bytes,
  ``throughput`` counts ``throughput_unit`` per second. Figures a run could not produce are ``null``.
- Under DDP (``nproc`` > 1) each rank trains a slice of every batch: ``losses`` are the mean over ranks, a
  step's time is the slowest rank's (throughput counts the whole global batch), memory figures are *per process*
  (the largest any rank reached: what each device must hold), ``flops_per_step`` and ``achieved_flops`` count
  every rank, and the eval metric is rank 0's, on the whole eval set.

    >>> r = RunResult(precision="bf16-mixed", status="ok", step_time_median_s=0.01)
    >>> b = BenchResult(workload="gpt", runs=[r])
    >>> BenchResult.from_dict(b.to_dict()).runs[0].step_time_median_s
    0.01
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA_VERSION", "STATUSES", "BenchResult", "RunResult"]

SCHEMA_VERSION = 1

STATUSES = ("ok", "diverged", "failed", "unsupported")
"""``ok``: trained with finite loss; ``diverged``: the loss became inf/NaN; ``failed``: an exception ended the run
(``error`` says which); ``unsupported``: the device cannot run the policy (not attempted)."""


@dataclass(kw_only=True)
class RunResult:
    """One policy's figures. Every field is documented because results.json is read by people and scripts."""

    precision: str
    """Canonical policy name, e.g. ``bf16-mixed``."""
    compile: str | None = None
    """None for the eager run; ``"model"`` when ``Engine(compile=...)`` compiled the whole model, ``"regional"``
    each repeated block (``--compile``). Tables name the run by :attr:`label`."""
    compile_time_s: float | None = None
    """A compiled run's compilation: the time of its first steps (where torch.compile traces and generates code)
    less as many steady steps at the median step time, plus the same excess of any :attr:`compiling_steps`. Not part of
    ``step_time_median_s``. None when nothing compiled."""
    status: str = "ok"
    """One of :data:`STATUSES`."""
    error: str | None = None
    """Why the run failed or was not attempted; None when ``status`` is ok or diverged."""
    step_time_median_s: float | None = None
    """Median wall time of one optimizer step (forward, backward, step), warm-up excluded."""
    step_time_p10_s: float | None = None
    """10th percentile of the step times: with p90, the spread."""
    step_time_p90_s: float | None = None
    """90th percentile of the step times."""
    timed_steps: int = 0
    """How many step times the median is taken over."""
    compiling_steps: int = 0
    """Steps after the warm-up during which torch.compile compiled (an optimizer that compiles its step at its
    second call, a recompile): left out of the step times, their time beyond the median added to
    ``compile_time_s``; when every timed step compiled, they stay in and the row's note says so."""
    step_times_s: list[float] = field(default_factory=list)
    """Every timed step's wall time, in order (warm-up excluded): the sample the median and its spread come from."""
    throughput: float | None = None
    """``throughput_unit`` per second at the median step time; a step is one optimizer update, over
    ``settings["accumulate"]`` micro-batches when gradients are accumulated, all of whose items count."""
    throughput_unit: str = "samples"
    """``samples`` or ``tokens``."""
    speedup_vs_fp32: float | None = None
    """Reference median step time / this median step time: above 1 means faster than 32-true."""
    speedup_vs_eager: float | None = None
    """A compiled run's speed-up over its eager twin (same policy): eager median step time / compiled median."""
    speedup_low: float | None = None
    """Lower end of the speed-up's 95% bootstrap interval (:mod:`ampkit.bench._speedup`); None with too few steps."""
    speedup_high: float | None = None
    """Upper end of that interval. A speed-up whose interval holds 1.0 is within the noise: "inconclusive"."""
    peak_memory_bytes: int | None = None
    """The most bytes of live tensors from the policy's setup through its first steps, measured alone, with the
    micro-batch in use (weights, gradients, optimizer state, masters, saved activations, temporaries). CPU: each
    storage counted exactly (:class:`ampkit.memory._accounting.StepPeak`, what ``ampkit memory`` calls peak).
    CUDA: ``torch.cuda.max_memory_allocated`` over the same span, less what was allocated before it. None for a
    compiled run on the CPU, whose tensors inside compiled code no counter sees."""
    memory_breakdown: dict[str, int] = field(default_factory=dict)
    """Exact bytes of ``parameters``, ``gradients``, ``optimizer_state``, ``master_weights`` and ``activations``.
    Their sum need not be the peak: gradients grow in backward while activations are freed."""
    activation_bytes: int | None = None
    """The most bytes the autograd graph holds saved for backward at once: one micro-batch's forward, however many
    micro-batches a step accumulates (parameters themselves excluded)."""
    peak_rss_bytes: int | None = None
    """Process peak resident set size while this policy's run was measured alone (CPU; Linux VmHWM)."""
    memory_saved_vs_fp32: float | None = None
    """1 - peak_memory_bytes / reference peak_memory_bytes: 0.3 means 30% less memory than 32-true."""
    final_loss: float | None = None
    """Mean training loss over the last 10% of steps (at least one)."""
    losses: list[float | None] = field(default_factory=list)
    """Training loss of every step, in order (the loss curve); a non-finite loss reads back from JSON as None."""
    eval_metric_name: str | None = None
    """Name of the headline eval metric (``accuracy``, ``mIoU``, ``perplexity``); None for throughput-only workloads."""
    eval_metric: float | None = None
    """Its value after training."""
    eval_metrics: dict[str, float] = field(default_factory=dict)
    """Every eval figure the workload computes (e.g. pixel accuracy and mIoU; eval loss and perplexity)."""
    eval_batch_metrics: list[float | None] = field(default_factory=list)
    """The headline eval metric of each eval batch scored alone, in order: the reference's measure its eval noise
    (:mod:`ampkit.bench._quality`). Empty without an eval metric, or when scoring a batch alone failed."""
    quality: str | None = None
    """The eval metric against the reference's, one-sided, by tolerance and noise: ``as good``, ``better``,
    ``unclear`` or ``worse`` (:data:`ampkit.bench._quality.QUALITY` defines each); None when not measured."""
    within_tolerance: bool | None = None
    """False when ``eval_metric`` is worse than the reference's beyond the tolerance, the eval noise and the run's
    spread (``quality`` "worse"); True when it is not (``as good`` or ``better``); None without a metric or when
    the gap is ``unclear``."""
    skipped_steps: int = 0
    """Optimizer steps skipped because gradients overflowed (loss-scaled policies)."""
    final_loss_scale: float | None = None
    """The loss scale at the end; None for policies that do not scale the loss."""
    flops_per_step: float | None = None
    """Useful floating-point operations of one training step (all its micro-batches), by torch's FlopCounterMode
    formulas (matmuls, convolutions, attention): forward and backward, a forward recomputed in backward left out."""
    flops_by_format: dict[str, float] = field(default_factory=dict)
    """``flops_per_step`` by the format the ops multiplied in: ``fp8``, ``16-bit``, ``tf32``, ``fp32``, ``other``
    (:mod:`ampkit.bench._flops`)."""
    recomputed_flops: float | None = None
    """FLOPs of forwards run again during backward (activation checkpointing), not counted in ``flops_per_step``."""
    achieved_flops: float | None = None
    """flops_per_step / median step time (FLOP/s)."""
    mfu: float | None = None
    """Model FLOPs utilisation (GPU only): the time ``flops_by_format`` would take at the GPU's dense peak for each
    format, over the median step time; for one format, achieved_flops over that format's peak. Under DDP, over
    the peaks of all ``nproc`` devices. None on a CPU, or when ``mfu_note`` says why."""
    mfu_note: str | None = None
    """Why a GPU run has no ``mfu``: no peak known for the GPU or for a format, or a figure above 100% (a wrong peak
    or a wrong count), which is never reported as measured."""
    verdict: str | None = None
    """One line: faster or slower, memory saved, the eval metric against the reference's, then :attr:`outcome`."""
    outcome: str | None = None
    """The verdict's word: ``pays``, ``trades speed for memory``, ``inconclusive``, ``does not pay`` or ``quality
    not measured`` (:data:`ampkit.bench._verdict.VERDICTS` defines each); None for the reference and failed runs."""

    @property
    def label(self) -> str:
        """The run's name in tables and verdicts: the policy, then ``compiled`` for a compiled twin.

        >>> RunResult(precision="bf16-mixed").label, RunResult(precision="bf16-mixed", compile="regional").label
        ('bf16-mixed', 'bf16-mixed compiled (regional)')
        """
        if self.compile is None:
            return self.precision
        return f"{self.precision} compiled" + (" (regional)" if self.compile == "regional" else "")

    @property
    def ok(self) -> bool:
        """True when the run produced figures (``ok`` or ``diverged``)."""
        return self.status in ("ok", "diverged")


@dataclass(kw_only=True)
class BenchResult:
    """A whole bench: what ran, where, and one :class:`RunResult` per policy."""

    workload: str
    description: str = ""
    command: str = ""
    date: str = ""
    torch: str = ""
    ampkit: str = ""
    device: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    workload_info: dict[str, Any] = field(default_factory=dict)
    reference: str = "32-true"
    eval_tolerance: str | None = None
    """The tolerance in words, e.g. ``"within 0.02 of 32-true"``."""
    eval_noise: str | None = None
    """The reference's eval noise in words (or why it was not measured), and whether the comparison is noisy."""
    recovery: str | None = None
    """Which policies that store the weights in 16 bits recover 32-true's eval metric, and the leanest that does."""
    eval_samples: int | None = None
    """Samples (rows of the eval batches) the eval metric was computed on; None when not counted."""
    fp8_layers: dict[str, Any] = field(default_factory=dict)
    """Per fp8 policy run, its layer plan (``Fp8Plan.to_dict()``): which Linear layers ran in fp8 and why."""
    runs: list[RunResult] = field(default_factory=list)

    def run(self, precision: str, compile: str | None = None) -> RunResult | None:
        """The run of ``precision`` (eager, or compiled as ``compile`` says: ``"model"``, ``"regional"``), or None."""
        return next((r for r in self.runs if r.precision == precision and r.compile == compile), None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; non-finite floats become None (JSON has no NaN)."""
        data = dataclasses.asdict(self)
        data["schema"] = SCHEMA_VERSION
        return _finite(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        """Rebuild from ``to_dict()`` output (unknown keys are ignored, so newer files still load)."""
        known = {f.name for f in dataclasses.fields(cls)}
        run_fields = {f.name for f in dataclasses.fields(RunResult)}
        kwargs = {k: v for k, v in data.items() if k in known and k != "runs"}
        runs = [RunResult(**{k: v for k, v in r.items() if k in run_fields}) for r in data.get("runs", [])]
        return cls(**kwargs, runs=runs)

    def write_json(self, path: str | Path) -> Path:
        """Write results.json atomically (a crash leaves any previous file whole)."""
        from ..fileio._checkpoint_files import write_text_atomic

        return write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read_json(cls, path: str | Path) -> BenchResult:
        """Load a results.json written by :meth:`write_json`."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
