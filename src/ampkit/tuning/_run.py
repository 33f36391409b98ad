"""The whole tune of one workload: facts, a cheap pass and a dear pass of interleaved trials, one proven answer.

1. **Probe**: a few steps of the starting configuration (fp32, the user's batch) give the step time every budget
   estimate rests on, and the machine's load over them (:mod:`~ampkit.tuning._machine`: the CPU time other
   processes took). Where torch's threads and the other processes want more cores than there are (their threads
   then stall each other: a 2-core machine's step took 3-16x longer at times), the whole tune measures at the
   threads the others leave free, against the start there, and says so. A ``budget`` too small for the least useful
   answer (the start and one cheap policy measured side by side, and the accuracy guard) is refused here, with that
   minimum in seconds.
2. **Facts** (:mod:`~ampkit.tuning._facts`) and, per stage in :func:`~ampkit.tuning._prune.stage_order`, the stage's
   candidates on top of the best configuration so far, pruned with reasons (:mod:`~ampkit.tuning._prune`).
3. **Cheap first, dear later**: a first pass over the stages tries only candidates that compile nothing (eager
   policies, channels_last, micro-batches, threads, the loader's settings), the precision stage's wave guaranteed
   its time; a second pass then tries, on top of the cheap winner, those that must compile (compile regional or
   whole, the fused master step, bf16-true-sr's step, fp8), each only when its estimated compile fits what is left.
   Each stage is one wave (:mod:`~ampkit.tuning._wave`; a stage's choice: :class:`~ampkit.tuning._tune.Tune`), its
   rounds checked for the control's drift.
4. **Finalists** (:mod:`~ampkit.tuning._finalists`): the leaders measured again side by side until told apart,
   then guarded in speed order; the winner is the fastest that passes, else the start.

Every wave and guard run is stored under ``out`` as it completes (:mod:`~ampkit.tuning._store`), so a tune killed
midway resumes without measuring them again; Ctrl-C ends the tune with what was measured (``interrupted``).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from .._report.dialect import check_framework, gradient_checkpointing_of
from ..workloads import Workload, device_info
from ._budget import Budget, CompileSizes, dear
from ._facts import add_loader_facts, gather_facts, rows_of
from ._finalists import finalists
from ._format import fmt_bytes
from ._loader_stage import loader_stage
from ._machine import CpuMeter, Load
from ._prune import StagePlan, plan_stage, stage_order
from ._result import TuneResult
from ._space import SCHEDULING_STAGES, Candidate, Facts, memory_key
from ._store import TrialStore
from ._trials import DEFAULT_WAVES, Trial, WaveSettings, make_run, threads
from ._tune import Tune

__all__ = ["PROBE_STEPS", "Probe", "tune_workload"]

log = logging.getLogger("ampkit")

PROBE_STEPS = 5
"""Timed steps of the start's probe (after one untimed step)."""


@dataclass(frozen=True)
class Probe:
    """The start's first steps: its median step, its spread (slowest over fastest) and the machine's load meanwhile;
    on a busy CPU also its median step at the threads the other processes leave free."""

    step_s: float
    spread: float
    load: Load
    free_threads: int | None = None
    free_step_s: float | None = None
    member_s: float = 0.0
    """Its memory measured alone and its build: what every member of a wave costs besides its steps."""

    @property
    def oversubscribed(self) -> bool:
        """torch's threads and the other processes want more cores than the machine has: a step's threads then wait
        on each other while one is descheduled (a 2-core machine's 80 ms step took 1.3 s at times, with two
        CPU-bound processes beside it), in bursts a few probed steps can miss.

        >>> Probe(0.2, 11.7, Load(1.1, 2.0, 2), 1, 0.064).oversubscribed, Probe(0.05, 1.1, Load(0.0, 1.0, 2)).oversubscribed
        (True, False)
        """
        return self.free_threads is not None and self.free_step_s is not None


def _timed(workload: Workload, start: Candidate, device: torch.device, seed: int, waves: WaveSettings) -> tuple[list[float], float]:
    """The start's timed steps, and what a wave member's setup costs (its memory measured alone, its build)."""
    run = make_run(workload, start, device, seed, max(PROBE_STEPS + 1, waves.measure_steps))
    with threads(start.threads):
        began = time.perf_counter()
        run.measure_alone(waves.measure_steps, False)
        run.build()
        member_s = time.perf_counter() - began
        run.train(1, False)
        run.train(PROBE_STEPS, True)
    run.release()
    return run.times, member_s


