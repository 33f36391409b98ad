"""The whole tune of one workload: facts, stages of interleaved trials, the accuracy guard, one proven answer.

1. **Probe**: a few steps of the starting configuration (fp32, the user's batch) give the step time every budget
   estimate rests on; a ``budget`` too small for one trial and the guard is refused with the minimum it needs.
2. **Facts** (:mod:`~ampkit.tuning._facts`) and, per stage in :func:`~ampkit.tuning._prune.stage_order`, the stage's
   candidates on top of the best configuration so far, pruned with reasons (:mod:`~ampkit.tuning._prune`).
3. **Trials**: each stage is one wave (:func:`~ampkit.tuning._trials.measure_wave`): the baseline, the incumbent and
   the stage's candidates, interleaved. A candidate replaces the incumbent only when its speed-up over it (compile
   time amortised over ``run_steps``) has its whole 95% interval above 1.0: a gain the noise cannot explain. A new
   precision is adopted only once the accuracy guard passed it, so later stages build on a policy that trains as
   well as fp32. Candidates the budget leaves no time for are listed as not tried.
4. **Finalists**: the fastest measured configurations (at most :data:`FINALISTS`) that beat the baseline beyond
   the noise go through the accuracy guard (:mod:`~ampkit.tuning._guard`) in speed order; the winner is the fastest
   that passes. Without one, the winner is the starting configuration: nothing was proven faster and as accurate.

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
from .._errors import one_line
from .._report.dialect import check_framework, gradient_checkpointing_of
from ..memory import repeated_blocks
from ..policy import get_policy
from ..profile import loader_settings, try_loader_settings
from ..training._regions import shape_groups
from ..workloads import Workload, batch_rows, device_info, split_batch
from ._facts import add_loader_facts, gather_facts
from ._format import fmt_bytes
from ._guard import GuardResult, Reference, judge, reference
from ._mfu import counts_flops
from ._prune import StagePlan, plan_stage, stage_order
from ._result import TuneResult
from ._space import Candidate, Facts, memory_key
from ._store import TrialStore
from ._trials import DEFAULT_WAVES, Trial, WaveInterrupted, WaveSettings, cold_compiles, make_run, measure_wave

__all__ = ["UNMEASURED_MARGIN", "COMPILE_MIN_S", "COMPILE_S_PER_MODULE", "COMPILE_S_PER_PARAMETER", "FINALISTS", "CompileSizes", "compiled_step", "LOADER_MIN_SPEEDUP", "RECOMPILE_SHARE", "tune_workload"]

log = logging.getLogger("ampkit")

FINALISTS = 3
"""At most this many of the fastest configurations go through the accuracy guard."""
COMPILE_S_PER_MODULE = {"cpu": 1.0, "cuda": 0.2}
"""Seconds a compile of the model is assumed to take per leaf module it traces (the whole model's, or one repeated
block's for regional compile), until a trial has measured one. The CPU's: whole-model compiles on the 2-core
development machine took 0.6-1.4 s per leaf module (digits 10 s for 11, gpt 14-17 s for 18, a GPT-2 built from a
config 28 s for 45, segment 32-73 s for 51; cold caches, 2026-11-28); the H200's about 0.1-0.2 s (gpt large's
compiles, 11.6 s regional to about 20 s whole)."""
COMPILE_S_PER_PARAMETER = {"cpu": 1.0, "cuda": 0.1}
"""The same for a compiled optimizer step (bf16-true-sr's library step, the fused master step), per parameter
tensor it updates: bf16-true-sr's step of segment's 86 tensors compiled in 77 s on the development CPU."""
UNMEASURED_MARGIN = 1.5
"""Until a compile has been measured its estimate is taken this much larger: a compile cannot be stopped once
started, and the per-size rates are one machine's (bf16-true-sr's step on resnet took 74 s against 62 estimated)."""
COMPILE_MIN_S = {"cpu": 5.0, "cuda": 10.0}
"""The least a compile is assumed to take: tracing, code generation and (CUDA) Triton's start cost this much even for
a small graph (the H200's regional compile of gpt large's 7-module block took 11.6 s)."""
RECOMPILE_SHARE = 0.1
"""A trial's run compiles twice (alone for its compile time, then the timed run), and a guard run once more: the
same graph again, which torch.compile's on-disk cache serves (0.76 s after 18.6 s for digits tiny on a CPU)."""
LOADER_MIN_SPEEDUP = 1.05
"""A loader setting is adopted when it makes the loader-fed step at least this much faster (the profile's
threshold: its trials give means, not intervals, and smaller differences are this machine's noise)."""
PROBE_STEPS = 3


