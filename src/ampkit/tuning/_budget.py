"""The wall clock of a tune: its deadline, and what the remaining work is estimated to cost.

Steps are estimated from the start's probe (and, once a wave has run, scaled by how much longer waves took than
estimated: a busy machine slows them all); compiles from the model's size (:class:`CompileSizes`), calibrated by
each compile measured. A compile cannot be stopped once started, so its estimate errs long.

    >>> budget = Budget(60.0, lambda: 0.0, "cpu"); budget.step_s = 0.05
    >>> budget.left, round(budget.steps_s(20), 2)
    (60.0, 1.0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..memory import repeated_blocks
from ..policy import get_policy
from ..training._regions import shape_groups
from ._space import Candidate

__all__ = ["COMPILE_MIN_S", "COMPILE_S_PER_MODULE", "COMPILE_S_PER_PARAMETER", "RECOMPILE_SHARE", "UNMEASURED_MARGIN", "Budget",
           "CompileSizes", "compiled_step", "dear"]


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


class Budget:
    """The wall clock of a tune: its deadline, and estimates of what the remaining work costs.

    A compile's cost is estimated from the sizes it scales with (:class:`CompileSizes`, at
    :data:`COMPILE_S_PER_MODULE` and :data:`COMPILE_S_PER_PARAMETER`), times a **scale** that the trials calibrate:
    each measured compile sets it to the largest ratio of measured to estimated seen so far, so one slow compile
    makes every later estimate as pessimistic (a compile cannot be stopped once started)."""

    def __init__(self, seconds: float, clock: Callable[[], float], device: str) -> None:
        self.clock, self.start, self.seconds, self.device = clock, clock(), seconds, device
        self.step_s = 0.0
        self.member_s = 0.0
        """What one member of a wave costs before its steps count: its memory measured alone (under the tracker)
        and its build, measured by the probe. Not a step's worth: on digits-aug 1.1 s against a 50 ms step."""
        self.sizes = CompileSizes()
        self.scale: float | None = None
        """Measured compile time over estimated, the largest seen; None until a compile is measured (then the
        estimate carries :data:`UNMEASURED_MARGIN`)."""
        self.work_scale = 1.0
        """A wave's measured wall time over its estimate (its members' setup and steps at their own medians), the
        largest seen, at least 1: what the estimates of later steps are multiplied by."""

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
        return self.member_s + self.steps_s(steps) + self.compile_s(c) * (1 + RECOMPILE_SHARE)

    def guard_s(self, c: Candidate, steps: int) -> float:
        return self.steps_s(steps) + self.compile_s(c) * RECOMPILE_SHARE


def dear(c: Candidate) -> bool:
    """Whether ``c``'s trial must compile (the model, or its optimizer step): such a trial costs seconds to minutes
    before its first timed step, and runs only after every cheap candidate has had its turn.

    >>> dear(Candidate(policy="bf16-mixed", micro_batch=8, accumulate=1)), dear(Candidate(policy="bf16-true-sr", micro_batch=8, accumulate=1))
    (False, True)
    """
    return c.compile is not None or compiled_step(c)