def _probe(workload: Workload, start: Candidate, device: torch.device, seed: int, meter: CpuMeter, waves: WaveSettings) -> Probe:
    """Time the start (its setup as a wave member's, then :data:`PROBE_STEPS` steps after one untimed), reading the
    machine's load meanwhile; on a busy CPU, again at the threads the other processes leave free."""
    meter.mark()
    times, member_s = _timed(workload, start, device, seed, waves)
    load = meter.read()
    probe = Probe(statistics.median(times), max(times) / min(times), load, member_s=member_s)
    if load.busy and load.others_cores is not None and device.type == "cpu" and start.threads is None:
        free = max(1, int(load.cores - load.others_cores))
        if free < torch.get_num_threads():
            at_free, member_s = _timed(workload, dataclasses.replace(start, threads=free), device, seed, waves)
            probe = dataclasses.replace(probe, free_threads=free, free_step_s=statistics.median(at_free), member_s=member_s)
    return probe


def _held(workload: Workload, batches: int) -> Workload:
    """``workload`` with the batches a tune reads held in a list: a workload whose batches are made when read
    (digits-aug augments and collates each, 2.5 s for a trial's 20) would make them again for every member of every
    wave and every guard run, time no estimate counts. The same batches: making them is deterministic."""
    if isinstance(workload.train_batches, list):
        return workload
    return dataclasses.replace(workload, train_batches=[workload.train_batches[i] for i in range(min(batches, len(workload.train_batches)))])


def _fingerprint(workload: Workload, device: torch.device, seed: int, waves: WaveSettings, guard_steps: int) -> dict[str, Any]:
    return {
        "workload": workload.name, "description": workload.description, "items_per_batch": workload.items_per_batch,
        "accumulate": workload.accumulate, "rows": rows_of(workload.train_batches[0])[0], "device": str(device), "seed": seed,
        "waves": dataclasses.asdict(waves), "guard_steps": guard_steps, "torch": torch.__version__, "ampkit": __version__,
    }


def _fit_error(workload: Workload, facts: Facts, start: Candidate) -> str:
    """Why nothing fits, with the predicted memory of one sample under the leanest policy."""
    from ._facts import predict_peak

    leanest = min(
        (k for k in facts.predicted_peak if k.endswith(("|1|0", "|1|1"))), key=lambda k: facts.predicted_peak[k], default=None,
    )
    policy = leanest.split("|")[0] if leanest else start.policy
    e = predict_peak(workload, policy, 1, torch.device(facts.device))
    parts = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(getattr(e, k))}" for k in ("parameters", "gradients", "optimizer_state", "master_weights", "activations"))
    return (f"{workload.name} does not fit even at one sample per micro-batch under any policy: {policy} needs a predicted peak of "
            f"{fmt_bytes(e.peak)} ({parts}) of the {fmt_bytes(facts.memory_budget or 0)} available; use a smaller model, a device "
            "with more memory, or shard it over several GPUs (Engine(strategy='fsdp')).")



