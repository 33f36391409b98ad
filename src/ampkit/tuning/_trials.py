"""A candidate's trial: the bench run that trains it, and what one wave measured of it (:class:`Trial`).

Each candidate trains as an :class:`ampkit.bench.PolicyRun` (a deep copy of the same initial weights, the same
batches in the same order, its own RNG), exactly as ``ampkit bench`` trains a policy, with the tune's levers
added: ``Engine(compile=..., fused_step=...)``, the model's blocks recomputed on each copy, the batch split into
micro-batches (the global batch unchanged: each batch's rows in order, ``accumulate`` micro-batches a step), and
torch's threads set around its steps. :mod:`ampkit.tuning._wave` times them side by side.

A trial's speed-up is over the **baseline** of the same wave (the user's starting configuration): a ratio of step
times measured in the same rounds, with the bootstrap interval of :func:`ampkit.bench.speedup_interval`. Compile
time is kept apart, then **amortised** over the run length the user states (``run_steps``): a compiled
candidate's step costs its median plus ``compile_s / run_steps``.

    >>> t = Trial(key="a", stage="precision", candidate={}, step_times_s=[0.1] * 6, baseline_times_s=[0.2] * 6, compile_s=10.0)
    >>> round(t.amortised_s(1000), 3), round(t.speedup(1000), 2)
    (0.11, 1.82)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._errors import one_line
from ..bench import PolicyRun, speedup_interval
from ..memory import fp8_layer_plan, planned_policy, recompute, repeated_blocks
from ..policy import Policy, get_policy
from ..workloads import Workload, batch_rows, split_batch, to_device
from ._mfu import eager_twin
from ._space import Candidate

__all__ = ["COMPILE_MODES", "DEFAULT_WAVES", "Trial", "cold_compiles", "WaveSettings", "make_run", "micro_workload", "step_flops", "threads", "trial_policy"]

log = logging.getLogger("ampkit")

COMPILE_MODES: dict[str, Any] = {"model": True, "regional": "regional"}
"""A candidate's ``compile`` -> what ``Engine(compile=...)`` gets."""


@dataclass
class Trial:
    """One candidate's measured steps in one wave, beside the baseline's of the same wave."""

    key: str
    stage: str
    candidate: dict[str, Any]
    role: str = "candidate"
    """``candidate`` (the configuration its stage tried), ``incumbent`` (the best so far, measured again beside the
    candidates that vary it) or ``baseline`` (the starting configuration, in every wave)."""
    status: str = "ok"
    """``ok``; ``failed`` (its error says why); ``cut`` (the budget ended its wave before it had enough timed steps)."""
    error: str | None = None
    step_times_s: list[float] = field(default_factory=list)
    """Its timed steps (an optimizer step each: every micro-batch of the global batch)."""
    baseline_times_s: list[float] = field(default_factory=list)
    """The baseline's timed steps in the same wave and rounds."""
    compile_s: float | None = None
    """Compile time, kept out of the step times (None: nothing compiled)."""
    peak_memory_bytes: int | None = None
    flops_by_format: dict[str, float] = field(default_factory=dict)
    """Useful FLOPs of one optimizer step by format (:mod:`ampkit.tuning._mfu`: the bench's counter, on the eager
    twin); {} where not counted (a device without a known peak)."""
    rounds: int = 0
    """The rounds of the wave its figure rests on (disturbed rounds dropped): each ``chunk`` timed steps."""
    dropped_rounds: int = 0
    """Rounds of its wave dropped because the control moved more than :data:`~ampkit.tuning._machine.ROUND_DRIFT`."""
    disturbed: bool = False
    """Its wave could not replace the rounds it dropped (the deadline, or the control never held still): its
    figures are shown but not judged."""
    resumed: bool = False
    """Read back from an earlier tune's trials (not measured in this one)."""

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.step_times_s) if self.step_times_s else None

    def amortised_s(self, run_steps: int) -> float | None:
        """The median step plus the compile time spread over ``run_steps`` steps."""
        median = self.median_s
        return None if median is None else median + (self.compile_s or 0.0) / run_steps

    def speedup(self, run_steps: int) -> float | None:
        """The baseline's median step over this one's amortised step (same wave)."""
        mine = self.amortised_s(run_steps)
        return statistics.median(self.baseline_times_s) / mine if mine and self.baseline_times_s else None

    def interval(self, run_steps: int, against: Sequence[float] | None = None) -> tuple[float, float] | None:
        """The 95% bootstrap interval of the speed-up over ``against`` (default: the baseline of the same wave), with
        the amortised compile time added to every step; None with too few timed steps."""
        shift = (self.compile_s or 0.0) / run_steps
        reference = self.baseline_times_s if against is None else against
        return speedup_interval(reference, [t + shift for t in self.step_times_s]) if self.step_times_s else None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("resumed")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trial:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names}, resumed=True)


