"""The closing lines of ``ampkit bench``: for the fastest run whose verdict is that it pays, the change to paste, in
the terms of the framework the model came from (results.json's ``workload_info["framework"]``); nothing when no run
pays.

The change is the policy (and its compile, for a compiled twin) with the recipe every run shared: the accumulation,
the clipping and the memory format (results.json's ``settings``), on the device the bench ran on.

    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> runs = [RunResult(precision="32-true"), RunResult(precision="bf16-mixed", outcome="pays", speedup_vs_fp32=1.9),
    ...         RunResult(precision="16-mixed", outcome="does not pay", speedup_vs_fp32=2.0)]
    >>> result = BenchResult(workload="w", runs=runs, device={"type": "cpu"}, settings={"clip_grad_norm": 1.0},
    ...                      workload_info={"framework": "lightning"})
    >>> for line in closing_lines(result): print(line)
    bf16-mixed pays (1.90x faster): to train with it, paste into your Lightning script:
    import lightning as L
    <BLANKLINE>
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", gradient_clip_val=1.0)
    trainer.fit(model)
"""

from __future__ import annotations

from .._report.dialect import AS_GIVEN, FRAMEWORKS, Advice, check_framework, paste_code
from ._results import BenchResult, RunResult
from ._verdict import PAYS_SPEEDUP

__all__ = ["advice", "closing_lines", "paying_run"]


def paying_run(result: BenchResult) -> RunResult | None:
    """The run whose verdict is ``pays`` with the largest speed-up over fp32 (then the most memory saved); None when
    no run pays."""
    paying = [r for r in result.runs if r.outcome == "pays"]
    return max(paying, key=lambda r: (r.speedup_vs_fp32 or 0.0, r.memory_saved_vs_fp32 or 0.0), default=None)


def advice(result: BenchResult, run: RunResult) -> Advice:
    """``run``'s policy and compile, with the recipe of ``result`` (every run's), as the configuration to recommend."""
    settings = result.settings
    accumulate = int(settings.get("accumulate") or 1)
    return Advice(
        precision=run.precision, compile=run.compile, accumulate=accumulate, given_accumulate=accumulate,
        clip_grad_norm=settings.get("clip_grad_norm", AS_GIVEN), channels_last=bool(settings.get("channels_last")),
        device=result.device.get("type"),
    )


def closing_lines(result: BenchResult) -> list[str]:
    """The line that names the paying run, then the lines to paste (:func:`ampkit._report.dialect.paste_code`); empty
    when no run pays."""
    run = paying_run(result)
    if run is None:
        return []
    framework = check_framework(result.workload_info.get("framework"))
    speed = run.speedup_vs_fp32
    # Paid by speed, else by memory (the verdict's rule 3): the verdict above has the intervals.
    gain = f"{speed:.2f}x faster" if speed is not None and speed >= PAYS_SPEEDUP else f"{run.memory_saved_vs_fp32 or 0.0:.0%} less memory"
    where = f"your {FRAMEWORKS[framework]} script" if framework is not None else "your training script"
    return [f"{run.label} pays ({gain}): to train with it, paste into {where}:", *paste_code(advice(result, run), framework).splitlines()]
