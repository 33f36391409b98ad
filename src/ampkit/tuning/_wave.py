"""One wave: candidates timed side by side, interleaved, beside the starting configuration as control.

A wave runs as the bench runs its policies:

1. each member alone first, for its memory (the bench's definition: on a CPU the peak of live tensor bytes of an
   eager step; CUDA: the allocator's peak) and, compiled, its compile time: its first steps less as many steady ones.
   A member is **admitted** only when its own setup and every admitted member's rounds fit before the deadline, at
   the pace the control's own first steps ran (``setup_s`` estimates a compile): one that does not is ``cut`` before
   it starts, rather than every member left with no rounds;
2. all built and warmed up, untimed. An eager run whose engine compiles its optimizer step (bf16-true-sr's library
   step, ``fused_step=True``) compiles here: its compile time is its warm-up less as many steady steps;
3. timed in rounds of ``chunk`` steps, the order rotating each round, so a machine that speeds up or slows down
   spreads over every member. After each round the **control's drift** is read
   (:func:`~ampkit.tuning._machine.control_drift`): a round whose control moved beyond
   :data:`~ampkit.tuning._machine.ROUND_DRIFT` is dropped, every member's steps of it, and measured again. Past the
   ``rounds`` a wave needs, more rounds run while ``unresolved`` says the leading figures are not yet told apart and
   one more round fits before the deadline (at most ``max_rounds`` in all). No round starts after the deadline, and
   no member starts its setup after it (a compile cannot be stopped once started): the budget is overrun by at most
   the step or compile in progress when it passed.

A wave that could not replace a dropped round (the deadline, or a control that never held still) marks its trials
``disturbed``: shown, not judged.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from .._errors import one_line
from ..bench import PolicyRun
from ..bench._policy_run import compile_phase
from ..workloads import Workload
from ._budget import dear
from ._machine import control_drift
from ._mfu import flops_key
from ._space import Candidate
from ._trials import DEFAULT_WAVES, Trial, WaveSettings, make_run, micro_workload, step_flops, threads

__all__ = ["MAX_ROUNDS_FACTOR", "WaveInterrupted", "measure_wave"]

log = logging.getLogger("ampkit")

MAX_ROUNDS_FACTOR = 3
"""By default a wave runs at most this many times its ``rounds``, replacement and certainty rounds included."""


def _guarded(run: PolicyRun, candidate: Candidate, what: str, fn: Callable[..., object], *args: object) -> None:
    if not run.alive:
        return
    try:
        with threads(candidate.threads):
            fn(*args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - one candidate's failure is its row's finding; the others go on
        log.warning("tune: %s failed while %s: %s", candidate.key, what, one_line(exc, with_type=True))
        run.fail(exc)


class _Rounds:
    """The timed rounds of a wave: which steps of each member each round holds, so a disturbed round can be dropped."""

    def __init__(self, runs: Sequence[PolicyRun]) -> None:
        self.runs = runs
        self.spans: list[dict[int, tuple[int, int]]] = []

    def run(self, r: int, members: Sequence[int], wave: Sequence[Candidate], chunk: int, stop: Callable[[], bool]) -> bool:
        """Round ``r``: each member's ``chunk`` steps, the order rotated; False when ``stop()`` said so before one of
        its steps (the round is then incomplete: its steps are dropped, every member's)."""
        spans: dict[int, tuple[int, int]] = {}
        stopped: list[bool] = []

        def asked() -> bool:  # before every step: the budget's end is overrun by at most one step
            if stop():
                stopped.append(True)
            return bool(stopped)

        for i in range(len(members)):
            j = members[(i + r) % len(members)]  # rotate who goes first each round
            run = self.runs[j]
            before = len(run.times)
            _guarded(run, wave[j], "training", run.train, chunk, True, asked)
            spans[j] = (before, len(run.times))
            if stopped:
                break
        complete = not stopped
        self.spans.append(spans)
        if not complete:
            self.drop([len(self.spans) - 1])
            self.spans.pop()
        return complete

    def control(self) -> list[list[float]]:
        """The control's (member 0's) step times in each round."""
        return [self.runs[0].times[s[0][0] : s[0][1]] if 0 in s else [] for s in self.spans]

    def moved(self) -> list[int]:
        return control_drift(self.control())[1] if self.runs[0].alive else []

    def kept_times(self, j: int) -> list[float]:
        drop = set(self.moved())
        return [t for r, s in enumerate(self.spans) if r not in drop and j in s for t in self.runs[j].times[s[j][0] : s[j][1]]]

    def drop(self, rounds: Sequence[int]) -> None:
        """Remove the steps of ``rounds`` from every run (before its summary), latest first so the spans hold."""
        for r in sorted(rounds, reverse=True):
            for j, (a, b) in self.spans[r].items():
                run = self.runs[j]
                del run.times[a:b]
                del run.compiled[a:b]


def measure_wave(
    workload: Workload,
    stage: str,
    baseline: Candidate,
    candidates: Sequence[Candidate],
    device: torch.device,
    *,
    incumbent: Candidate | None = None,
    settings: WaveSettings = DEFAULT_WAVES,
    seed: int = 0,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[str], None] = lambda what: None,
    flops: dict[str, dict[str, float]] | None = None,
    setup_s: Callable[[Candidate], float] | None = None,
    unresolved: Callable[[dict[Candidate, list[float]]], bool] | None = None,
    max_rounds: int | None = None,
    end: float | None = None,
    step_s: float | None = None,
    member_s: float | None = None,
) -> list[Trial]:
    """Train ``baseline``, ``incumbent`` (the configuration the candidates vary, when it is not the baseline) and
    each of ``candidates`` interleaved (see the module's docstring); one :class:`Trial` each, the baseline's last,
    every one holding the baseline's step times of this wave.

    ``step_s`` and ``member_s``: a step's and a member's setup's expected seconds, what admission counts (default:
    the control's own memory steps, the tracker's overhead included). ``deadline`` (on ``clock``): no member starts
    its setup after it, and no round past the wave's ``rounds``
    starts unless it fits before it. ``end`` (the budget's end, at or after ``deadline``): no step of any round
    starts after it, so the rounds the wave needs may use the time between; an incomplete round is dropped. A member
    left with fewer timed steps than an interval needs is ``cut``. ``setup_s(c)``: the seconds ``c``'s compiles are expected to take (its
    admission counts them). ``unresolved(times)``: given each member's kept step times so far, whether another
    round would help tell them apart. Ctrl-C during the rounds raises :class:`WaveInterrupted` holding the trials
    so far. ``flops``: when given, each trial's step FLOPs are counted (an eager run's in its memory step, a
    compiled one's on its eager twin) and kept there by :func:`~ampkit.tuning._mfu.flops_key`.
    """
    others = ([incumbent] if incumbent is not None and incumbent != baseline else []) + list(candidates)
    wave = [baseline] + [c for c in dict.fromkeys(others) if c != baseline]
    unbuilt: dict[Candidate, str] = {}
    for c in wave[1:]:  # a candidate the data cannot be cut for is its row's finding (the baseline's raises)
        try:
            micro_workload(workload, c)
        except ValueError as exc:
            unbuilt[c] = str(exc)
    wave = [c for c in wave if c not in unbuilt]
    runs = [make_run(workload, c, device, seed, settings.steps) for c in wave]
    late: dict[int, str] = {}
    past = "the budget ended the wave before this configuration's trial started"

    def too_late(i: int) -> bool:
        if i not in late and deadline is not None and clock() > deadline:
            late[i] = past
        return i in late

    # 1. Alone, for memory (and a compiled member's compile), each admitted only if its trial fits.
    pace: float | None = None  # seconds per step, from the control's own steps measured alone
    admitted = 0
    for i, (run, c) in enumerate(zip(runs, wave)):
        if too_late(i):
            continue
        if i > 0 and deadline is not None and pace is not None:
            compile_s = setup_s(c) if setup_s is not None else 0.0
            step, setup = (step_s, member_s or 0.0) if step_s is not None else (pace, settings.measure_steps * pace)
            need = setup + (admitted + 1) * (settings.warmup + settings.rounds * settings.chunk) * step + compile_s
            if clock() + need > deadline:
                late[i] = f"no time left in the wave for its trial (about {need:.0f} s with its setup)"
                continue
        phase = "measuring memory" + (" and compiling" if c.compile is not None else "")
        progress(f"{stage}: {c.describe(baseline)}: {phase}")
        counting = flops is not None and c.compile is None and flops_key(c) not in flops
        began = clock()
        _guarded(run, c, "measuring memory", run.measure_alone, settings.measure_steps, counting)
        if i == 0:
            pace = max(1e-6, (clock() - began) / max(1, settings.measure_steps))
        admitted += 1
        if flops is not None and run.result.flops_by_format:
            flops.setdefault(flops_key(c), dict(run.result.flops_by_format))
    for i, (run, c) in enumerate(zip(runs, wave)):  # a compiled run's FLOPs: its eager twin's (its own step would trace again)
        if flops is not None and run.alive and flops_key(c) not in flops and i not in late and not (deadline is not None and clock() > deadline):
            progress(f"{stage}: {c.describe(baseline)}: counting FLOPs")
            flops[flops_key(c)] = step_flops(workload, c, device, seed)
    # 2. Built and warmed up, untimed.
    warm_s: dict[int, float] = {}
    compiling: set[int] = set()
    for i, (run, c) in enumerate(zip(runs, wave)):
        # Past the deadline a member that compiles does not start (its warm-up compiles again); one that does not is
        # a few steps from its rounds, which may run until the budget's end: cutting it would leave them empty.
        if i in late or (dear(c) and too_late(i)) or (end is not None and clock() > end and too_late(i)):
            continue
        began = time.perf_counter()
        _guarded(run, c, "building", run.build)
        phase = compile_phase(run.engine) if run.alive and run.engine is not None else None
        if phase is not None:
            compiling.add(i)
        progress(f"{stage}: {c.describe(baseline)}: {'warm-up, ' + phase if phase else 'warm-up'}")
        _guarded(run, c, "warming up", run.train, settings.warmup, False)
        warm_s[i] = time.perf_counter() - began
    # 3. Timed, in rotating rounds; disturbed rounds dropped and measured again; more while unresolved.
    members = [i for i in range(len(wave)) if i not in late]
    rounds = _Rounds(runs)
    most = max(settings.rounds, max_rounds if max_rounds is not None else MAX_ROUNDS_FACTOR * settings.rounds)
    interrupted, last_round_s = False, 0.0
    try:
        last = end if end is not None else deadline
        while len(rounds.spans) < most and members:
            now = clock()
            kept = len(rounds.spans) - len(rounds.moved())
            if last is not None and now > last or kept >= settings.rounds and deadline is not None and now > deadline:
                log.info("tune: the budget ended the %s wave after %d rounds", stage, len(rounds.spans))
                break
            if kept >= settings.rounds:
                # Only rounds that can change the answer, and that fit: the last round's length is the next one's.
                if unresolved is None or not unresolved({wave[j]: rounds.kept_times(j) for j in members if runs[j].alive}):
                    break
                if deadline is not None and now + last_round_s > deadline:
                    break
            r = len(rounds.spans)
            began = clock()
            progress(f"{stage}: timing, round {r + 1} of {settings.rounds}+ ({len(members)} configurations side by side)")
            if not rounds.run(r, members, wave, settings.chunk, lambda: end is not None and clock() > end):
                log.info("tune: the budget's end stopped the %s wave in round %d (the round is dropped)", stage, r + 1)
                break
            last_round_s = clock() - began
    except KeyboardInterrupt:
        interrupted = True  # the rounds so far are kept: summarised below, then the interrupt goes on
    moved = rounds.moved()
    disturbed = bool(moved) and len(rounds.spans) - len(moved) < settings.rounds
    if moved:
        drift = control_drift(rounds.control())[0]
        log.info("tune: %s wave: %d of %d rounds dropped, the control moved up to %.2fx%s", stage, len(moved), len(rounds.spans), drift,
                 " (not replaced: the wave is disturbed)" if disturbed else "")
    rounds.drop(moved)
    kept_rounds = len(rounds.spans) - len(moved)
    trials = []
    for i, (run, c) in enumerate(zip(runs, wave)):
        role = "baseline" if i == 0 else "incumbent" if c == incumbent else "candidate"
        if i in late:
            run.release()
            # A compile measured alone before the deadline passed is kept: the budget's estimates learn from it.
            trials.append(Trial(key=c.key, stage=stage, candidate=c.to_dict(), role=role, status="cut", compile_s=run.result.compile_time_s,
                                error=late[i]))
            continue
        _guarded(run, c, "summarising", run.summarize)
        run.release()
        res = run.result
        status = {"failed": "failed", "unsupported": "failed"}.get(res.status, "ok")
        times = list(res.step_times_s or [])
        compile_s = res.compile_time_s
        if compile_s is None and i in compiling and times:
            # An eager run whose engine compiles its optimizer step (bf16-true-sr's library step, the fused master
            # step) compiles in its warm-up, outside the steps measured alone: its warm-up less as many steady steps.
            compile_s = max(0.0, warm_s[i] - settings.warmup * statistics.median(times))
        trials.append(Trial(
            key=c.key, stage=stage, candidate=c.to_dict(), role=role, status=status, error=res.error, step_times_s=times,
            compile_s=compile_s, peak_memory_bytes=res.peak_memory_bytes, flops_by_format=dict((flops or {}).get(flops_key(c), {})),
            rounds=kept_rounds, dropped_rounds=len(moved), disturbed=disturbed,
        ))
    trials += [Trial(key=c.key, stage=stage, candidate=c.to_dict(), status="failed", error=why) for c, why in unbuilt.items()]
    base_times = trials[0].step_times_s
    for t in trials:
        t.baseline_times_s = list(base_times)
        if t.status == "ok" and (t.interval(1) is None):
            t.status = "cut"  # too few timed steps for an interval: the budget ended the wave early
    trials = trials[1:] + trials[:1]
    if interrupted:
        raise WaveInterrupted(trials)
    return trials


class WaveInterrupted(KeyboardInterrupt):
    """Ctrl-C during a wave's rounds: ``trials`` hold what the rounds before it measured (``cut`` where too few)."""

    def __init__(self, trials: list[Trial]) -> None:
        super().__init__()
        self.trials = trials