def cold_compiles(trials: Sequence[Trial]) -> dict[str, float]:
    """Each configuration's compile time by its numerics key (threads and the loader change no graph): the longest
    measured among ``trials``, i.e. its first, cold compile. A later trial of the same graph finds inductor's caches
    warm (on disk and in memory) and would understate what a fresh run pays.

    >>> c = Candidate(policy="bf16-mixed", micro_batch=8, accumulate=1, compile="model")
    >>> cold_compiles([Trial(key=c.key, stage="a", candidate=c.to_dict(), compile_s=s) for s in (20.0, 0.5)])
    {'bf16-mixed mb8x1 compile=model': 20.0}
    """
    out: dict[str, float] = {}
    for t in trials:
        if t.compile_s:
            key = Candidate.from_dict(t.candidate).numerics_key
            out[key] = max(out.get(key, 0.0), t.compile_s)
    return out


@dataclass(frozen=True)
class WaveSettings:
    """How long each candidate of a wave trains: ``warmup`` untimed steps, then ``rounds`` rounds of ``chunk``."""

    rounds: int = 4
    chunk: int = 3
    warmup: int = 2
    measure_steps: int = 2
    """Steps of the run measured alone (memory, compile time): at least two, so the optimizer's state exists."""

    @property
    def steps(self) -> int:
        """Steps each candidate trains in a wave, measured alone or not."""
        return self.measure_steps + self.warmup + self.rounds * self.chunk


DEFAULT_WAVES = WaveSettings()
"""Four rounds of three timed steps after two warm-up steps: 12 timed steps, enough for a bootstrap interval."""


def micro_workload(workload: Workload, candidate: Candidate) -> Workload:
    """``workload`` trained in ``candidate``'s micro-batches: each batch cut into consecutive slices of
    ``candidate.micro_batch`` rows, the step accumulating them all, so the step sees the same rows in the same order.

    >>> from ampkit.workloads import Workload
    >>> w = Workload(name="w", model=torch.nn.Linear(2, 2), train_batches=[(torch.zeros(8, 2), torch.zeros(8, dtype=torch.long))],
    ...              items_per_batch=8, steps=4, warmup=1)
    >>> m = micro_workload(w, Candidate(policy="32-true", micro_batch=2, accumulate=4))
    >>> len(m.train_batches), m.items_per_batch, m.accumulate
    (4, 2, 4)
    """
    try:
        rows = batch_rows(workload.train_batches[0])
    except ValueError:
        if candidate.accumulate == workload.accumulate:
            return workload  # a batch that cannot be cut, trained whole (the tune prunes micro-batches for it)
        raise
    if candidate.micro_batch == rows:
        return workload
    if rows % candidate.micro_batch or candidate.micro_batch * candidate.accumulate != rows * workload.accumulate:
        raise ValueError(
            f"a micro-batch of {candidate.micro_batch} x {candidate.accumulate} does not make the global batch of "
            f"{rows} x {workload.accumulate} rows: micro-batches must split each batch evenly."
        )
    uneven = sorted({n for n in (batch_rows(b) for b in workload.train_batches) if n != rows})
    if uneven:
        # Cut alike, a shorter batch would leave a short last micro-batch whose mean loss counts as much as a full
        # one's: the step would no longer be the user's. Not tried, rather than trained differently.
        raise ValueError(
            f"micro-batches need every batch to have {rows} rows, as the first; some have {', '.join(map(str, uneven))} "
            "(drop the last, short batch: DataLoader(..., drop_last=True))."
        )
    parts = rows // candidate.micro_batch
    batches = [split_batch(b, i * candidate.micro_batch, (i + 1) * candidate.micro_batch) for b in workload.train_batches for i in range(parts)]
    return dataclasses.replace(
        workload, train_batches=batches, items_per_batch=workload.items_per_batch // parts, accumulate=candidate.accumulate,
    )


