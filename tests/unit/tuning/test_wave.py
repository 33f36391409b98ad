"""A wave: every member timed beside the control in the same rounds; the deadline stops it between rounds and keeps
members from starting; a round whose control drifted is dropped and measured again; more rounds while unresolved."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest
import torch

from ampkit.tuning import Candidate, WaveSettings
from ampkit.tuning._trials import PolicyRun, threads
from ampkit.tuning._wave import WaveInterrupted, measure_wave
from ampkit.workloads import Workload

ROWS = 8  # the mlp fixture's rows (tests/unit/tuning/conftest.py)


def test_a_wave_times_every_candidate_beside_the_baseline_in_the_same_rounds(mlp: Workload, device: torch.device) -> None:
    w = mlp
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    other = dataclasses.replace(start, micro_batch=ROWS // 2, accumulate=2)
    settings = WaveSettings(rounds=2, chunk=3, warmup=1)
    trials = measure_wave(w, "micro_batch", start, [other], device, settings=settings)
    assert [(t.key, t.role, t.status) for t in trials] == [(other.key, "candidate", "ok"), (start.key, "baseline", "ok")]
    assert len(trials[0].step_times_s) == 6 and trials[0].baseline_times_s == trials[1].step_times_s
    assert trials[0].compile_s is None and trials[1].peak_memory_bytes is not None


def test_the_budget_ends_a_wave_between_rounds_and_marks_what_it_cut(mlp: Workload, device: torch.device) -> None:
    w = mlp
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    said: list[str] = []
    trials = measure_wave(w, "threads", start, [dataclasses.replace(start, threads=1)], device,
                          settings=WaveSettings(rounds=3, chunk=3, warmup=1), deadline=0.5, progress=said.append,
                          clock=lambda: 1.0 if any("round 1 of" in s for s in said) else 0.0)
    # The clock passes the deadline once the first round has begun: the second never starts. 3 timed steps each, too few.
    assert [len(t.step_times_s) for t in trials] == [3, 3] and {t.status for t in trials} == {"cut"}


def test_no_candidate_starts_measuring_or_warming_up_after_the_deadline(mlp: Workload, device: torch.device) -> None:
    # A compile cannot be stopped once started: the budget must stop the next candidate before it starts. The clock
    # passes the deadline after the baseline's memory step: the candidate never runs, and is cut with its reason.
    w = mlp
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    later = dataclasses.replace(start, threads=1)
    ticks = iter([0.0, 10.0])
    trials = measure_wave(w, "threads", start, [later], device, settings=WaveSettings(rounds=2, chunk=3, warmup=1),
                          deadline=5.0, clock=lambda: next(ticks, 10.0))
    cut = next(t for t in trials if t.key == later.key)
    assert cut.status == "cut" and cut.step_times_s == [] and cut.peak_memory_bytes is None
    assert cut.error == "the budget ended the wave before this configuration's trial started"


def test_an_eager_run_that_compiles_its_optimizer_step_gets_its_warm_ups_excess_as_compile_time(mlp: Workload, 
    device: torch.device, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bf16-true-sr's library step and the fused master step compile in the warm-up, not in the steps measured
    # alone (those run eagerly): the warm-up less as many steady steps is their compile time. Here a 0.5 s sleep in
    # the candidate's first step stands for the compile.
    import time

    import ampkit.tuning._wave as trials_module

    w = mlp
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    other = dataclasses.replace(start, threads=1)
    monkeypatch.setattr(trials_module, "compile_phase", lambda engine: "compiling the optimizer step")  # both "compile"
    real_train = trials_module.PolicyRun.train
    slept = []

    def train(self: object, steps: int, timed: bool, stop: Callable[[], bool] | None = None) -> None:
        if not timed and torch.get_num_threads() == 1 and not slept:
            slept.append(time.sleep(0.5))
        real_train(self, steps, timed, stop)  # type: ignore[arg-type]

    monkeypatch.setattr(trials_module.PolicyRun, "train", train)
    with threads(2):  # the baseline runs at 2 threads, the candidate at 1: only the candidate's warm-up sleeps
        result = measure_wave(w, "threads", start, [other], device, settings=WaveSettings(rounds=2, chunk=3, warmup=1))
    by_key = {t.key: t for t in result}
    assert 0.0 <= (by_key[start.key].compile_s or 0.0) < 0.3
    assert 0.5 <= (by_key[other.key].compile_s or 0.0) < 1.5


def test_a_candidate_that_fails_is_its_rows_finding_and_the_wave_goes_on(mlp: Workload, device: torch.device) -> None:
    w = mlp
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    broken = dataclasses.replace(start, fused_step=True)  # 32-true keeps no masters: Engine(fused_step=True) refuses
    trials = measure_wave(w, "fused_step", start, [broken], device, settings=WaveSettings(rounds=2, chunk=3, warmup=1))
    assert trials[0].status == "failed" and "fused_step" in (trials[0].error or "")
    assert trials[1].status == "ok" and len(trials[1].step_times_s) == 6


def test_ctrl_c_in_the_rounds_keeps_the_rounds_already_measured(mlp: Workload, device: torch.device) -> None:
    w = mlp
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    said: list[str] = []

    def clock() -> float:  # read before each candidate starts and at each round's start: the second round is interrupted
        if any("round 1 of" in s for s in said):
            raise KeyboardInterrupt
        return 0.0

    with pytest.raises(WaveInterrupted) as stopped:
        measure_wave(w, "threads", start, [dataclasses.replace(start, threads=1)], device,
                     settings=WaveSettings(rounds=3, chunk=3, warmup=1), deadline=1.0, clock=clock, progress=said.append)
    assert [(t.role, len(t.step_times_s), t.status) for t in stopped.value.trials] == [("candidate", 3, "cut"), ("baseline", 3, "cut")]


def test_micro_batches_of_uneven_batches_are_refused_as_their_rows_finding(mlp: Workload, device: torch.device) -> None:
    # Cut in the same slices, a short last batch would give a short micro-batch whose mean loss weighs as much as a
    # full one's: another step than the user's. The candidate fails with the reason; the wave goes on.
    w = mlp
    x, y = w.train_batches[-1]
    w.train_batches[-1] = (x[:5], y[:5])
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    halves = dataclasses.replace(start, micro_batch=ROWS // 2, accumulate=2)
    trials = measure_wave(w, "micro_batch", start, [halves], device, settings=WaveSettings(rounds=2, chunk=3, warmup=1))
    failed = next(t for t in trials if t.key == halves.key)
    assert failed.status == "failed" and failed.error == (
        "micro-batches need every batch to have 8 rows, as the first; some have 5 (drop the last, short batch: DataLoader(..., drop_last=True))."
    )
    assert next(t for t in trials if t.role == "baseline").status == "ok"




START = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
OTHER = dataclasses.replace(START, threads=1)


def _scripted(monkeypatch: pytest.MonkeyPatch, control: Iterator[float], other: float = 0.05) -> list[str]:
    """Timed steps take what the script says (the control's, step by step, from ``control``; the other member's
    ``other``): the wave's logic is tested on known times. Returns a list to collect the progress said in."""
    real = PolicyRun.train

    def train(self: PolicyRun, steps: int, timed: bool, stop: Callable[[], bool] | None = None) -> None:
        before = len(self.times)
        real(self, steps, timed, stop)
        ran = len(self.times) - before
        if timed and ran:
            self.times[-ran:] = [next(control) if torch.get_num_threads() != 1 else other for _ in range(ran)]

    monkeypatch.setattr(PolicyRun, "train", train)
    return []