@dataclass(frozen=True)
class CompileSizes:
    """What the compile time of a configuration scales with: the model's leaf modules, those of one repeated block of
    each shape (what regional compile traces: blocks of one shape reuse its code), and the parameter tensors an
    optimizer step updates."""

    modules: int = 1
    block_modules: int = 1
    parameters: int = 1

    @classmethod
    def of(cls, model: torch.nn.Module) -> CompileSizes:
        def leaves(m: torch.nn.Module) -> int:
            return sum(1 for x in m.modules() if next(x.children(), None) is None)

        modules = leaves(model)
        # Regional compile traces one block of each shape (blocks of one shape share its code: ampkit.training's
        # regions); blocks that all differ trace about as much as the whole model.
        groups = shape_groups(model, repeated_blocks(model))
        traced = sum(leaves(model.get_submodule(g[0])) for g in groups)
        return cls(modules, min(modules, traced) if groups else modules, sum(1 for _ in model.parameters()))


def compiled_step(c: Candidate) -> bool:
    """Whether ``c``'s engine compiles its optimizer step: ``fused_step=True``; bf16-true-sr's library step; a
    master-weight policy under ``compile=`` (fused there by default)."""
    if c.fused_step is False:
        return False
    policy = get_policy(c.policy)
    return bool(c.fused_step) or policy.name == "bf16-true-sr" or (c.compile is not None and policy.master_weights)


class _Budget:
    """The wall clock of a tune: its deadline, and estimates of what the remaining work costs.

    A compile's cost is estimated from the sizes it scales with (:class:`CompileSizes`, at
    :data:`COMPILE_S_PER_MODULE` and :data:`COMPILE_S_PER_PARAMETER`), times a **scale** that the trials calibrate:
    each measured compile sets it to the largest ratio of measured to estimated seen so far, so one slow compile
    makes every later estimate as pessimistic (a compile cannot be stopped once started)."""

    def __init__(self, seconds: float, clock: Callable[[], float], device: str) -> None:
        self.clock, self.start, self.seconds, self.device = clock, clock(), seconds, device
        self.step_s = 0.0
        self.sizes = CompileSizes()
        self.scale: float | None = None
        """Measured compile time over estimated, the largest seen; None until a compile is measured (then the
        estimate carries :data:`UNMEASURED_MARGIN`)."""
        self.work_scale = 1.0
        """A wave's measured wall time over its estimate (steps, memory steps under the tracker, builds), the largest
        seen, at least 1: what the estimates of later steps are multiplied by."""

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    @property
    def left(self) -> float:
        return self.seconds - self.elapsed

    def compile_guess(self, c: Candidate) -> float:
        """Seconds ``c``'s compiles take by the per-size rates alone (before the calibrated scale); 0 for none."""
        per_module, least = COMPILE_S_PER_MODULE.get(self.device, 1.0), COMPILE_MIN_S.get(self.device, 5.0)
        total = 0.0
        if c.compile is not None:
            total += max(least, per_module * (self.sizes.modules if c.compile == "model" else self.sizes.block_modules))
        if compiled_step(c):
            total += max(least, COMPILE_S_PER_PARAMETER.get(self.device, 1.0) * self.sizes.parameters)
        return total

    def compile_s(self, c: Candidate) -> float:
        return (self.scale if self.scale is not None else UNMEASURED_MARGIN) * self.compile_guess(c)

    def calibrate(self, c: Candidate, measured: float) -> None:
        """Scale later estimates by what ``c``'s compile took against its estimate (never down)."""
        guess = self.compile_guess(c)
        if guess > 0 and measured > 0:
            self.scale = max(self.scale or 0.0, measured / guess)

    def calibrate_work(self, estimated_s: float, measured_s: float) -> None:
        """Scale later step estimates by what a wave took against its estimate (never below 1, never down)."""
        if estimated_s > 0:
            self.work_scale = max(self.work_scale, measured_s / estimated_s)

    def steps_s(self, steps: int) -> float:
        return steps * self.step_s * self.work_scale

    def trial_s(self, c: Candidate, steps: int) -> float:
        return self.steps_s(steps) + self.compile_s(c) * (1 + RECOMPILE_SHARE)

    def guard_s(self, c: Candidate, steps: int) -> float:
        return self.steps_s(steps) + self.compile_s(c) * RECOMPILE_SHARE


