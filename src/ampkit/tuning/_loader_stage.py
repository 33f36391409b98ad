"""The loader stage: the incumbent's step fed by the DataLoader's variants, as ``ampkit profile`` searches them
(:func:`ampkit.profile.try_loader_settings`: the worker counts of the plan, then persistent workers, a deeper prefetch
and, on CUDA, pinned memory, each kept when it helps), within the tune's deadline like every other stage."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._errors import one_line
from ..profile import loader_settings, try_loader_settings
from ..workloads import batch_rows, split_batch
from ._prune import StagePlan
from ._space import Candidate
from ._trials import make_run
from ._tune import Tune

__all__ = ["LOADER_MIN_SPEEDUP", "loader_stage"]

LOADER_MIN_SPEEDUP = 1.05
"""A loader setting is adopted when it makes the loader-fed step at least this much faster (the profile's
threshold: its trials give means, not intervals, and smaller differences are this machine's noise)."""
STEPS_PER_VARIANT = 2 * 16
"""What one variant's trial is estimated at, in steps: two epochs of about 16 loader-fed steps (the worker start-ups
come on top, which is why the stage also runs to a deadline)."""


def loader_stage(tune: Tune, plan: StagePlan, incumbent: Candidate) -> Candidate:
    """Adopt the fastest DataLoader variant that gains :data:`LOADER_MIN_SPEEDUP` (else the loader as given)."""
    result, budget = tune.result, tune.budget
    key = f"loader|{incumbent.key}"
    stored = tune.store.loader(key)

    def keep(why: str, note: str | None = None) -> Candidate:
        if note:
            result.notes.append(note)
        result.stages.append({"stage": "loader", "incumbent": incumbent.key, "chosen": incumbent.key, "why": why})
        return incumbent

    if stored is None:
        share = result.facts.get("data_share") or 0.0
        # The loader as given and the first variant at least: fewer can compare nothing.
        least = 2 * STEPS_PER_VARIANT * budget.steps_s(1) / max(1e-3, 1.0 - share)
        reserve = tune.guard_reserve(incumbent) + tune.held_s
        if least > budget.left - reserve:
            result.not_tried.append({"stage": "loader", "key": f"{incumbent.key} (loader)", "change": "the DataLoader's settings",
                                     "reason": f"no time left in the budget (about {least:.0f} s for the loader's first trials)"})
            return keep("no time left in the budget")
        base = loader_settings(tune.loader)
        # One loader batch a step: the incumbent's micro-batches of it (the user's own accumulation, which spans
        # several loader batches, does not change how fast the loader must deliver one).
        parts = incumbent.accumulate // tune.workload.accumulate
        one_batch = dataclasses.replace(tune.workload, accumulate=1)
        run = make_run(one_batch, dataclasses.replace(incumbent, accumulate=parts), tune.device, tune.seed, 1)
        run.build()

        def step(batch: Any) -> None:
            if parts > 1:
                rows = batch_rows(batch) // parts
                run.batches = [split_batch(batch, i * rows, (i + 1) * rows) for i in range(parts)]
            else:
                run.batches = [batch]
            run.steps_done = 0
            run.train(1, False)

        tune.progress("loader: the DataLoader's variants")
        try:
            found = try_loader_settings(tune.loader, step, tune.device, channels_last=incumbent.channels_last,
                                        deadline=budget.start + budget.seconds - reserve, clock=budget.clock)
        except Exception as exc:  # noqa: BLE001 - the loader as given failing (or the deadline passing first) ends this stage, not the tune
            return keep("its trials failed", f"the DataLoader's trials ended early ({one_line(exc, with_type=True)}): its settings are left as given")
        finally:
            run.release()
        stored = [{**t.to_dict(), "kwargs": {k: v for k, v in dataclasses.asdict(t.settings).items() if getattr(base, k) != v}} for t in found]
        tune.store.put_loader(key, stored)
    result.loader_trials = stored
    best = max(stored, key=lambda t: t["speedup"])
    if best["speedup"] >= LOADER_MIN_SPEEDUP and best["kwargs"]:
        chosen = dataclasses.replace(incumbent, loader=tuple(sorted(best["kwargs"].items())))
        why = f"{best['name']}: {best['speedup']:.2f}x faster fed by the loader"
    else:
        chosen, why = incumbent, f"no DataLoader setting was {LOADER_MIN_SPEEDUP:.2f}x faster than the loader as given"
    result.stages.append({"stage": "loader", "incumbent": incumbent.key, "chosen": chosen.key, "why": why})
    return chosen