def _recompute_blocks(model: torch.nn.Module) -> None:
    recompute(model, repeated_blocks(model))


def make_run(workload: Workload, candidate: Candidate, device: torch.device, seed: int, steps: int) -> PolicyRun:
    """The bench run that trains ``candidate``: its policy, compile, fused step, recompute, micro-batches and memory
    format, on the first ``steps`` optimizer steps' batches moved to ``device`` once (the bench times steps, not
    copies). channels_last is the bench's own conversion (:attr:`ampkit.workloads.Workload.channels_last`: the copy
    of the model and the 4-D floating inputs)."""
    w = dataclasses.replace(micro_workload(workload, candidate), channels_last=candidate.channels_last)
    needed = min(len(w.train_batches), steps * w.accumulate)
    batches = [to_device(w.train_batches[i], device, w.channels_last) for i in range(needed)]
    options = {"fused_step": candidate.fused_step} if candidate.fused_step is not None else {}
    return PolicyRun(
        w, trial_policy(w, candidate.policy, candidate.keep_fp32), device, batches, seed, compile=COMPILE_MODES.get(candidate.compile or ""),
        mode=candidate.compile, engine_options=options, prepare=_recompute_blocks if candidate.recompute else None,
    )


def step_flops(workload: Workload, c: Candidate, device: torch.device, seed: int) -> dict[str, float]:
    """The useful FLOPs of one optimizer step of ``c``, by format, counted eagerly on a throwaway copy of its eager
    twin (the bench's :meth:`ampkit.bench.PolicyRun.measure_alone`); {} when the counter failed (logged)."""
    try:
        run = make_run(workload, eager_twin(c), device, seed, 2)
        try:
            run.measure_alone(2, True)
        finally:
            run.release()
    except Exception as exc:  # noqa: BLE001 - no count is a "-" in one column, never a failed trial
        log.warning("tune: FLOPs of %s not counted (%s)", c.key, one_line(exc, with_type=True))
        return {}
    return dict(run.result.flops_by_format)


def trial_policy(workload: Workload, name: str, keep_fp32: Sequence[str] = ()) -> Policy:
    """The policy ``name`` as a trial runs it, with ``keep_fp32``'s modules in fp32: an fp8 policy set to the layers
    its roofline plans at the workload's micro-batch rows (:func:`ampkit.memory.fp8_layer_plan`, as ``ampkit bench``
    runs it), any other as it comes."""
    policy = get_policy(name, keep_fp32=keep_fp32)
    if not policy.needs_compile:
        return policy
    try:
        return planned_policy(fp8_layer_plan(workload.model, workload.train_batches[0], name), policy)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - a forward fake tensors cannot run: the policy converts what its filter picks
        log.warning("tune: no fp8 layer plan for %s (%s); it converts the layers its own filter picks", name, one_line(exc, with_type=True))
        return policy


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` (None: unchanged) while the block runs, then put back."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
