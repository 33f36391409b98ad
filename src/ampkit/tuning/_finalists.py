"""The end of a tune: the leading configurations measured again side by side, until told apart, then guarded.

A stage adopts the candidate whose one wave cleared the noise; among many such draws some clear it by luck (the
winner's curse), each stage's rounds ran at another time, and a disturbed wave judged nothing. So the leaders (the
fastest configurations measured, whether or not their own wave could tell them from the start) are measured again
in one **confirmation wave** beside the start, with as many rounds as it takes for each leader's interval to leave
1.0 and for the leaders' intervals to part (:func:`unsettled`), while the budget lasts. A leader is any configuration
whose interval reaches above 1.0: one that may be faster, which its own wave could not tell. They are ranked by it and
guarded in that order; the winner is the fastest that passes. Without time for the wave, the stages' own
undisturbed waves rank them (the notes say so).
"""

from __future__ import annotations

import dataclasses

from ..bench import speedup_interval
from ._budget import RECOMPILE_SHARE
from ._space import Candidate
from ._trials import Trial, cold_compiles
from ._tune import FINALISTS, Tune
from ._wave import MAX_ROUNDS_FACTOR

__all__ = ["CONFIRM_ROUNDS_FACTOR", "finalists", "unsettled"]

CONFIRM_ROUNDS_FACTOR = 2 * MAX_ROUNDS_FACTOR
"""The confirmation wave runs at most this many times a wave's rounds: the budget left is spent on certainty."""


def unsettled(times: dict[Candidate, list[float]], control: Candidate) -> bool:
    """Whether another round could change the answer: some leader's speed-up interval over ``control`` still holds
    1.0, or the two fastest leaders' intervals overlap (which is faster is not yet known).

    >>> a, b, c = (Candidate(policy=p, micro_batch=8, accumulate=1) for p in ("32-true", "bf16-mixed", "bf16-true"))
    >>> unsettled({a: [0.10] * 6, b: [0.08] * 6, c: [0.06] * 6}, a), unsettled({a: [0.10] * 6, b: [0.08] * 6, c: [0.08] * 6}, a)
    (False, True)
    """
    ref = times.get(control)
    if not ref:
        return False
    intervals = sorted(((speedup_interval(ref, t), c) for c, t in times.items() if c != control and t), key=lambda p: -(p[0] or (0, 0))[0])
    if any(ci is None or ci[0] <= 1.0 <= ci[1] for ci, _ in intervals):
        return True
    if len(intervals) >= 2:
        (first, _), (second, _) = intervals[:2]
        return first is not None and second is not None and first[0] <= second[1] and second[0] <= first[1]
    return False


def _leaders(tune: Tune, baseline: Candidate) -> list[Trial]:
    """The fastest configurations measured, each by its own stage's wave, that may be faster than the start: their
    speed-up interval reaches above 1.0 (at most :data:`~ampkit.tuning._tune.FINALISTS`, by median speed-up)."""
    best: dict[str, Trial] = {}
    for t in tune.result.trials:
        # Each configuration as its own stage measured it (an incumbent measured again in a later wave is that
        # wave's control, not a second draw to pick the luckier of).
        ci = t.interval(tune.run_steps) if t.status == "ok" else None
        if t.role != "candidate" or t.key == baseline.key or ci is None or ci[1] <= 1.0:
            continue
        if t.key not in best or (t.speedup(tune.run_steps) or 0) > (best[t.key].speedup(tune.run_steps) or 0):
            best[t.key] = t
    return sorted(best.values(), key=lambda t: -(t.speedup(tune.run_steps) or 0))[:FINALISTS]


def _cleared(trials: list[Trial], run_steps: int) -> list[Trial]:
    ok = [t for t in trials if t.role == "candidate" and t.status == "ok" and not t.disturbed
          and (ci := t.interval(run_steps)) is not None and ci[0] > 1.0]
    return sorted(ok, key=lambda t: -(t.speedup(run_steps) or 0))


