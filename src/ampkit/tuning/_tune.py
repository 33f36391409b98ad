"""One tune's state as it goes: the budget, the guard, and each stage's wave; :func:`ampkit.tuning._run.tune_workload`
drives it through its passes.

A stage's wave holds the baseline, the incumbent (the best so far) and the stage's candidates on top of it. A
candidate replaces the incumbent only when its speed-up over it (compile time amortised over ``run_steps``) has its
whole 95% interval above 1.0 in an undisturbed wave; a new precision only once the accuracy guard passed it. Every
wave and guard run is stored as it completes (:mod:`~ampkit.tuning._store`), so a killed tune resumes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..bench import speedup_interval
from ..workloads import Workload
from ._budget import RECOMPILE_SHARE, Budget
from ._guard import GuardResult, Reference, judge, reference
from ._machine import CpuMeter, Load
from ._mfu import counts_flops
from ._prune import StagePlan
from ._result import TuneResult
from ._space import Candidate
from ._store import TrialStore
from ._trials import Trial, WaveSettings
from ._wave import WaveInterrupted, measure_wave

__all__ = ["FINALISTS", "Tune", "still_open"]

log = logging.getLogger("ampkit")

FINALISTS = 3
"""At most this many of the fastest configurations are measured again side by side and go through the guard."""
STAGE_ROUNDS_FACTOR = 2
"""A stage's wave runs at most this many times its rounds (replacing disturbed ones, or telling its leader apart)."""


def still_open(times: dict[Candidate, list[float]], control: Candidate) -> bool:
    """Whether the fastest member other than ``control`` (by median) is faster than it but its speed-up interval
    over it still holds 1.0: another round could settle whether it is a gain.

    >>> a, b = (Candidate(policy=p, micro_batch=8, accumulate=1) for p in ("32-true", "bf16-mixed"))
    >>> still_open({a: [0.10] * 6, b: [0.08] * 6}, a), still_open({a: [0.10, 0.2] * 3, b: [0.09, 0.18] * 3}, a)
    (False, True)
    """
    ref = times.get(control)
    rest = [(statistics.median(t), t) for c, t in times.items() if c != control and t]
    if not ref or not rest:
        return False
    median, best = min(rest, key=lambda pair: pair[0])
    ci = speedup_interval(ref, best)
    return median < statistics.median(ref) and (ci is None or ci[0] <= 1.0 <= ci[1])


