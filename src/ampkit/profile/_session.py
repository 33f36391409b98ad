"""Profile the user's own training loop: join its engine, time its steps phase by phase, find its host syncs and
take a short torch.profiler trace, each in its own window of steps so one measurement does not distort another.

The steps of a profiled loop fall into consecutive windows. A step is an optimizer step: with
``Engine(accumulate=4)`` each is 4 batches, so a loader fed through :meth:`Profiler.batches` needs
``(warmup + plain_steps + timed) * 4`` batches to time the phases, and one with a length too short is refused
before its first step.

1. ``warmup`` steps: not measured (kernel choice, allocator growth, optimizer state, compilation);
2. ``plain_steps`` steps: only each step's end is stamped, the loop's plain step time, which the other windows'
   are read against (the profiler's own overhead);
3. ``timed`` steps: phases timed by a :class:`~ampkit.profile.PhaseTimer` and nothing else, so the times
   are the loop's own;
4. ``sync_steps`` steps: every read of device values back to the host is counted at the user's line
   (:class:`~ampkit.profile.SyncFinder`; on CUDA through ``torch.cuda.set_sync_debug_mode``);
5. ``trace_steps`` steps under ``torch.profiler``: the casts' share, the optimizer's ops, the device's idle time,
   and a Chrome trace.

Every window's median step time is kept, so the cost of each measurement (the profiler's own overhead) is read
against the plain window's. Steps beyond the last window run unobserved, and nothing of them is kept.

Below, the one read per step is the loop's ``loss.item()``: the SGD is fused, so the engine skips a non-finite step
on the device; a plain SGD would add the engine's own read of its flag, counted at ``engine.step()``.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit import Engine
    >>> engine = Engine()
    >>> model = nn.Linear(8, 1); model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, fused=True))
    >>> batches = [torch.ones(4, 8)] * 14
    >>> with Profiler(engine, warmup=2, plain_steps=2, timed=4, sync_steps=2, trace_steps=2) as profiler:
    ...     for x in profiler.batches(batches):
    ...         with engine.autocast():
    ...             loss = model(x).sum()
    ...         engine.backward(loss); _ = engine.step()
    ...         seen = loss.item()
    >>> result = profiler.result()
    >>> result["syncs"]["per_step"], len(result["per_step"]), sorted(result["overhead"])[:2]
    (1.0, 4, ['plain_step_s', 'profiled_step_s'])
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._util.cpu_load import CpuMeter, Load
from ..training._hooks import StepHook
from ..workloads._timing import summarize
from ._advice import advise
from ._disturbed import load_record
from ._idle import device_idle
from ._op_shares import PhaseRanges, op_breakdown
from ._phases import PHASES, PhaseTimer
from ._syncs import SyncFinder
from ._trials import Trial

if TYPE_CHECKING:
    from typing_extensions import Self

    from ..training._engine import Engine

__all__ = ["WINDOWS", "Profiler"]

WINDOWS = ("warmup", "plain", "timed", "syncs", "trace")
"""The profiler's windows of steps, in order."""


