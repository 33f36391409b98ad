"""A finished bench as TensorBoard logs: each policy is a TensorBoard "run", so its loss curves overlay.

``log_dir/<precision>/`` gets, per policy:

- ``train/loss``: the training loss at every step (1-based, as in the plots); non-finite steps are left out,
  so a diverged curve simply stops;
- ``bench/step_time_ms``, ``bench/throughput``, ``bench/peak_memory_mib``, ``bench/speedup_vs_fp32`` (plus
  ``bench/memory_saved_vs_fp32``, ``bench/skipped_steps``, ``bench/final_loss_scale`` where measured), logged
  once at the last step;
- ``eval/<metric>``: the headline eval metric and every other eval figure;
- ``bench/verdict``: the verdict line as text (for a failed run, its status and error).

    >>> import tempfile
    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> result = BenchResult(workload="toy", runs=[RunResult(precision="32-true", losses=[2.0, 1.5])])
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     sorted(p.name for p in log_tensorboard(result, tmp).iterdir())
    ['32-true']
"""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import AmpkitError
from ._results import BenchResult, RunResult
from ._table import verdict_lines

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ["log_tensorboard", "run_dir_name"]

log = logging.getLogger("ampkit")

INSTALL_HINT = 'pip install "ampkit[bench]"'


def run_dir_name(precision: str) -> str:
    """The sub-directory of one policy: its name, with anything a file system might object to replaced.

    >>> run_dir_name("bf16-mixed"), run_dir_name("my/policy")
    ('bf16-mixed', 'my_policy')
    """
    return re.sub(r"[^A-Za-z0-9._+-]", "_", precision) or "_"


def _writer_class() -> type[SummaryWriter]:
    try:  # torch.utils.tensorboard itself raises ImportError when the tensorboard package is missing
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise AmpkitError(f"TensorBoard logs need the tensorboard package, which is not installed: {INSTALL_HINT}") from exc
    return SummaryWriter


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _summary(run: RunResult) -> dict[str, float | None]:
    """The one-value figures of a run, under their TensorBoard tags (missing ones are None, and not logged)."""
    mib = None if run.peak_memory_bytes is None else run.peak_memory_bytes / 2**20
    ms = None if run.step_time_median_s is None else run.step_time_median_s * 1e3
    figures: dict[str, float | None] = {
        "bench/step_time_ms": ms,
        "bench/throughput": run.throughput,
        "bench/peak_memory_mib": mib,
        "bench/speedup_vs_fp32": run.speedup_vs_fp32,
        "bench/memory_saved_vs_fp32": run.memory_saved_vs_fp32,
        "bench/skipped_steps": float(run.skipped_steps) if run.ok else None,
        "bench/final_loss_scale": run.final_loss_scale,
    }
    for name, value in run.eval_metrics.items():
        figures[f"eval/{name}"] = value
    if run.eval_metric_name:
        figures[f"eval/{run.eval_metric_name}"] = run.eval_metric  # the headline wins over a duplicate entry
    return figures


def _log_run(writer: SummaryWriter, run: RunResult, verdict: str) -> int:
    """Write one run's scalars and verdict; return how many values were left out for not being finite."""
    dropped = 0
    for step, loss in enumerate(run.losses, start=1):
        if _finite(loss):
            writer.add_scalar("train/loss", loss, global_step=step)
        else:
            dropped += 1
    last = max(len(run.losses), 1)  # summaries sit at the end of training, next to the last loss
    for tag, value in _summary(run).items():
        if _finite(value):
            writer.add_scalar(tag, value, global_step=last)
        elif value is not None:
            dropped += 1
    writer.add_text("bench/verdict", verdict, global_step=last)
    return dropped


def log_tensorboard(result: BenchResult, log_dir: str | os.PathLike[str]) -> Path:
    """Write one TensorBoard run per policy under ``log_dir`` and return ``log_dir``.

    Open with ``tensorboard --logdir <log_dir>``. Writing into a directory that already holds a bench adds new
    event files beside the old ones, and TensorBoard then shows both: give each bench its own directory.
    """
    writer_class = _writer_class()
    root = Path(log_dir)
    root.mkdir(parents=True, exist_ok=True)
    for run, verdict in zip(result.runs, verdict_lines(result)):
        writer = writer_class(log_dir=str(root / run_dir_name(run.label)))
        try:
            dropped = _log_run(writer, run, verdict)
        finally:
            writer.close()  # flushes; an unclosed writer loses its last events and leaks a thread
        if dropped:
            log.debug("tensorboard: %s: %d non-finite values not logged", run.label, dropped)
    log.info("wrote TensorBoard logs to %s", root)
    return root