class Tune:
    """One tune's state as it goes."""

    def __init__(self, workload: Workload, device: torch.device, result: TuneResult, store: TrialStore, budget: Budget,
                 waves: WaveSettings, seed: int, run_steps: int, guard_steps: int, loader: Any,
                 progress: Callable[[str, float, float], None], meter: CpuMeter | None = None) -> None:
        self.workload, self.device, self.result, self.store, self.budget = workload, device, result, store, budget
        self.waves, self.seed, self.run_steps, self.guard_steps, self.loader = waves, seed, run_steps, guard_steps, loader
        self._progress = progress
        self.meter = meter or CpuMeter(budget.clock)
        self.reference: Reference | None = None
        self.finishing = False
        """True once the finalists are reached: no time is kept back for the confirmation wave any more."""
        self.held_s = 0.0
        """Seconds kept back for a wave still to come that the answer rests on (the precision stage's, until it ran)."""
        self.load: Load | None = None
        """The machine's load over the latest wave (or the probe)."""
        self.flops: dict[str, dict[str, float]] | None = {} if counts_flops(result.device) else None
        self.arithmetic_levers = True
        """Whether a stage of this tune can change what is computed (any lever but threads and the loader): only then
        is time kept back for the accuracy guard."""

    def progress(self, what: str) -> None:
        self._progress(what, self.budget.elapsed, max(0.0, self.budget.left))

    # -- the guard ------------------------------------------------------------------------------
    def guard_reserve(self, c: Candidate, confirmation: bool = True) -> float:
        """The time kept back for the end of the tune: the guard's runs for ``c`` (and the fp32 reference's, until
        run) and, until the finalists are reached, the confirmation wave, so that the stages' trials never eat the
        time that makes their answer trustworthy. A tune of scheduling levers only keeps none for the guard: nothing
        it tries needs one."""
        if not self.arithmetic_levers:
            return self.confirmation_s() if confirmation and not self.finishing else 0.0
        refs = 0.0 if self.reference is not None or self.store.guard("__reference__") else 2 * self.budget.guard_s(self.result.start, self.guard_steps)
        confirm = self.confirmation_s() if confirmation and not self.finishing else 0.0
        return refs + self.budget.guard_s(c, self.guard_steps) + confirm

    def needs_guard(self, c: Candidate) -> bool:
        """Whether ``c`` can train to another figure than the start: it changes what is computed (its policy, memory
        format, micro-batch...), not only when (threads, the loader: :attr:`Candidate.numerics_key` leaves them out)."""
        return c.numerics_key != self.result.start.numerics_key

    def confirmation_s(self) -> float:
        """The confirmation wave's least cost: the start and one finalist, its compile served by torch's cache."""
        return 2 * self.budget.trial_s(self.result.start, self.waves.steps)

    def guarded(self, c: Candidate) -> GuardResult | None:
        """``c``'s guard result (run now if not stored); None when the budget has no time left for it. A
        configuration that differs from the start only in scheduling (threads, the loader) needs no run: it passes
        as it is (:meth:`GuardResult.scheduling_only`), never dropped for want of time, nor the reference trained for it."""
        if not self.needs_guard(c):
            result = GuardResult.scheduling_only(c.numerics_key)
            self.result.guard[c.numerics_key] = result
            return result
        stored = self.store.guard(c.numerics_key)
        if stored is not None:
            result = GuardResult.from_dict(stored)
            self.result.guard[c.numerics_key] = result
            return result
        if self.guard_reserve(c) > self.budget.left:
            return None
        if self.reference is None:
            saved = self.store.guard("__reference__")
            if saved is not None:
                self.reference = Reference.from_dict(saved)
            else:
                # At the baseline's threads (a busy machine's free ones): threads change no number, only the time.
                start = dataclasses.replace(self.result.start, threads=self.result.baseline.threads)
                self.reference = reference(self.workload, start, self.device, steps=self.guard_steps, seed=self.seed, progress=self.progress)
                self.store.put_guard("__reference__", self.reference.to_dict())
            self.result.reference = self.reference
        result = judge(self.workload, c, self.reference, self.device, seed=self.seed, progress=self.progress)
        self.store.put_guard(c.numerics_key, result.to_dict())
        self.result.guard[c.numerics_key] = result
        return result

    # -- a wave ---------------------------------------------------------------------------------
    def wave(self, label: str, baseline: Candidate, members: Sequence[Candidate], *, incumbent: Candidate | None, deadline: float,
             unresolved: Callable[[dict[Candidate, list[float]]], bool] | None, max_rounds: int) -> list[Trial]:
        """Measure one wave (:func:`~ampkit.tuning._wave.measure_wave`) with the machine's load read over it; the
        budget's estimates learn from what it took."""
        if self.load is not None and self.load.busy:
            self.progress(f"{label}: the machine is busy ({self.load.describe()}): rounds are checked for drift")
        self.meter.mark()
        began = self.budget.clock()
        trials = measure_wave(self.workload, label, baseline, members, self.device, incumbent=incumbent, settings=self.waves,
                              seed=self.seed, deadline=deadline, clock=self.budget.clock, progress=self.progress, flops=self.flops,
                              setup_s=lambda c: self.budget.compile_s(c) * (1 + RECOMPILE_SHARE), unresolved=unresolved,
                              max_rounds=max_rounds, end=self.budget.start + self.budget.seconds,
                              step_s=self.budget.steps_s(1), member_s=self.budget.member_s)
        took = self.budget.clock() - began
        self.load = self.meter.read()
        first = trials[-1]  # the baseline's: the wave's rounds and drift are on every trial alike
        self.result.waves.append({
            "stage": label, "seconds": round(took, 2), "others_cores": self.load.others_cores, "rounds": first.rounds,
            "dropped_rounds": first.dropped_rounds, "disturbed": first.disturbed,
        })
        for t in trials:
            if t.compile_s and not t.resumed:
                self.budget.calibrate(Candidate.from_dict(t.candidate), t.compile_s)
        # The control's pace now is what later steps are estimated at (a machine that got busier slows them all);
        # what the wave took beyond its members' own steps and compiles (builds, memory steps under the tracker) is
        # the work's misfit, kept as the budget's work scale.
        compiles = sum(t.compile_s or 0.0 for t in trials) * (1 + RECOMPILE_SHARE)
        per_run = self.waves.measure_steps + self.waves.warmup
        steps_s = sum(self.budget.member_s + (per_run + (t.rounds + t.dropped_rounds) * self.waves.chunk) * (t.median_s or self.budget.step_s)
                      for t in trials if t.status != "cut")
        self.budget.step_s = first.median_s or self.budget.step_s
        self.budget.calibrate_work(steps_s, took - compiles)
        return trials

    # -- one stage ------------------------------------------------------------------------------
    def stage(self, plan: StagePlan, incumbent: Candidate, baseline: Candidate, label: str | None = None) -> Candidate:
        """Run ``plan``'s wave (or read it back) and return the configuration the next stage builds on."""
        r, label = self.result, label or plan.stage
        for c, why in plan.pruned:
            r.pruned.append({"stage": label, "key": c.key, "change": c.describe(r.start), "reason": why})
        if not plan.kept:
            r.stages.append({"stage": label, "incumbent": incumbent.key, "chosen": incumbent.key, "why": plan.reason})
            return incumbent
        wave_key = f"{label}|{incumbent.key}"
        stored = self.store.wave(wave_key)
        if stored is not None:
            trials = [Trial.from_dict(t) for t in stored]
            r.resumed += sum(1 for t in trials if t.role == "candidate")
        else:
            tried = self.affordable(plan, incumbent, baseline, label)
            if not tried:
                r.stages.append({"stage": label, "incumbent": incumbent.key, "chosen": incumbent.key, "why": "no time left in the budget"})
                return incumbent
            deadline = self.budget.start + self.budget.seconds - self.guard_reserve(tried[0]) - self.held_s
            try:
                trials = self.wave(label, baseline, tried, incumbent=incumbent, deadline=deadline,
                                   unresolved=lambda times: still_open(times, incumbent), max_rounds=STAGE_ROUNDS_FACTOR * self.waves.rounds)
            except WaveInterrupted as stopped:
                r.trials += stopped.trials  # shown as measured so far; not stored, so a resumed tune measures the wave whole
                raise
            self.store.put_wave(wave_key, [t.to_dict() for t in trials])
        r.trials += trials
        return self.choose(label, trials, incumbent)

    def affordable(self, plan: StagePlan, incumbent: Candidate, baseline: Candidate, label: str) -> list[Candidate]:
        """The prefix of the stage's candidates the budget has time for (the baseline's and incumbent's steps
        included), the rest listed as not tried."""
        steps = self.waves.steps
        spent = self.budget.trial_s(baseline, steps) + (self.budget.trial_s(incumbent, steps) if incumbent != baseline else 0.0)
        left = self.budget.left - self.guard_reserve(incumbent) - self.held_s
        tried: list[Candidate] = []
        for c in plan.kept:
            cost = self.budget.trial_s(c, steps)
            if spent + cost <= left:
                tried.append(c)
                spent += cost
            else:
                self.result.not_tried.append({
                    "stage": label, "key": c.key, "change": c.describe(self.result.start),
                    "reason": f"no time left in the budget (about {cost:.0f} s for its trial)",
                })
        return tried

    def choose(self, label: str, trials: Sequence[Trial], incumbent: Candidate) -> Candidate:
        """The fastest candidate whose speed-up over the incumbent clears the noise in an undisturbed wave (and, for
        a new precision, that passes the accuracy guard); else the incumbent."""
        against = next((t for t in trials if t.key == incumbent.key), None)
        reference_times = against.step_times_s if against is not None else []
        if trials and trials[-1].disturbed:
            why = ("the machine disturbed this wave (its control moved beyond the drift a round may show, and the rounds could not be "
                   "measured again): its figures are shown, not judged")
            self.result.stages.append({"stage": label, "incumbent": incumbent.key, "chosen": incumbent.key, "why": why})
            return incumbent
        cleared = []
        for t in trials:
            if t.role != "candidate" or t.status != "ok" or not reference_times:
                continue
            ci = t.interval(self.run_steps, reference_times)
            if ci is not None and ci[0] > 1.0:
                cleared.append((statistics.median(reference_times) / (t.amortised_s(self.run_steps) or math.inf), t))
        cleared.sort(key=lambda pair: -pair[0])
        chosen, why = incumbent, "no candidate beat the incumbent beyond the step-time noise (speed-up interval above 1.0)"
        for _, t in cleared:
            c = Candidate.from_dict(t.candidate)
            if c.policy != incumbent.policy:
                g = self.guarded(c)
                if g is None:
                    why = f"{c.describe(incumbent)} was faster, but the budget left no time for its accuracy guard"
                    continue
                if not g.passed:
                    why = f"{c.describe(incumbent)} was faster but failed the accuracy guard"
                    continue
            chosen, why = c, f"{c.describe(incumbent)}: faster than the incumbent beyond the noise"
            break
        self.result.stages.append({"stage": label, "incumbent": incumbent.key, "chosen": chosen.key, "why": why})
        return chosen