class Profiler(StepHook):
    """Profiles the loop of ``engine`` (see the module's docstring): use as a context around the loop, read its
    batches through :meth:`batches`, then call :meth:`result`.

    ``trace_dir``: where the Chrome trace of the trace window is written (``trace.json``); None: not written.
    """

    def __init__(
        self, engine: Engine, *, warmup: int = 3, plain_steps: int = 10, timed: int = 20, sync_steps: int = 5,
        trace_steps: int = 3, trace_dir: str | Path | None = None,
    ) -> None:
        if warmup < 1 or timed < 1 or min(plain_steps, sync_steps, trace_steps) < 0:
            raise ValueError(
                f"Profiler(warmup={warmup}, plain_steps={plain_steps}, timed={timed}, sync_steps={sync_steps}, trace_steps={trace_steps}): "
                "the phases need warmup >= 1 and timed >= 1; the other windows >= 0."
            )
        self.engine = engine
        self.sizes = {"warmup": warmup, "plain": plain_steps, "timed": timed, "syncs": sync_steps, "trace": trace_steps}
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self.timer = PhaseTimer()
        self.timer.pause()  # it times the timed window only
        self.syncs = SyncFinder(engine.device)
        self._ranges = PhaseRanges()
        self._torch_profile: torch.profiler.profile | None = None
        self._trace_start: float | None = None  # perf_counter at the torch profile's start
        self._step_ends: list[float] = []
        self._window: str | None = None
        self._seen = 0
        self._fed = False  # whether the loop reads its batches through batches()
        self._breakdown: Any = None
        self._idle: Any = None
        self._trace_path: Path | None = None
        # The machine's load over the windows, as ampkit tune reads it: the loop's own loader workers are its own.
        self._meter = CpuMeter(children=True)
        self._load: Load | None = None
        engine.add_hook(self)

    # -- windows ------------------------------------------------------------------------------------
    def _window_of(self, step: int) -> str | None:
        """The window step ``step`` (0-based, counted from entering the context) falls in."""
        end = 0
        for name in WINDOWS:
            end += self.sizes[name]
            if step < end:
                return name
        return None

    def __enter__(self) -> Self:
        self._seen, self._step_ends, self._window = 0, [time.perf_counter()], None
        self._meter.mark()
        self._switch(self._window_of(0))
        return self

    def __exit__(self, *exc: object) -> None:
        self._switch(None)
        self._load = self._meter.read()

    def _switch(self, window: str | None) -> None:
        if window == self._window:
            return
        if self._window == "timed":
            self.timer.pause()
        elif self._window == "syncs":
            self.syncs.__exit__(None, None, None)
        elif self._window == "trace":
            self._stop_trace()
        self._window = window
        if window == "timed":
            self.timer.resume(self.engine.device)
        elif window == "syncs":
            self.syncs.__enter__()
        elif window == "trace":
            self._start_trace()

    def _start_trace(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.engine.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # One profile per window, one cycle each: acc_events only keeps torch 2.11 from warning at its first cycle.
        self._torch_profile = torch.profiler.profile(activities=activities, record_shapes=True, acc_events=True)
        self._torch_profile.start()
        self._trace_start = time.perf_counter()

    def _stop_trace(self) -> None:
        prof = self._torch_profile
        if prof is None or self._trace_start is None:
            return
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)  # once, at the window's end: its kernels belong to it
        elapsed_us = (time.perf_counter() - self._trace_start) * 1e6
        prof.stop()
        steps = self._steps_in("trace")
        if steps:
            self._breakdown = op_breakdown(prof)
            # The events' times count from the profile's start, in microseconds.
            self._idle = device_idle(prof, steps=steps, start_us=0.0, end_us=elapsed_us)
        if self.trace_dir is not None:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            self._trace_path = self.trace_dir / "trace.json"
            prof.export_chrome_trace(str(self._trace_path))
        self._torch_profile = None

    @property
    def window(self) -> str | None:
        """The window the step under way falls in (one of :data:`WINDOWS`); None outside them."""
        return self._window

    # -- the hook side --------------------------------------------------------------------------------
    def wrap_forward(self, engine: Engine, forward: Any) -> Any:
        forward = self._ranges.wrap_forward(engine, forward) if self._window == "trace" else forward
        return self.timer.wrap_forward(engine, forward)

    def before_backward(self, engine: Engine, loss: torch.Tensor) -> None:
        self.timer.before_backward(engine, loss)
        if self._window == "trace":
            self._ranges.before_backward(engine, loss)

    def after_backward(self, engine: Engine) -> None:
        if self._window == "trace":
            self._ranges.after_backward(engine)
        self.timer.after_backward(engine)

    def before_optimizer_step(self, engine: Engine) -> None:
        self.timer.before_optimizer_step(engine)
        if self._window == "trace":
            self._ranges.before_optimizer_step(engine)

    def after_optimizer_step(self, engine: Engine) -> None:
        if self._window == "trace":
            self._ranges.after_optimizer_step(engine)
        self.timer.after_optimizer_step(engine)
        if self._window is None:
            return  # past the last window (or outside the block): nothing more is kept
        self._step_ends.append(time.perf_counter())
        self._seen += 1
        if not self._fed:
            self._switch(self._window_of(self._seen))
        # Otherwise the switch waits for the next batch's fetch: what the loop does after engine.step() (logging
        # the loss, say) belongs to the step it follows, and its window.

    # -- the loop side -------------------------------------------------------------------------------
    def batches(self, loader: Iterable[Any], *, non_blocking: bool = False, channels_last: bool = False) -> Iterator[Any]:
        """``loader``'s batches on the engine's device, the wait for each timed as ``data`` and its copy as ``copy``.

        A loop fed through here has its windows begin and end between its steps, as it fetches the next batch.
        A ``loader`` with a length too short to time the phases (the windows count optimizer steps, each of
        ``engine.accumulate`` batches) is refused here, before its first step."""
        self._check_length(loader)
        self._fed = True
        return self.timer.batches(self._switching(loader), self.engine.device, non_blocking=non_blocking, channels_last=channels_last)

    def _check_length(self, loader: Iterable[Any]) -> None:
        try:
            given = len(loader)  # type: ignore[arg-type]
        except TypeError:  # an iterator, an iterable dataset: known short only when it ends (result() says so)
            return
        accumulate = self.engine.accumulate
        pending = self.engine.micro_batches_pending

        def batches_for(windows: Sequence[str]) -> int:  # the steps still to run through ``windows``, in batches
            return max(0, sum(self.sizes[w] for w in windows) - self._seen) * accumulate - pending

        phases = batches_for(WINDOWS[:3])  # warm-up, plain and timed: the phase table
        every = batches_for(WINDOWS)
        if given >= phases:
            return  # the sync and trace windows may run short: result() reports the steps they got
        sizes = " + ".join(f"{w} {self.sizes[w]}" for w in WINDOWS[:3])
        raise ValueError(
            f"Profiler counts optimizer steps, each of accumulate={accumulate} batches: {sizes} steps need {phases} "
            f"batches to time the phases ({every} batches with the sync and trace windows), and the loader gives {given}. "
            f"Feed it more (several epochs as one: profiler.batches(itertools.chain.from_iterable(itertools.repeat(loader, "
            f"{-(-every // given) if given else 1})))), or make the windows smaller "
            f"(Profiler(engine, warmup=..., plain_steps=..., timed=...))."
        )

    def _switching(self, loader: Iterable[Any]) -> Iterator[Any]:
        batches = iter(loader)
        while True:
            if self._window is not None:
                self._switch(self._window_of(self._seen))  # before the fetch: a traced step's wait for data is traced
            try:
                batch = next(batches)
            except StopIteration:
                return
            yield batch

    # -- the reading side ----------------------------------------------------------------------------
    def _steps_in(self, window: str) -> int:
        first = sum(self.sizes[w] for w in WINDOWS[: WINDOWS.index(window)])
        return max(0, min(self._seen - first, self.sizes[window]))

    def _window_step_times(self, window: str) -> list[float]:
        first = sum(self.sizes[w] for w in WINDOWS[: WINDOWS.index(window)])
        ends = self._step_ends[first : first + self._steps_in(window) + 1]
        return [b - a for a, b in itertools.pairwise(ends)]

    def result(self, *, trials: Sequence[Trial] = ()) -> dict[str, Any]:
        """What the windows measured, with ``trials`` (:func:`~ampkit.profile.try_loader_settings` on this
        loop's loader and step) and the advice, as the ``profile.json`` dict that
        :func:`~ampkit.profile.save_profile` writes (:func:`~ampkit.profile.profile_workload` adds what
        the command knows besides: the workload and the machine)."""
        if self._window is not None:
            raise RuntimeError("Profiler.result() reads a finished profile: call it after the `with Profiler(...)` block.")
        per_step = self.timer.steps(device_time=self.engine.device.type == "cuda") if self._steps_in("timed") else []
        if not per_step:
            first = self.sizes["warmup"] + self.sizes["plain"] + 1
            raise ValueError(
                f"the loop ran {self._seen} optimizer steps: the phases are timed from step {first} on; run more steps, "
                "or lower warmup and plain_steps."
            )
        rows = [{**s.phases, "total": s.total} for s in per_step]
        totals = [r["total"] for r in rows]
        medians = {p: statistics.median(r[p] for r in rows) for p in PHASES}
        # Shares of the typical step, so they agree with the medians shown beside them (a sum over steps would
        # let one slow step, a collection or a neighbour's burst on a shared machine, set every share).
        phases = {p: {"median_s": m, "share": _share(m, sum(medians.values()))} for p, m in medians.items()}
        syncs_steps = self._steps_in("syncs")
        overhead: dict[str, Any] = {}
        for window, key in (("plain", "plain_step_s"), ("timed", "profiled_step_s"), ("syncs", "sync_step_s"), ("trace", "trace_step_s")):
            times = self._window_step_times(window)
            overhead[key] = statistics.median(times) if times else None
        plain = overhead["plain_step_s"]
        overhead["ratio"] = overhead["profiled_step_s"] / plain if plain else None
        b = self._breakdown
        data: dict[str, Any] = {
            "device": str(self.engine.device),
            "precision": self.engine.policy.name,
            "compile": _compile_mode(self.engine),
            "accumulate": self.engine.accumulate,  # batches per step: every step counted here is an optimizer step
            "steps": len(rows),
            "step_s": summarize(totals),
            "phases": phases,
            "per_step": rows,
            "device_idle": self._idle.to_dict() if self._idle is not None else None,
            "syncs": {
                "steps": syncs_steps,
                "per_step": self.syncs.total / syncs_steps if syncs_steps else None,
                "sites": [
                    {"where": s.where, "op": s.op, "count": s.count, "per_step": s.count / syncs_steps, "code": s.code,
                     "via": s.via, "via_code": s.via_code}
                    for s in self.syncs.sites()
                ] if syncs_steps else [],
            },
            "ops": None if b is None else {
                "cast_share": b.cast_share, "casts_per_step": b.casts / b.steps if b.steps else 0.0,
                "optimizer_ops_per_step": b.optimizer_ops_per_step,
                "optimizer_share": _share(b.optimizer_op_s, sum(b.phase_s.values())), "host_share": b.host_share, "steps": b.steps,
            },
            "overhead": overhead,
            "trace": self._trace_path.name if self._trace_path is not None else None,
            "parameter_tensors": sum(1 for m in self.engine.models for q in m.parameters() if q.requires_grad),
            "trials": [t.to_dict() for t in trials],
            # How busy the machine was meanwhile (None: not read); profile_workload adds the trials' own.
            "machine": {"steps": load_record(self._load) if self._load is not None else None, "trials": None},
        }
        data["advice"] = advise(data)
        return data


def _compile_mode(engine: Engine) -> bool | str:
    """False for an eager loop, ``"regional"`` when the engine compiled each repeated block, else True."""
    if not engine.compiled:
        return False
    plan = engine.compile_plan
    return "regional" if plan is not None and plan.regional else True


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0