def tune_workload(
    workload: Workload,
    device: torch.device | str = "cpu",
    *,
    budget: float = 300.0,
    run_steps: int = 1000,
    out: Path | str | None = None,
    seed: int = 0,
    waves: WaveSettings = DEFAULT_WAVES,
    guard_steps: int | None = None,
    memory_budget: int | None = None,
    loader: torch.utils.data.DataLoader[Any] | None = None,
    stages: Sequence[str] | None = None,
    precisions: Sequence[str] | None = None,
    command: str = "",
    progress: Callable[[str, float, float], None] = lambda what, elapsed, left: None,
    clock: Callable[[], float] = time.monotonic,
) -> TuneResult:
    """Find the fastest configuration of ``workload`` on ``device`` that keeps fp32's accuracy, within ``budget``
    seconds of wall clock (see the module's docstring for how).

    ``run_steps``: the steps the real run will train, over which compile time is amortised. ``out``: where trials
    are kept as they complete (a later call with the same ``out`` resumes). ``waves``: each trial's length.
    ``guard_steps``: steps of each accuracy-guard run (default: the workload's steps, at least 30).
    ``memory_budget``: bytes a step may use (default: what the device has free). ``loader``: the DataLoader the
    user trains from, whose settings are then tuned too. ``stages``: only these stages (default: all, in
    :func:`~ampkit.tuning._prune.stage_order`; ``fit`` runs whenever the user's batch does not fit); ``precisions``: the policies it may choose from (default: every
    policy the device runs fast). ``progress(what, elapsed_s, left_s)`` is told what runs.
    Raises ValueError when ``budget`` is too small for one trial (naming the minimum) or nothing fits.
    """
    device = torch.device(device)
    if isinstance(run_steps, bool) or not isinstance(run_steps, int) or run_steps < 1:
        raise ValueError(f"run_steps={run_steps!r}: the steps your real run trains must be an int >= 1 (compile time is amortised over them).")
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget={budget!r}: give the tune's wall-clock budget in seconds, a positive number.")
    guard_steps = guard_steps if guard_steps is not None else max(workload.steps, 30)
    workload = _held(workload, max(guard_steps, waves.steps, PROBE_STEPS + 1) * workload.accumulate)
    rows, _ = rows_of(workload.train_batches[0])
    # The start is the workload as given: fp32, its batch, its memory format (the bench's conv workloads come channels_last).
    start = Candidate(policy="32-true", micro_batch=rows, accumulate=workload.accumulate, channels_last=workload.channels_last)
    store = TrialStore(Path(out) if out is not None else None, _fingerprint(workload, device, seed, waves, guard_steps))
    clock_budget = Budget(float(budget), clock, device.type)
    result = TuneResult(
        workload=workload.name, description=workload.description, device=device_info(device), unit=workload.unit,
        items_per_step=workload.items_per_batch * workload.accumulate, run_steps=run_steps, budget_s=float(budget),
        start=start, baseline=start, winner=start, command=command,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), torch=torch.__version__, ampkit=__version__,
        settings={"seed": seed, **dataclasses.asdict(waves), "guard_steps": guard_steps, "wave_steps": waves.steps,
                  "clip_grad_norm": workload.clip_grad_norm},
        # Where the model came from: the winner is printed in that framework's terms (refused here, before any trial, if unknown).
        framework=check_framework(workload.extra.get("framework")),
        supports_gradient_checkpointing=gradient_checkpointing_of(workload.extra),
    )
    tune = Tune(workload, device, result, store, clock_budget, waves, seed, run_steps, guard_steps, loader, progress, CpuMeter(clock))
    tune.arithmetic_levers = stages is None or any(s not in SCHEDULING_STAGES for s in stages)
    # The tune reseeds the global RNG for its runs; the caller's state is theirs and comes back untouched.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            _search(tune, workload, device, memory_budget, stages, precisions)
        except KeyboardInterrupt:
            result.interrupted = True
            result.notes.append("interrupted (Ctrl-C): the table holds what was measured until then")
            result.winner = start
            result.winner_reason = "interrupted before the finalists were judged: keep the start"
    result.elapsed_s = clock_budget.elapsed
    return result


