"""What the profiler sees inside a step's phases: the share of autocast's casts, and how many small ops the optimizer runs.

:class:`PhaseRanges` is a step hook that opens a ``torch.profiler.record_function`` range around each phase the
engine runs (``ampkit::forward``, ``ampkit::backward``, ``ampkit::optimizer``), so a ``torch.profiler.profile`` of
the loop can say which phase each op ran in. :func:`op_breakdown` reads such a profile:

* **casts**: the time of ``aten::_to_copy`` (what autocast and ``.to(dtype)`` dispatch) in the forward and backward,
  against those phases' time: the work a 16-bit-weights policy or ``torch.compile`` would remove or fuse;
* **optimizer ops**: the ops the optimizer step dispatches per step, and their mean time: a per-parameter loop
  (``foreach=False``) runs one small op per parameter and operation, which ``foreach``/``fused`` collapse;
* **host overhead**: the share of the phases' time spent outside any op (Python, module calls, autograd's
  bookkeeping): large when a model runs many small ops, which compile (fewer, larger kernels) or a larger batch
  amortize.

    >>> import torch
    >>> from torch import nn
    >>> from torch.profiler import ProfilerActivity, profile
    >>> from ampkit import Engine
    >>> engine = Engine("bf16-mixed", hooks=[PhaseRanges()])
    >>> model = nn.Linear(8, 1); model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    ...     for _ in range(2):
    ...         with engine.autocast():
    ...             loss = model(torch.ones(4, 8)).float().sum()
    ...         engine.backward(loss); _ = engine.step()
    >>> b = op_breakdown(prof); b.steps, b.cast_s > 0
    (2, True)
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.profiler import record_function

from ..training._hooks import StepHook

if TYPE_CHECKING:
    from ..training._engine import Engine

__all__ = ["PhaseRanges", "OpBreakdown", "op_breakdown", "RANGE_PREFIX"]

RANGE_PREFIX = "ampkit::"
_CAST = "aten::_to_copy"


class PhaseRanges(StepHook):
    """Opens a profiler range around each engine phase (see the module's docstring). Costs nothing unprofiled
    beyond the range objects: ``record_function`` records only while a profiler runs."""

    def __init__(self) -> None:
        self._open: dict[str, Any] = {}

    def wrap_forward(self, engine: Engine, forward: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        return self._ranged(forward)

    @contextlib.contextmanager
    def _ranged(self, forward: AbstractContextManager[Any]) -> Iterator[None]:
        with record_function(RANGE_PREFIX + "forward"), forward:
            yield

    def _enter(self, phase: str) -> None:
        r = record_function(RANGE_PREFIX + phase)
        r.__enter__()
        self._open[phase] = r

    def _exit(self, phase: str) -> None:
        r = self._open.pop(phase, None)
        if r is not None:
            r.__exit__(None, None, None)

    def before_backward(self, engine: Engine, loss: torch.Tensor) -> None:
        self._enter("backward")

    def after_backward(self, engine: Engine) -> None:
        self._exit("backward")

    def before_optimizer_step(self, engine: Engine) -> None:
        self._enter("optimizer")

    def after_optimizer_step(self, engine: Engine) -> None:
        self._exit("optimizer")


@dataclass(frozen=True)
class OpBreakdown:
    """What one profile of ``steps`` optimizer steps shows (host times, seconds)."""

    steps: int
    phase_s: dict[str, float]
    """Each phase's range time, summed over the profile."""
    cast_s: float
    """Time in ``aten::_to_copy`` inside the forward and backward ranges."""
    casts: int
    optimizer_ops: int
    """Ops the optimizer step dispatched itself (not those other ops dispatch), over all steps."""
    optimizer_op_s: float
    op_s: float = 0.0
    """Time inside the outermost ops of the three phases: what is left of their time is the host's own work
    around the ops (Python, module calls, autograd's bookkeeping, hooks)."""

    @property
    def cast_share(self) -> float:
        """Casts' share of the forward and backward time."""
        compute = self.phase_s.get("forward", 0.0) + self.phase_s.get("backward", 0.0)
        return self.cast_s / compute if compute else 0.0

    @property
    def host_share(self) -> float:
        """The share of the three phases' time spent outside any op: the loop's own overhead on the host."""
        total = sum(self.phase_s.values())
        return max(0.0, 1.0 - self.op_s / total) if total else 0.0

    @property
    def optimizer_ops_per_step(self) -> float:
        return self.optimizer_ops / self.steps if self.steps else 0.0


def _ancestors(event: Any) -> Iterator[Any]:
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


class _PhaseSpans:
    """The phase ranges' spans, sorted: an op's phase is the span its start falls in. By time, not by parent:
    on CUDA the backward's ops run on the autograd engine's device thread, outside the range the main thread
    opened, and would otherwise belong to no phase."""

    def __init__(self, events: Any) -> None:
        spans = sorted(
            (e.time_range.start, e.time_range.end, e.name[len(RANGE_PREFIX):]) for e in events if e.name.startswith(RANGE_PREFIX)
        )
        self.starts = [start for start, _, _ in spans]
        self.spans = spans

    def phase_of(self, event: Any) -> str | None:
        at = event.time_range.start
        i = bisect.bisect_right(self.starts, at) - 1
        if i >= 0 and at <= self.spans[i][1]:
            return self.spans[i][2]
        return None


def op_breakdown(prof: torch.profiler.profile) -> OpBreakdown:
    """Read a profile of a loop run with :class:`PhaseRanges`, taken with ``record_shapes=True`` (see the module)."""
    events = prof.events()
    casts = [e for e in events if e.name == _CAST]
    if casts and not any(e.input_shapes for e in casts):
        raise ValueError("op_breakdown() tells a cast of a tensor from a scalar's by its shape: profile with record_shapes=True.")
    spans = _PhaseSpans(events)
    phase_s: dict[str, float] = {}
    steps = cast_n = opt_n = 0
    cast_us = opt_us = op_us = 0.0
    for e in events:
        if e.name.startswith(RANGE_PREFIX):
            phase = e.name[len(RANGE_PREFIX):]
            phase_s[phase] = phase_s.get(phase, 0.0) + e.cpu_time_total / 1e6
            steps += phase == "optimizer"
            continue
        phase = spans.phase_of(e)
        outermost = e.name.startswith("aten::") and not any(p.name.startswith("aten::") for p in _ancestors(e))
        if phase is not None and outermost:
            op_us += e.cpu_time_total
        if e.name == _CAST and phase in ("forward", "backward") and not any(p.name == _CAST for p in _ancestors(e)) and e.input_shapes[0]:
            # A 0-dim input is a Python scalar wrapped for an op (``x / 2``), not a tensor changing dtype.
            cast_n += 1
            cast_us += e.cpu_time_total
        elif phase == "optimizer" and outermost:
            # The ops the optimizer itself dispatches: on a GPU each is a kernel launch at least (a CPU's foreach
            # ops loop over per-tensor ops inside; those are not launches of their own).
            opt_n += 1
            opt_us += e.cpu_time_total
    return OpBreakdown(steps, phase_s, cast_us / 1e6, cast_n, opt_n, opt_us / 1e6, op_us / 1e6)