def finalists(tune: Tune, baseline: Candidate, incumbent: Candidate) -> Candidate:
    """The winner (see the module's docstring); the incumbent's loader settings carried over; else the baseline."""
    result = tune.result
    leaders = _leaders(tune, baseline)
    tune.finishing = True
    confirmed = _confirm(tune, [Candidate.from_dict(t.candidate) for t in leaders], baseline) if leaders else None
    ranked = confirmed if confirmed is not None else _cleared(leaders, tune.run_steps)
    for considered, t in enumerate(ranked, 1):
        c = dataclasses.replace(Candidate.from_dict(t.candidate), loader=incumbent.loader)
        tune.progress(f"finalist {considered}: {c.describe(baseline)}: accuracy guard")
        g = tune.guarded(c)
        if g is None:
            result.notes.append(f"{c.key}: not guarded (no time left in the budget), so not recommended")
            continue
        if g.passed:
            where = f"in the confirmation wave ({t.rounds} rounds)" if confirmed is not None else "in its stage's wave"
            guard = ("that changes only scheduling (threads, the DataLoader), not what is computed: it needs no accuracy guard"
                     if g.same_arithmetic else "that passed the accuracy guard")
            result.winner_reason = (f"the fastest configuration whose speed-up over the start clears the noise {where} and "
                                    f"{guard} ({t.speedup(tune.run_steps):.2f}x)")
            return c
    if confirmed is not None and not confirmed:
        result.winner_reason = "no leader's speed-up over the start cleared the noise in the confirmation wave: keep the start"
    elif result.interrupted:
        result.winner_reason = "interrupted before any configuration was proven"
    else:
        result.winner_reason = ("no configuration was measured faster than the start beyond the noise and passed the accuracy "
                                "guard: keep the start")
    return dataclasses.replace(baseline, loader=incumbent.loader)


def _confirm(tune: Tune, contenders: list[Candidate], baseline: Candidate) -> list[Trial] | None:
    """Measure ``contenders`` again beside ``baseline`` in one wave, with rounds until :func:`unsettled` is not;
    their trials there that clear the noise, fastest first (None: no time for the wave). Compile time is each
    graph's first, cold compile in this tune: the wave finds torch's caches warm and would otherwise charge a
    compiled finalist almost nothing."""
    key = "final|" + "|".join(c.key for c in contenders)
    stored = tune.store.wave(key)
    budget = tune.budget
    if stored is not None:
        trials = [Trial.from_dict(t) for t in stored]
    else:
        steps = tune.waves.steps
        cost = 2 * budget.steps_s(steps) + budget.compile_s(contenders[0]) * RECOMPILE_SHARE
        # Time is kept back for the first contender's guard that needs one: a scheduling-only one needs none.
        guarded = next((c for c in contenders if tune.needs_guard(c)), None)
        reserve = tune.guard_reserve(guarded) if guarded is not None else 0.0
        if cost > budget.left - reserve:
            tune.result.notes.append(f"no time left for the confirmation wave (about {cost:.0f} s): the finalists are ranked by their "
                                     "own stages' waves")
            return None
        deadline = budget.start + budget.seconds - reserve
        trials = tune.wave("final", baseline, contenders, incumbent=None, deadline=deadline,
                           unresolved=lambda times: unsettled(times, baseline), max_rounds=CONFIRM_ROUNDS_FACTOR * tune.waves.rounds)
        cold = cold_compiles(tune.result.trials)
        for t in trials:
            k = Candidate.from_dict(t.candidate).numerics_key
            t.compile_s = max(t.compile_s or 0.0, cold.get(k, 0.0)) or None
        tune.store.put_wave(key, [t.to_dict() for t in trials])
    tune.result.trials += trials
    if trials and trials[-1].disturbed:
        tune.result.notes.append("the machine disturbed the confirmation wave (its control moved beyond the drift a round may show, "
                                 "and the rounds could not be measured again): nothing is recommended from it")
        return []
    return _cleared(trials, tune.run_steps)