def _search(
    tune: Tune, workload: Workload, device: torch.device, memory_budget: int | None, stages: Sequence[str] | None, precisions: Sequence[str] | None,
) -> None:
    result, budget = tune.result, tune.budget
    start = result.start
    mark = [budget.elapsed]

    def took(part: str) -> None:  # where the budget went, part by part (the report's last line)
        now = budget.elapsed
        result.timings[part] = round(result.timings.get(part, 0.0) + now - mark[0], 3)
        mark[0] = now

    probe: Probe | None = None
    baseline = start
    budget.sizes = CompileSizes.of(workload.model)
    if device.type == "cpu":
        # The user's batch fits in RAM as given: the start is timed first, so a budget too small is refused before the
        # memory predictions (5-30 s) are spent. On a GPU its memory is predicted first: it may not fit.
        baseline, probe = _measure_start(tune, start)
        _refuse_too_small(tune, workload, baseline, probe)
        took("probe")
    tune.progress("predicting memory and reading the model")
    notes: list[str] = []
    facts = gather_facts(workload, device, memory_budget=memory_budget, precisions=precisions, notes=notes)
    took("facts")
    start_fits = facts.memory_budget is None or facts.predicted_peak.get(memory_key(start.policy, start.micro_batch, False), 0) <= facts.memory_budget
    if not start_fits:
        fit = plan_stage("fit", start, facts)
        if not fit.kept:
            raise ValueError(_fit_error(workload, facts, start))
        baseline = dataclasses.replace(fit.kept[0], threads=baseline.threads)
        result.notes.append(f"the user's batch of {start.micro_batch} rows does not fit ({fmt_bytes(facts.memory_budget)} free): "
                            f"speed-ups are against {baseline.describe(start)}, the largest micro-batch that fits")
    if probe is None or not start_fits:
        baseline, probe = _measure_start(tune, baseline)
        took("probe")
    if tune.loader is not None:  # the loader's share of the step decides whether its stage runs first
        add_loader_facts(facts, tune.loader, budget.step_s, device)
        took("facts")
    order = [s for s in stage_order(facts, start_fits) if stages is None or s in stages or s == "fit"]
    tune.arithmetic_levers = any(s not in SCHEDULING_STAGES for s in order)  # "fit" joins whatever was asked
    _refuse_too_small(tune, workload, baseline, probe)  # again, with the facts' time spent
    result.notes += notes
    result.facts = _facts_summary(facts)
    result.baseline = incumbent = baseline
    # What a compile's cost is weighed against (compile_cannot_pay, and the order of trials): the estimate, the run.
    facts.compile_s, facts.run_steps, facts.step_s = budget.compile_s, tune.run_steps, budget.step_s
    # Pass 1, cheap: nothing compiles. The precision wave (the least useful answer) keeps its time until it runs.
    tune.held_s = 2 * budget.trial_s(baseline, tune.waves.steps) if "precision" in order else 0.0
    cheap_ran: set[str] = set()
    for stage in order:
        facts.step_s = _step_of(result.trials, incumbent) or facts.step_s
        if stage == "precision":
            tune.held_s = 0.0
        if stage == "fit":
            incumbent = tune.stage(plan_stage("fit", start, facts), baseline, baseline)
        elif stage == "loader":
            plan = plan_stage(stage, incumbent, facts)
            incumbent = loader_stage(tune, plan, incumbent) if plan.kept else tune.stage(plan, incumbent, baseline)
        else:
            full = plan_stage(stage, incumbent, facts)
            plan = _part(full, cheap=True)
            # A stage whose candidates all compile (kept or pruned) waits for the second pass; one with none says why now.
            if plan.kept or plan.pruned or not (full.kept or full.pruned):
                cheap_ran.add(stage)
                incumbent = tune.stage(plan if plan.kept or plan.pruned else full, incumbent, baseline)
        took(stage)
    tune.held_s = 0.0
    # Pass 2, dear: what must compile, on top of the cheap winner, each while its estimate fits what is left.
    for stage in order:
        if stage in ("fit", "loader"):
            continue
        facts.step_s = _step_of(result.trials, incumbent) or facts.step_s
        plan = _part(plan_stage(stage, incumbent, facts), cheap=False)
        if plan.kept or plan.pruned:
            label = f"{stage} (compiled)" if stage in cheap_ran else stage
            incumbent = tune.stage(plan, incumbent, baseline, label)
            took(label)
    result.winner = finalists(tune, baseline, incumbent)
    took("finalists")