def test_a_round_whose_control_drifted_is_dropped_and_measured_again(mlp: Workload, device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    # The control runs 0.10 s a step but 0.50 s in its second round (a job started beside it, then stopped): that
    # round's steps, every member's, are dropped and a round measured in its place, so the wave still rests on 3.
    said = _scripted(monkeypatch, iter([v for v in (0.10, 0.50, 0.10, 0.10, 0.10, 0.10) for _ in range(2)]))
    with threads(2):
        trials = measure_wave(mlp, "threads", START, [OTHER], device, settings=WaveSettings(rounds=3, chunk=2, warmup=1),
                              progress=said.append)
    control = next(t for t in trials if t.role == "baseline")
    assert [(t.rounds, t.dropped_rounds, t.disturbed) for t in trials] == [(3, 1, False)] * 2
    assert control.step_times_s == [0.10] * 6 and len(trials[0].step_times_s) == 6
    assert sum("timing, round" in s for s in said) == 4


def test_a_control_that_never_holds_still_marks_the_wave_disturbed(mlp: Workload, device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each round twice as slow as the last (a machine filling up): at most one round is ever typical, so the wave
    # runs its most rounds and still rests on fewer than it needs.
    _scripted(monkeypatch, iter([0.1 * 2**i for i in range(10) for _ in range(2)]))
    with threads(2):
        trials = measure_wave(mlp, "threads", START, [OTHER], device, settings=WaveSettings(rounds=3, chunk=2, warmup=1),
                              max_rounds=6)
    assert all(t.disturbed for t in trials) and trials[0].rounds + trials[0].dropped_rounds == 6


def test_more_rounds_run_while_unresolved_and_only_while_they_fit(mlp: Workload, device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, iter([0.10] * 50))
    asked: list[int] = []

    def unresolved(times: dict[Candidate, list[float]]) -> bool:
        asked.append(len(times[START]))
        return True  # never settled: the wave stops at its most rounds

    with threads(2):
        trials = measure_wave(mlp, "threads", START, [OTHER], device, settings=WaveSettings(rounds=2, chunk=2, warmup=1),
                              unresolved=unresolved, max_rounds=5)
    assert trials[0].rounds == 5 and asked == [4, 6, 8]
    # With a deadline, a round past the minimum starts only if the last round's length fits before it: each timed
    # step takes a second, a round four (two members, two steps); rounds 1-2 end at 8 s, round 3 (8 + 4 <= 14.5) at
    # 12 s, round 4 would end at 16 s: not started.
    now = [0.0]
    scripted = PolicyRun.train

    def train(self: PolicyRun, steps: int, timed: bool, stop: Callable[[], bool] | None = None) -> None:
        scripted(self, steps, timed, stop)
        now[0] += float(steps) if timed else 0.0

    monkeypatch.setattr(PolicyRun, "train", train)
    with threads(2):
        trials = measure_wave(mlp, "threads", START, [OTHER], device, settings=WaveSettings(rounds=2, chunk=2, warmup=1),
                              unresolved=lambda times: True, max_rounds=5, deadline=14.5, clock=lambda: now[0])
    assert trials[0].rounds == 3 and now[0] == 12.0


def test_a_member_whose_trial_cannot_fit_is_cut_before_it_starts_and_the_rest_are_timed(mlp: Workload, 
    device: torch.device, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The second candidate's compile is estimated at 100 s with 10 s left: it never starts (a compile cannot be
    # stopped); the control and the first candidate get every round.
    dear = dataclasses.replace(START, threads=1, compile="model")
    now = [0.0]
    trials = measure_wave(mlp, "compile", START, [OTHER, dear], device, settings=WaveSettings(rounds=3, chunk=2, warmup=1),
                          deadline=10.0, clock=lambda: now[0], setup_s=lambda c: 100.0 if c.compile else 0.0)
    by = {t.key: t for t in trials}
    assert by[dear.key].status == "cut" and by[dear.key].error.startswith("no time left in the wave for its trial")
    assert by[OTHER.key].status == "ok" and by[START.key].status == "ok" and len(by[OTHER.key].step_times_s) == 6


def test_the_rounds_a_wave_needs_may_run_past_its_deadline_but_no_step_starts_past_the_budgets_end(mlp: Workload, 
    device: torch.device, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The warm-ups (a compile that took longer than estimated, say) used the wave's time up to its deadline (10 s):
    # the rounds it needs still run past it, up to the budget's end (13.2 s), one step at a time; the round the end
    # interrupts is dropped whole.
    _scripted(monkeypatch, iter([0.10] * 50))  # steady steps: no round dropped for drift
    now = [0.0]
    real = PolicyRun.train

    def train(self: PolicyRun, steps: int, timed: bool, stop: Callable[[], bool] | None = None) -> None:
        before = len(self.times)
        real(self, steps, timed, stop)
        now[0] += 0.5 * (len(self.times) - before) if timed else 5.0  # two warm-ups take us to 10 s; a timed step 0.5 s

    monkeypatch.setattr(PolicyRun, "train", train)
    trials = measure_wave(mlp, "compile", START, [OTHER], device, settings=WaveSettings(rounds=6, chunk=1, warmup=1),
                          deadline=10.0, end=13.2, clock=lambda: now[0])
    # Rounds of two 0.5 s steps from 10 s: three end at 13 s; the fourth's first step starts at 13.0 (not past the
    # end), its second would start at 13.5: that round is dropped. One step each per round: three steps, too few for
    # an interval, so both are cut, with the rounds they had.
    assert [t.rounds for t in trials] == [3, 3] and [len(t.step_times_s) for t in trials] == [3, 3]
    assert {t.status for t in trials} == {"cut"} and now[0] <= 13.2 + 0.5


def test_a_compile_that_overran_the_deadline_leaves_the_eager_members_their_rounds(mlp: Workload, 
    device: torch.device, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The every-row-cut wave: a member's compile (measured alone) ran past the wave's deadline. It does not
    # warm up (that compiles again); the control and the eager candidate do, and get their rounds until the budget's
    # end. (The dear member here is marked so, not compiled: the test is of the schedule.)
    import ampkit.tuning._wave as wave_module

    compiles = dataclasses.replace(START, threads=1)
    eager = dataclasses.replace(START, policy="bf16-mixed")
    monkeypatch.setattr(wave_module, "dear", lambda c: c == compiles)
    _scripted(monkeypatch, iter([0.10] * 100))
    now = [0.0]
    real_alone, real_train = PolicyRun.measure_alone, PolicyRun.train

    def measure_alone(self: PolicyRun, *args: object) -> None:
        real_alone(self, *args)  # type: ignore[arg-type]
        if torch.get_num_threads() == 1:
            now[0] = 11.0  # the compile passed the deadline

    def train(self: PolicyRun, steps: int, timed: bool, stop: Callable[[], bool] | None = None) -> None:
        real_train(self, steps, timed, stop)
        now[0] += 0.1 * steps

    monkeypatch.setattr(PolicyRun, "measure_alone", measure_alone)
    monkeypatch.setattr(PolicyRun, "train", train)
    with threads(2):
        trials = measure_wave(mlp, "compile", START, [eager, compiles], device, settings=WaveSettings(rounds=3, chunk=2, warmup=1),
                              deadline=10.0, end=30.0, clock=lambda: now[0])
    by = {t.key: t for t in trials}
    assert by[compiles.key].status == "cut" and by[compiles.key].error == "the budget ended the wave before this configuration's trial started"
    assert by[START.key].status == "ok" and by[eager.key].status == "ok" and by[eager.key].rounds == 3
