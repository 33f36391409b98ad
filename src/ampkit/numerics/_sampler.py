"""A cheap look at how training's gradients and activations fit fp16, taken every N optimizer steps.

``Engine(numerics=N)`` (or ``Engine(numerics=NumericsSampler(every=N, ...))``) samples optimizer steps
N, 2N, ...: during the forward and backward of the step's last micro-batch, hooks record each module's
outputs and the gradients flowing into them; before the step unscales anything, the 16-bit gradients of each
module's own parameters are read as the backward left them (still multiplied by the loss scale). The sample
(:class:`NumericsSample`) says what share of the scaled gradients fp16 flushes (below 2^-24) or holds as
subnormals (below 2^-14), how many binades are left below fp16's 65504, which loss scale would use them,
how large the activations get, and which modules are worst. It is logged (one INFO line, plus a WARNING when
something is wrong), kept as ``sampler.last`` and passed to ``callback``; :meth:`NumericsSample.to_scalars`
flattens it for TensorBoard or any metrics logger.

Where the optimizer steps 16-bit weights directly (``bf16-true``, ``16-true``: no fp32 masters), a sampled step
also audits the update (:mod:`~ampkit.numerics._update_audit`): per parameter, the share of the update that
rounding discards, the elements whose update was lost entirely, and whether weight decay lands at all. The
sample (``updates``) names the worst parameters and warns with the policies that keep small updates.

    >>> from torch import nn
    >>> from ampkit import Engine
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> seen = []
    >>> engine = Engine(numerics=NumericsSampler(every=2, callback=seen.append))
    >>> model, opt = engine.setup(model, opt)
    >>> for _ in range(5):
    ...     with engine.autocast():
    ...         loss = model(torch.randn(3, 4)).pow(2).mean()
    ...     engine.backward(loss)
    ...     _ = engine.step()
    >>> [s.step for s in seen], sorted(engine.numerics.last.modules)
    ([2, 4], ['', '0', '1', '2'])
    >>> sorted(seen[-1].to_scalars())[:3]
    ['numerics/act_grad_underflow_share', 'numerics/act_max_abs', 'numerics/act_nonfinite']

Cost. Steps that are not sampled pay an integer modulo in ``autocast()`` and in ``step()``; no hook is
registered. A sampled step reads every module's inputs (they tell whether a module started an overflow or
inherited it), outputs, output gradients and parameter gradients: one pass over each tensor for its largest
magnitude, then about a dozen small kernels over at most :data:`SAMPLE_VALUES` of its values; every result
comes back in **one** device-to-host transfer, the sample's only host-device sync. An audited step adds an fp32
shadow step of the 16-bit parameters (fp32 copies of them, their gradients and their optimizer state exist
during the step) and a few kernels per parameter; its figures join that one transfer, made after the step. Measured in
``benchmarks/numerics_sampler.py`` (BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ._recorder import ModuleRecorder
from ._sample import ModuleIssue, NumericsSample, build_sample
from ._stats import StatsAccumulator, TensorStats, read_summaries
from ._update_audit import UpdateAudit

if TYPE_CHECKING:  # what a step hook reads of the engine, as a protocol: the Engine's module imports this one
    from ..training._engine_protocol import EngineLike

__all__ = ["SAMPLE_VALUES", "ModuleIssue", "NumericsSample", "NumericsSampler"]

SAMPLE_VALUES = 2**16
"""Values read per tensor on a sampled step: a 1% share measured on 65536 values has a standard error of 0.04
points, and the cost stops growing with the activations. The largest magnitude, any non-finite value and any
overflow are still found in the whole tensor."""

log = logging.getLogger("ampkit.numerics")

_ACT_KINDS = ("inputs", "outputs", "output_grads")


class NumericsSampler:
    """Samples how gradients and activations fit fp16 on optimizer steps ``every``, ``2 * every``, ...

    Pass it (or just ``every``) as ``Engine(numerics=...)``; the engine calls :meth:`recording` and
    :meth:`sample`. ``activations=False`` reads the gradients only (no hooks at all). ``callback`` receives
    every :class:`NumericsSample`; ``top`` is how many worst modules (and parameters) a sample names.
    ``updates=False`` leaves the update audit out (no shadow step). Only the last sample is kept (``last``).

    >>> NumericsSampler(every=0)
    Traceback (most recent call last):
    ...
    ValueError: NumericsSampler(every=0): every must be an int >= 1 (sample every N optimizer steps), e.g. every=100.
    """

    def __init__(
        self,
        every: int,
        *,
        activations: bool = True,
        callback: Callable[[NumericsSample], None] | None = None,
        top: int = 3,
        updates: bool = True,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"NumericsSampler(every={every!r}): every must be an int >= 1 (sample every N optimizer steps), e.g. every=100.")
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise ValueError(f"NumericsSampler(top={top!r}): top must be an int >= 0 (how many worst modules to name).")
        if callback is not None and not callable(callback):
            raise TypeError(f"NumericsSampler(callback=...) takes a function of one NumericsSample, got {type(callback).__name__}.")
        self.every = every
        self.activations = bool(activations)
        self.callback = callback
        self.top = top
        self.updates = bool(updates)
        self._audit = UpdateAudit()
        self._taken: _Taken | None = None  # a sampled step waiting for its optimizer step to be audited
        self.last: NumericsSample | None = None
        # Recorders of the step being sampled: (optimizer step, one per model). They outlive the forward's
        # context because the tensor hooks they placed on outputs fill them during the coming backward.
        self._pending: tuple[int, list[ModuleRecorder]] | None = None

    def __repr__(self) -> str:
        return f"NumericsSampler(every={self.every}, activations={self.activations}, top={self.top})"

    def due(self, step: int) -> bool:
        """Whether optimizer step ``step`` (counted from 1) is sampled."""
        return step % self.every == 0

    # -- step hooks (see ampkit.training._hooks) ---------------------------------------------------
    def wrap_forward(self, engine: EngineLike, forward: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        """The last micro-batch of a sampled step records its activations (and, in its backward, their gradients)."""
        if self.activations and self.due(engine.steps + 1) and engine.is_boundary:
            return self.recording(engine, forward)
        return forward

    def before_optimizer_step(self, engine: EngineLike) -> None:
        """Sample a due step: its 16-bit gradients as the backward left them (scaled, not yet copied to masters).
        Where the optimizer steps 16-bit weights directly, the read waits for the step, whose update is audited."""
        if self.due(engine.steps):
            taken = self._take(engine)
            # Kahan sums and stochastic rounding carry what one step rounds away: no single step shows their loss.
            if self.updates and engine.policy.rounds_updates_away() and self._audit.arm(engine.optimizers, _param_names(engine)):
                self._taken = taken
            else:
                self._read(taken, None)

    def after_optimizer_step(self, engine: EngineLike) -> None:
        """Finish an audited sample: the applied update is known now."""
        if self._taken is not None:
            taken, self._taken = self._taken, None
            self._audit.disarm()
            self._read(taken, self._audit)

    def recording(self, engine: EngineLike, forward: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        """``forward`` plus recorders on every model of ``engine``: the engine wraps the forward of the last
        micro-batch of a sampled step in it. The forward hooks go when the context exits; the hooks placed on
        the outputs fire in the backward. Several forwards of that micro-batch add to the same recorders."""
        step = engine.steps + 1
        if self._pending is None or self._pending[0] != step:
            self._pending = (step, [ModuleRecorder(m, rounding=False, max_values=SAMPLE_VALUES) for m in engine.models])
        return _entered_together(self._pending[1], forward)

    def sample(self, engine: EngineLike) -> NumericsSample:
        """Read the current step's gradients (before they are unscaled or copied to masters) and the recorded
        activations; log, keep and hand the sample to ``callback``. One host-device sync. (The update audit needs
        the step itself: the engine's hooks take it; this reads the gradients alone.)"""
        return self._read(self._take(engine), None)

    def _take(self, engine: EngineLike) -> _Taken:
        """Everything the sample reads, still on the device: no sync."""
        step = engine.steps
        recorders = self._pending[1] if self._pending is not None and self._pending[0] == step else []
        self._pending = None  # recorders of a step that never came are dropped here too
        several = len(engine.models) > 1

        slots: list[tuple[str, str, StatsAccumulator]] = []
        seen: set[int] = set()  # a tied parameter is counted once, under the first module holding it
        for i, model in enumerate(engine.models):
            for name, module in model.named_modules():
                acc: StatsAccumulator | None = None
                for p in module.parameters(recurse=False):
                    grad = p.grad
                    if grad is None or id(p) in seen:
                        continue
                    seen.add(id(p))
                    if grad.is_sparse:
                        # The stored values, uncoalesced: coalescing would cost a sort (and a sync on CUDA).
                        grad = grad._values()
                    if acc is None:
                        acc = StatsAccumulator(rounding=False, max_values=SAMPLE_VALUES)
                    acc.update(grad)
                if acc is not None:
                    slots.append((_qualified(i, name, several), "grads", acc))
        for i, rec in enumerate(recorders):
            for name, kinds in rec.accumulators().items():
                slots.extend((_qualified(i, name, several), kind, kinds[kind]) for kind in _ACT_KINDS if kind in kinds)

        scaler = engine.scaler
        policy = engine.policy
        islands = tuple(_qualified(i, name, several) for i, model in enumerate(engine.models) for name, _ in policy.fp32_islands(model))
        return _Taken(
            step=step, slots=slots, activations=bool(recorders), fp32_modules=islands,
            # A copy: an audited sample is read after the step, and the step updates the scale.
            scale=scaler.scale_tensor.detach().clone() if scaler is not None else None,
            fp16=scaler is not None or policy.computes_in(torch.float16),
        )

    def _read(self, taken: _Taken, audit: UpdateAudit | None) -> NumericsSample:
        """Bring ``taken`` (and the audit's figures) to the host in one transfer; build, report, return the sample."""
        scalars = [taken.scale] if taken.scale is not None else []
        audited = audit.stats() if audit is not None else None
        stats, values = read_summaries([acc for _, _, acc in taken.slots], scalars + ([audited] if audited is not None else []))
        modules: dict[str, dict[str, TensorStats]] = {}
        for (name, kind, _), s in zip(taken.slots, stats):
            modules.setdefault(name, {})[kind] = s
        updates = audit.report(values[len(scalars) :], top=self.top) if audit is not None else None
        result = build_sample(
            taken.step, values[0] if scalars else None, modules, top=self.top, fp16=taken.fp16, activations=taken.activations,
            fp32_modules=taken.fp32_modules, updates=updates,
        )
        self._report(result)
        return result

    def _report(self, sample: NumericsSample) -> None:
        self.last = sample
        log.info("%s", sample)
        if sample.problems:
            log.warning("numerics @ step %d: %s", sample.step, "; ".join(sample.problems))
        if self.callback is not None:
            self.callback(sample)



# ------------------------------------------------------------------------------------------ helpers
@dataclass
class _Taken:
    """A sampled step's figures on the device, before the one read."""

    step: int
    slots: list[tuple[str, str, StatsAccumulator]]
    scale: torch.Tensor | None
    fp16: bool
    activations: bool
    fp32_modules: tuple[str, ...]


def _param_names(engine: EngineLike) -> dict[int, str]:
    several = len(engine.models) > 1
    return {id(p): _qualified(i, name, several) for i, model in enumerate(engine.models) for name, p in model.named_parameters()}


@contextlib.contextmanager
def _entered_together(recorders: Sequence[ModuleRecorder], forward: AbstractContextManager[Any]) -> Iterator[Any]:
    with contextlib.ExitStack() as stack:
        for rec in recorders:
            stack.enter_context(rec)
        yield stack.enter_context(forward)


def _qualified(model: int, name: str, several: bool) -> str:
    if not several:
        return name
    return f"{model}.{name}" if name else str(model)