def _measure_start(tune: Tune, start: Candidate) -> tuple[Candidate, Probe]:
    """Probe ``start`` and the machine (:func:`_probe`); the configuration the tune measures against: ``start``, or
    on an oversubscribed CPU ``start`` at the free threads (the note says why)."""
    budget, result = tune.budget, tune.result
    tune.progress("timing the starting configuration (and how busy the machine is)")
    probe = _probe(tune.workload, start, tune.device, tune.seed, tune.meter, tune.waves)
    budget.member_s, budget.step_s, tune.load = probe.member_s, probe.step_s, probe.load
    result.machine = _machine_summary(probe)
    if probe.oversubscribed and probe.free_threads is not None and probe.free_step_s is not None:
        # torch's threads stall against the other processes: every trial measured so would show the contention, not
        # the levers. The tune measures at the free threads, against the start there; the threads stage then times
        # the thread count as given against it.
        budget.step_s = probe.free_step_s
        if not any(n.startswith("the machine is busy") for n in result.notes):
            result.notes.append(
                f"the machine is busy ({probe.load.describe()} while the start was timed): torch's {torch.get_num_threads()} threads would "
                f"contend with them (the start's step {probe.step_s * 1e3:.0f} ms, spread {probe.spread:.1f}x; {probe.free_step_s * 1e3:.0f} ms "
                f"at {probe.free_threads} thread{'s' if probe.free_threads > 1 else ''}), so the tune measures at {probe.free_threads} and "
                f"speed-ups are against the start at {probe.free_threads}; its figures hold for a machine as busy: tune again when it is quiet"
            )
        return dataclasses.replace(start, threads=probe.free_threads), probe
    if probe.load.busy and not any(n.startswith("the machine was busy") for n in result.notes):
        result.notes.append(f"the machine was busy when the tune began ({probe.load.describe()}; the start's steps spread "
                            f"{probe.spread:.1f}x): every wave's rounds are checked for drift, and its figures hold for a machine as busy")
    return start, probe


def _refuse_too_small(tune: Tune, workload: Workload, baseline: Candidate, probe: Probe) -> None:
    """Raise the refusal, naming the minimum in seconds, when the budget cannot hold the least useful answer."""
    budget = tune.budget
    minimum = budget.elapsed + _least_useful(tune, baseline)
    if minimum > budget.seconds:
        enough = math.ceil(minimum * 1.2)
        busy = f"; {probe.load.describe()} while it was timed" if probe.load.busy else ""
        raise ValueError(
            f"--budget {budget.seconds:g} s is too small for the least useful answer for {workload.name} here: the start and one "
            f"policy measured side by side and the accuracy guard take about {math.ceil(minimum)} s (a step takes "
            f"{budget.step_s * 1e3:.1f} ms{busy}); pass --budget {enough} (budget={enough} in Python) or more."
        )


def _part(plan: StagePlan, *, cheap: bool) -> StagePlan:
    """The cheap (nothing compiles) or the dear part of ``plan``, pruned candidates included."""
    kept = [c for c in plan.kept if dear(c) != cheap]
    pruned = [(c, why) for c, why in plan.pruned if dear(c) != cheap]
    reason = plan.reason if not kept else None
    if not kept and plan.kept:
        reason = "its candidates " + ("all compile: tried after every cheap candidate" if cheap else "compile nothing: tried in the first pass")
    return StagePlan(plan.stage, kept, pruned, reason)


def _least_useful(tune: Tune, baseline: Candidate) -> float:
    """Seconds the least useful answer takes from here: the precision wave with the start and its most promising
    cheap policy, the accuracy guard's reference and one candidate's guard."""
    return 2 * tune.budget.trial_s(baseline, tune.waves.steps) + tune.guard_reserve(baseline, confirmation=False)


def _machine_summary(probe: Probe) -> dict[str, Any]:
    return {"cores": probe.load.cores, "others_cores_at_probe": probe.load.others_cores, "busy_at_probe": probe.load.busy,
            "probe_step_s": probe.step_s, "probe_spread": probe.spread, "free_threads": probe.free_threads,
            "probe_free_step_s": probe.free_step_s, "oversubscribed": probe.oversubscribed, "member_s": probe.member_s}


def _step_of(trials: Sequence[Trial], c: Candidate) -> float | None:
    """``c``'s median step in the latest wave that measured it (None: not measured yet)."""
    return next((t.median_s for t in reversed(trials) if t.key == c.key and t.status == "ok" and t.median_s), None)


def _facts_summary(facts: Facts) -> dict[str, Any]:
    return {
        "memory_budget": facts.memory_budget, "predicted_peak": dict(facts.predicted_peak), "fp8_layers": {k: list(v) for k, v in facts.fp8_layers.items()},
        "fp16_overflow": list(facts.fp16_overflow), "data_share": facts.data_share, "blocks": facts.blocks, "convs": facts.convs, "cores": facts.cores,
        "threads": facts.threads, "compiler": facts.compiler,
    }