def _probe(workload: Workload, start: Candidate, device: torch.device, seed: int) -> float:
    """The starting configuration's median step time over :data:`PROBE_STEPS` steps after one untimed step."""
    run = make_run(workload, start, device, seed, PROBE_STEPS + 1)
    run.build()
    run.train(1, False)
    run.train(PROBE_STEPS, True)
    run.release()
    return statistics.median(run.times)


def _fingerprint(workload: Workload, device: torch.device, seed: int, waves: WaveSettings, guard_steps: int) -> dict[str, Any]:
    return {
        "workload": workload.name, "description": workload.description, "items_per_batch": workload.items_per_batch,
        "accumulate": workload.accumulate, "rows": batch_rows(workload.train_batches[0]), "device": str(device), "seed": seed,
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


class _Tune:
    """One tune's state as it goes; :func:`tune_workload` drives it."""

    def __init__(self, workload: Workload, device: torch.device, result: TuneResult, store: TrialStore, budget: _Budget,
                 waves: WaveSettings, seed: int, run_steps: int, guard_steps: int, loader: Any, progress: Callable[[str, float, float], None]) -> None:
        self.workload, self.device, self.result, self.store, self.budget = workload, device, result, store, budget
        self.waves, self.seed, self.run_steps, self.guard_steps, self.loader = waves, seed, run_steps, guard_steps, loader
        self._progress = progress
        self.reference: Reference | None = None
        # True once the finalists are reached: no time is kept back for the confirmation wave any more (it runs now, or not).
        self.finishing = False
        # Step FLOPs by configuration (ampkit.tuning._mfu.flops_key), counted once per tune, where MFU can be given.
        self.flops: dict[str, dict[str, float]] | None = {} if counts_flops(result.device) else None

    def progress(self, what: str) -> None:
        self._progress(what, self.budget.elapsed, max(0.0, self.budget.left))

    # -- the guard ------------------------------------------------------------------------------
    def guard_reserve(self, c: Candidate, confirmation: bool = True) -> float:
        """The time kept back for the end of the tune: the guard's runs for ``c`` (and the fp32 reference's, until
        run) and, until the finalists are reached, the confirmation wave (:meth:`finalists`), so that the stages'
        trials never eat the time that makes their answer trustworthy."""
        refs = 0.0 if self.reference is not None or self.store.guard("__reference__") else 2 * self.budget.guard_s(self.result.start, self.guard_steps)
        confirm = self.confirmation_s() if confirmation and not self.finishing else 0.0
        return refs + self.budget.guard_s(c, self.guard_steps) + confirm

    def confirmation_s(self) -> float:
        """What the confirmation wave is expected to take: :data:`FINALISTS` configurations and the start, a trial
        each, their compiles served by torch's cache (they were compiled in their stages)."""
        return (FINALISTS + 1) * self.budget.trial_s(self.result.start, self.waves.steps)

    def guarded(self, c: Candidate) -> GuardResult | None:
        """``c``'s guard result (run now if not stored); None when the budget has no time left for it."""
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
                self.reference = reference(self.workload, self.result.start, self.device, steps=self.guard_steps, seed=self.seed, progress=self.progress)
                self.store.put_guard("__reference__", self.reference.to_dict())
            self.result.reference = self.reference
        if c.numerics_key == self.result.start.numerics_key:
            result = GuardResult(c.numerics_key, self.reference.metric, self.reference.higher_is_better, self.reference.value,
                                 self.reference.value, self.reference.noise, self.reference.tolerance, list(self.reference.losses))
        else:
            result = judge(self.workload, c, self.reference, self.device, seed=self.seed, progress=self.progress)
        self.store.put_guard(c.numerics_key, result.to_dict())
        self.result.guard[c.numerics_key] = result
        return result

    # -- one stage ------------------------------------------------------------------------------
    def stage(self, plan: StagePlan, incumbent: Candidate, baseline: Candidate) -> Candidate:
        """Run ``plan``'s wave (or read it back) and return the configuration the next stage builds on."""
        r = self.result
        for c, why in plan.pruned:
            r.pruned.append({"stage": plan.stage, "key": c.key, "change": c.describe(r.start), "reason": why})
        if not plan.kept:
            r.stages.append({"stage": plan.stage, "incumbent": incumbent.key, "chosen": incumbent.key, "why": plan.reason})
            return incumbent
        if plan.stage == "loader":
            return self.loader_stage(plan, incumbent)
        wave_key = f"{plan.stage}|{incumbent.key}"
        stored = self.store.wave(wave_key)
        if stored is not None:
            trials = [Trial.from_dict(t) for t in stored]
            r.resumed += sum(1 for t in trials if t.role == "candidate")
        else:
            tried = self.affordable(plan, incumbent, baseline)
            if not tried:
                r.stages.append({"stage": plan.stage, "incumbent": incumbent.key, "chosen": incumbent.key, "why": "no time left in the budget"})
                return incumbent
            deadline = self.budget.start + self.budget.seconds - self.guard_reserve(tried[0])
            began = self.budget.clock()
            try:
                trials = measure_wave(self.workload, plan.stage, baseline, tried, self.device, incumbent=incumbent, settings=self.waves,
                                      seed=self.seed, deadline=deadline, clock=self.budget.clock, progress=self.progress,
                                      flops=self.flops)
            except WaveInterrupted as stopped:
                r.trials += stopped.trials  # shown as measured so far; not stored, so a resumed tune measures the wave whole
                raise
            took = self.budget.clock() - began
            self.store.put_wave(wave_key, [t.to_dict() for t in trials])
            members = [Candidate.from_dict(t.candidate) for t in trials]
            for t in trials:
                if t.compile_s and not t.resumed:
                    self.budget.calibrate(Candidate.from_dict(t.candidate), t.compile_s)
            # With the compiles calibrated, what the wave's steps took beyond their estimate is the work's own misfit.
            compiles = sum(t.compile_s or 0.0 for t in trials) * (1 + RECOMPILE_SHARE)
            self.budget.calibrate_work(len(members) * self.waves.steps * self.budget.step_s, took - compiles)
        r.trials += trials
        return self.choose(plan, trials, incumbent, baseline)

    def affordable(self, plan: StagePlan, incumbent: Candidate, baseline: Candidate) -> list[Candidate]:
        """The prefix of the stage's candidates the budget has time for (the baseline's and incumbent's steps
        included), the rest listed as not tried."""
        steps = self.waves.steps
        spent = self.budget.trial_s(baseline, steps) + (self.budget.trial_s(incumbent, steps) if incumbent != baseline else 0.0)
        left = self.budget.left - self.guard_reserve(incumbent)
        tried: list[Candidate] = []
        for c in plan.kept:
            cost = self.budget.trial_s(c, steps)
            if spent + cost <= left:
                tried.append(c)
                spent += cost
            else:
                self.result.not_tried.append({
                    "stage": plan.stage, "key": c.key, "change": c.describe(self.result.start),
                    "reason": f"no time left in the budget (about {cost:.0f} s for its trial)",
                })
        return tried

    def choose(self, plan: StagePlan, trials: Sequence[Trial], incumbent: Candidate, baseline: Candidate) -> Candidate:
        """The fastest candidate whose speed-up over the incumbent clears the noise (and, for a new precision, that
        passes the accuracy guard); else the incumbent."""
        against = next((t for t in trials if t.key == incumbent.key), None)
        reference_times = against.step_times_s if against is not None else []
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
        self.result.stages.append({"stage": plan.stage, "incumbent": incumbent.key, "chosen": chosen.key, "why": why})
        return chosen

    # -- the loader -----------------------------------------------------------------------------
    def loader_stage(self, plan: StagePlan, incumbent: Candidate) -> Candidate:
        """Time the incumbent's step fed by the DataLoader's variants, as ``ampkit profile`` searches them
        (:func:`ampkit.profile.try_loader_settings`: the worker counts of the plan, then persistent workers, a deeper
        prefetch and, on CUDA, pinned memory, each kept when it helps); adopt the fastest that gains
        :data:`LOADER_MIN_SPEEDUP`."""
        key = f"loader|{incumbent.key}"
        stored = self.store.loader(key)
        if stored is None:
            # Each variant (the plan's and up to 3 refinements) runs two epochs of about 16 loader-fed steps.
            share = self.result.facts.get("data_share") or 0.0
            cost = (len(plan.kept) + 4) * 2 * 16 * self.budget.step_s / max(1e-3, 1.0 - share)
            if cost > self.budget.left - self.guard_reserve(incumbent):
                self.result.not_tried.append({"stage": "loader", "key": f"{incumbent.key} (loader)", "change": "the DataLoader's settings",
                                              "reason": f"no time left in the budget (about {cost:.0f} s for the loader's trials)"})
                self.result.stages.append({"stage": "loader", "incumbent": incumbent.key, "chosen": incumbent.key, "why": "no time left in the budget"})
                return incumbent
            base = loader_settings(self.loader)
            # One loader batch a step: the incumbent's micro-batches of it (the user's own accumulation, which spans
            # several loader batches, does not change how fast the loader must deliver one).
            parts = incumbent.accumulate // self.workload.accumulate
            one_batch = dataclasses.replace(self.workload, accumulate=1)
            run = make_run(one_batch, dataclasses.replace(incumbent, accumulate=parts), self.device, self.seed, 1)
            run.build()

            def step(batch: Any) -> None:
                rows = batch_rows(batch) // parts
                run.batches, run.steps_done = [split_batch(batch, i * rows, (i + 1) * rows) for i in range(parts)], 0
                run.train(1, False)

            self.progress("loader: the DataLoader's variants")
            try:
                found = try_loader_settings(self.loader, step, self.device, channels_last=incumbent.channels_last)
            except Exception as exc:  # noqa: BLE001 - the loader as given failing ends this stage, not the tune
                self.result.notes.append(f"the DataLoader's trials failed ({one_line(exc, with_type=True)}): its settings are left as given")
                self.result.stages.append({"stage": "loader", "incumbent": incumbent.key, "chosen": incumbent.key, "why": "its trials failed"})
                return incumbent
            finally:
                run.release()
            stored = [{**t.to_dict(), "kwargs": {k: v for k, v in dataclasses.asdict(t.settings).items() if getattr(base, k) != v}} for t in found]
            self.store.put_loader(key, stored)
        self.result.loader_trials = stored
        best = max(stored, key=lambda t: t["speedup"])
        if best["speedup"] >= LOADER_MIN_SPEEDUP and best["kwargs"]:
            chosen = dataclasses.replace(incumbent, loader=tuple(sorted(best["kwargs"].items())))
            why = f"{best['name']}: {best['speedup']:.2f}x faster fed by the loader"
        else:
            chosen, why = incumbent, f"no DataLoader setting was {LOADER_MIN_SPEEDUP:.2f}x faster than the loader as given"
        self.result.stages.append({"stage": "loader", "incumbent": incumbent.key, "chosen": chosen.key, "why": why})
        return chosen

    # -- the finalists --------------------------------------------------------------------------
    def finalists(self, baseline: Candidate, incumbent: Candidate) -> Candidate:
        """The winner: the fastest configurations measured (each in its own stage's wave, beyond the noise) are
        measured again side by side in one **confirmation wave**, ranked by it, and guarded in that order; the
        winner is the fastest that passes (the incumbent's loader settings carried over), else the baseline.

        A stage adopts the candidate whose one wave cleared the noise; among many such draws some clear it by luck
        (the winner's curse), and each stage's rounds ran at another time. The confirmation wave is a fresh draw,
        every finalist beside the start in the same rounds, so the figure the winner is chosen by is not the one it
        was selected on. Without time for it, the stages' own waves rank them (the notes say so)."""
        best: dict[str, Trial] = {}
        for t in self.result.trials:
            # Each configuration as its own stage measured it (an incumbent measured again in a later wave is that
            # wave's control, not a second draw to pick the luckier of).
            if t.status != "ok" or t.role != "candidate" or t.key == baseline.key:
                continue
            ci = t.interval(self.run_steps)
            if ci is None or ci[0] <= 1.0:
                continue
            if t.key not in best or (t.speedup(self.run_steps) or 0) > (best[t.key].speedup(self.run_steps) or 0):
                best[t.key] = t
        ranked = sorted(best.values(), key=lambda t: -(t.speedup(self.run_steps) or 0))[:FINALISTS]
        self.finishing = True
        confirmed = self.confirm([Candidate.from_dict(t.candidate) for t in ranked], baseline) if ranked else None
        if confirmed is not None:
            ranked = confirmed
        for considered, t in enumerate(ranked, 1):
            c = dataclasses.replace(Candidate.from_dict(t.candidate), loader=incumbent.loader)
            self.progress(f"finalist {considered}: {c.describe(baseline)}")
            g = self.guarded(c)
            if g is None:
                self.result.notes.append(f"{c.key}: not guarded (no time left in the budget), so not recommended")
                continue
            if g.passed:
                where = "in the confirmation wave" if confirmed is not None else "in its stage's wave"
                self.result.winner_reason = (f"the fastest configuration whose speed-up over the start clears the noise {where} and "
                                             f"that passed the accuracy guard ({t.speedup(self.run_steps):.2f}x)")
                return c
        if confirmed is not None and not confirmed:
            self.result.winner_reason = ("no finalist's speed-up over the start cleared the noise again in the confirmation wave: "
                                         "keep the start")
        else:
            self.result.winner_reason = ("no configuration was measured faster than the start beyond the noise and passed the "
                                         "accuracy guard: keep the start" if ranked or not self.result.interrupted else
                                         "interrupted before any configuration was proven")
        return dataclasses.replace(baseline, loader=incumbent.loader)

    def confirm(self, contenders: list[Candidate], baseline: Candidate) -> list[Trial] | None:
        """Measure ``contenders`` again beside ``baseline`` in one wave; their trials there that clear the noise,
        fastest first (None: no time for the wave). Compile time is each graph's first, cold compile in this tune:
        the wave finds torch's caches warm and would otherwise charge a compiled finalist almost nothing."""
        key = "final|" + "|".join(c.key for c in contenders)
        stored = self.store.wave(key)
        if stored is not None:
            trials = [Trial.from_dict(t) for t in stored]
        else:
            steps = self.waves.steps
            cost = (len(contenders) + 1) * self.budget.steps_s(steps) + sum(self.budget.compile_s(c) * RECOMPILE_SHARE for c in contenders)
            if cost > self.budget.left - self.guard_reserve(contenders[0]):
                self.result.notes.append(f"no time left for the confirmation wave (about {cost:.0f} s): the finalists are ranked by their "
                                         "own stages' waves")
                return None
            deadline = self.budget.start + self.budget.seconds - self.guard_reserve(contenders[0])
            trials = measure_wave(self.workload, "final", baseline, contenders, self.device, settings=self.waves, seed=self.seed,
                                  deadline=deadline, clock=self.budget.clock, progress=self.progress)
            cold = cold_compiles(self.result.trials)
            for t in trials:
                k = Candidate.from_dict(t.candidate).numerics_key
                t.compile_s = max(t.compile_s or 0.0, cold.get(k, 0.0)) or None
            self.store.put_wave(key, [t.to_dict() for t in trials])
        self.result.trials += trials
        cleared = [t for t in trials if t.role == "candidate" and t.status == "ok" and (ci := t.interval(self.run_steps)) is not None and ci[0] > 1.0]
        return sorted(cleared, key=lambda t: -(t.speedup(self.run_steps) or 0))


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
    rows = batch_rows(workload.train_batches[0])
    # The start is the workload as given: fp32, its batch, its memory format (the bench's conv workloads come channels_last).
    start = Candidate(policy="32-true", micro_batch=rows, accumulate=workload.accumulate, channels_last=workload.channels_last)
    store = TrialStore(Path(out) if out is not None else None, _fingerprint(workload, device, seed, waves, guard_steps))
    clock_budget = _Budget(float(budget), clock, device.type)
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
    tune = _Tune(workload, device, result, store, clock_budget, waves, seed, run_steps, guard_steps, loader, progress)
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
    tune: _Tune, workload: Workload, device: torch.device, memory_budget: int | None, stages: Sequence[str] | None, precisions: Sequence[str] | None,
) -> None:
    result, budget = tune.result, tune.budget
    start = result.start
    mark = [budget.elapsed]

    def took(part: str) -> None:  # where the budget went, part by part (the report's last line)
        now = budget.elapsed
        result.timings[part] = round(result.timings.get(part, 0.0) + now - mark[0], 3)
        mark[0] = now

    tune.progress("predicting memory and reading the model")
    notes: list[str] = []
    facts = gather_facts(workload, device, memory_budget=memory_budget, precisions=precisions, notes=notes)
    took("facts")
    start_fits = facts.memory_budget is None or facts.predicted_peak.get(memory_key(start.policy, start.micro_batch, False), 0) <= facts.memory_budget
    baseline = start
    if not start_fits:
        fit = plan_stage("fit", start, facts)
        if not fit.kept:
            raise ValueError(_fit_error(workload, facts, start))
        baseline = fit.kept[0]
        result.notes.append(f"the user's batch of {start.micro_batch} rows does not fit ({fmt_bytes(facts.memory_budget)} free): "
                            f"speed-ups are against {baseline.describe(start)}, the largest micro-batch that fits")
    budget.sizes = CompileSizes.of(workload.model)
    tune.progress("timing the starting configuration")
    budget.step_s = _probe(workload, baseline, device, tune.seed)
    took("probe")
    minimum = budget.elapsed + 2 * budget.trial_s(baseline, tune.waves.steps) + tune.guard_reserve(baseline, confirmation=False)
    if minimum > budget.seconds:
        enough = math.ceil(minimum * 1.5)
        raise ValueError(
            f"--budget {budget.seconds:g} s is too small for one trial of {workload.name} here: a trial of the start and one "
            f"candidate and the accuracy guard take about {math.ceil(minimum)} s (a step takes {budget.step_s * 1e3:.1f} ms); "
            f"pass --budget {enough} (budget={enough} in Python) or more."
        )
    if tune.loader is not None:
        add_loader_facts(facts, tune.loader, budget.step_s, device)
        took("facts")
    result.notes += notes
    result.facts = _facts_summary(facts)
    result.baseline = incumbent = baseline
    # What a compile's cost is weighed against (compile_cannot_pay, and the order of trials): the estimate, the run.
    facts.compile_s, facts.run_steps, facts.step_s = budget.compile_s, tune.run_steps, budget.step_s
    order = stage_order(facts, start_fits)
    for stage in order:
        if stages is not None and stage not in stages and stage != "fit":  # nothing runs until the step fits
            continue
        facts.step_s = _step_of(result.trials, incumbent) or facts.step_s
        if stage == "fit":
            plan = plan_stage("fit", start, facts)
            incumbent = tune.stage(plan, baseline, baseline)
        else:
            incumbent = tune.stage(plan_stage(stage, incumbent, facts), incumbent, baseline)
        took(stage)
    result.winner = tune.finalists(baseline, incumbent)
    took("finalists")


def _step_of(trials: Sequence[Trial], c: Candidate) -> float | None:
    """``c``'s median step in the latest wave that measured it (None: not measured yet)."""
    return next((t.median_s for t in reversed(trials) if t.key == c.key and t.status == "ok" and t.median_s), None)


def _facts_summary(facts: Facts) -> dict[str, Any]:
    return {
        "memory_budget": facts.memory_budget, "predicted_peak": dict(facts.predicted_peak), "fp8_layers": {k: list(v) for k, v in facts.fp8_layers.items()},
        "fp16_overflow": list(facts.fp16_overflow), "data_share": facts.data_share, "blocks": facts.blocks, "convs": facts.convs, "cores": facts.cores,
        "threads": facts.threads, "compiler": facts.compiler,
    }

