"""The accumulation window's gradients, watched between ``engine.backward()`` and ``engine.step()``: what the user's
own code does to them there is refused where it trains wrong in silence.

Between the engine's two calls the gradients are the engine's: multiplied by the loss scale, divided by the window's
size, partial sums of a window still open. Three things done to them there train wrong without a word:

* a hand ``torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`` (or ``clip_grad_value_``) clips scaled
  gradients under ``16-mixed`` (the clip does nothing, or clips by the scale's whim), or, after each micro-batch, the
  window's partial sums; ``zero_grad(set_to_none=False)`` there erases them;
* ``optimizer.zero_grad()`` between two ``engine.backward()`` calls of one window drops the window's earlier
  micro-batches (the step then averages one micro-batch's gradient divided by the window's size);
* a ``loss.backward()`` of one's own beside ``engine.backward(loss)`` in a window where the engine scales or
  accumulates adds an unscaled, undivided gradient to scaled, divided ones.

:class:`WindowWatch` finds all three by watching *sentinels*: for each optimizer its first and last parameter that
the first ``engine.backward()`` gave a gradient, not all of them. That suffices because each of the three touches
every parameter holding a gradient: ``clip_grad_norm_`` and ``clip_grad_value_`` change every gradient they are
given in place (a clip within the norm still multiplies by 1), ``zero_grad`` walks the whole list, and a backward
reaches every parameter its loss depends on. After each ``engine.backward()`` the watch records each sentinel's
``.grad`` (weakly, its identity) and that tensor's ``_version`` (bumped by every in-place change); a
post-accumulate-grad hook on each sentinel counts backward passes that reach it outside ``engine.backward()``. The
next ``engine.backward()``, ``engine.unscale_()`` or the window-ending ``engine.step()`` compares: a few attribute
reads per optimizer, no per-parameter loop, no host sync. An optimizer's gradients count as changed only where
*both* its sentinels changed: an edit of one layer's gradient (a test planting an inf to exercise the skip, a
user's per-layer scaling) is not a whole-model clip and may be meant.

What it misses: a change confined to some parameters (a clip of one layer alone, a hand ``p.grad.zero_()`` on
some), one that spares a sentinel, a backward that reaches no sentinel, and a change that leaves ``_version`` alone
(written through ``p.grad.data``). What stays silent on purpose: the user's gradient hooks (they run inside
``engine.backward()``, before the record); a clip after ``engine.unscale_()``, the documented way to clip by hand
(the window has ended there, and the step takes the gradients as they are); a new gradient tensor where the old one
stood (DDP pointing gradients at its buckets keeps the values); and, where nothing is scaled and the window is one
micro-batch, a ``loss.backward()`` of one's own (it gives the gradients ``engine.backward()`` would) and a clip of
one's own (the gradients it clips are the true ones, whole).

    >>> import torch
    >>> from torch import nn
    >>> from ampkit import Engine
    >>> model = nn.Linear(2, 1); engine = Engine(accumulate=2)
    >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> engine.backward(model(torch.ones(1, 2)).sum()); _ = engine.step()
    >>> opt.zero_grad()
    >>> engine.backward(model(torch.ones(1, 2)).sum())
    Traceback (most recent call last):
    ...
    RuntimeError: the gradients were zeroed (set to None) between engine.backward() and engine.backward() of one accumulation window of 2 micro-batches: the window's earlier micro-batches are lost, and the step would take one micro-batch's gradient divided by 2. Drop optimizer.zero_grad() (and model.zero_grad()) from the loop: engine.step() zeroes the gradients at the window's end.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence

import torch

from ..policy._masters import MasterWeights

__all__ = ["WindowWatch"]


class _Sentinel:
    """One watched parameter: its gradient as the last ``engine.backward()`` left it."""

    __slots__ = ("grad", "param", "recorded", "version")

    def __init__(self, param: torch.Tensor) -> None:
        self.param = param
        self.grad: weakref.ref[torch.Tensor] | None = None  # weakly: a set_to_none must free the gradient
        self.version = 0
        self.recorded = False

    def record(self) -> None:
        grad = self.param.grad
        self.grad = weakref.ref(grad) if grad is not None else None
        self.version = grad._version if grad is not None else 0
        self.recorded = True

    def change(self) -> str | None:
        """What became of the recorded gradient, in words; None where it is as recorded."""
        if not self.recorded:
            return None
        grad = self.param.grad
        before = self.grad() if self.grad is not None else None
        if grad is None:
            return "zeroed" if self.grad is not None else None
        if grad is not before:
            # A new gradient tensor: one appeared, or set_to_none and a backward of one's own made it (the backward is
            # counted), or DDP re-pointed it at its buckets (gradient_as_bucket_view, values kept): not refused alone.
            return None
        return "changed" if grad._version != self.version else None


class _Counter:
    """Post-accumulate-grad hook on a sentinel: counts backward passes outside ``engine.backward()``. Holds the watch
    weakly, so a parameter that outlives the run keeps nothing of it."""

    def __init__(self, watch: WindowWatch) -> None:
        self._watch = weakref.ref(watch)

    def __call__(self, param: torch.Tensor) -> None:
        watch = self._watch()
        if watch is not None and not watch.inside:
            watch.outside += 1


class WindowWatch:
    """Watches one sentinel parameter per optimizer between the engine's calls (see the module docstring).

    ``params``: for each optimizer the engine steps, the model parameters its gradients land on (under master
    weights, the 16-bit twins of the masters it holds).
    """

    def __init__(self, params: Sequence[Sequence[torch.Tensor]]) -> None:
        self.inside = False  # an engine.backward() is running: its backward passes are the engine's
        self.outside = 0  # backward passes that reached a sentinel outside engine.backward() in this window
        self.trusted = False  # engine code (train_step's OOM retry) changes the gradients itself
        self._candidates = [[p for p in ps if p.requires_grad] for ps in params]
        # Picked at the first record, for each optimizer the first and the last parameter that got a gradient.
        self._groups: list[list[_Sentinel]] | None = None
        self._sentinels: list[_Sentinel] = []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        # Until then, the first trainable parameter of each optimizer is watched for backward passes of one's own.
        self._hook([ps[0] for ps in self._candidates if ps])

    def _hook(self, params: Sequence[torch.Tensor]) -> None:
        self.close()
        counter = _Counter(self)
        self._handles = [p.register_post_accumulate_grad_hook(counter) for p in params]  # type: ignore[no-untyped-call]  # no annotations in torch 2.13

    @classmethod
    def of(cls, optimizers: Sequence[torch.optim.Optimizer], masters: MasterWeights | None) -> WindowWatch:
        """The watch of ``optimizers``' gradients: where there are masters, those of their 16-bit twins."""
        twin = {id(m): p for m, p in zip(masters.masters, masters.model_params)} if masters is not None else {}
        return cls([[twin.get(id(p), p) for g in o.param_groups for p in g["params"]] for o in optimizers])

    def close(self) -> None:
        """Remove the hooks (a new watch takes over: setup_optimizers adopted more optimizers)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    # Entered around the backward of engine.backward(): its passes are the engine's; the gradients are recorded after
    # (a context of its own, not a generator's: the engine enters it once per micro-batch).
    def __enter__(self) -> None:
        self.inside = True

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        self.inside = False
        if kind is None:
            self.record()

    def record(self) -> None:
        """Take the sentinels' gradients as they are now as the engine's."""
        if self._groups is None:
            # Once per run: for each optimizer its first and last parameter that have a gradient (scans that stop there).
            groups = []
            for ps in self._candidates:
                first = next((p for p in ps if p.grad is not None), None)
                last = next((p for p in reversed(ps) if p.grad is not None), None)
                if first is not None and last is not None:
                    groups.append([_Sentinel(first)] + ([_Sentinel(last)] if last is not first else []))
            if not groups:
                return  # no gradient yet (a load before the first backward): picked at the next record
            self._groups = groups
            self._sentinels = [s for g in groups for s in g]
            self._hook([s.param for s in self._sentinels])
        for s in self._sentinels:
            s.record()

    def forget(self) -> None:
        """The window ended (the step took and zeroed its gradients): nothing is recorded until the next backward."""
        self.outside = 0
        for s in self._sentinels:
            s.recorded = False

    @contextlib.contextmanager
    def trusting(self) -> Iterator[None]:
        """Engine code that may zero the gradients itself (``train_step`` retrying after an out-of-memory error): no
        check inside; what it leaves is recorded at the end."""
        self.trusted = True
        try:
            yield
        finally:  # an error too (train_step's OutOfMemoryError) leaves the gradients as the engine made them
            self.trusted = False
            if any(s.recorded for s in self._sentinels):
                self.record()

    def check(self, what: str, *, window: int, scaled: bool) -> None:
        """Refuse what the user's code did to the window's gradients since the last ``engine.backward()``; ``what``
        names the engine call being made, ``window`` is the window's size, ``scaled``: the loss is scaled."""
        if self.trusted or self._groups is None:
            return
        # An optimizer's gradients count as changed only where both its sentinels are: a clip or a zero_grad changes
        # every one, while a change to one layer (a test planting an inf, a user's per-layer edit) may be meant.
        changes = []
        for group in self._groups:
            first = group[0].change()
            if first is None:
                continue  # the common case, one sentinel read per optimizer
            seen = [first, *(s.change() for s in group[1:])]
            if all(c is not None for c in seen):
                changes.append("zeroed" if all(c == "zeroed" for c in seen) else "changed")
        if self.outside and (scaled or window > 1):
            raise RuntimeError(_outside(what, window, scaled))
        if not changes or self.outside:
            return  # nothing changed, or a backward of one's own that gives engine.backward()'s gradients (see above)
        if "zeroed" in changes:
            raise RuntimeError(
                f"the gradients were zeroed (set to None) between engine.backward() and {what} of one accumulation window"
                + (f" of {window} micro-batches: the window's earlier micro-batches are lost, and the step would take one "
                   f"micro-batch's gradient divided by {window}." if window > 1 else ": the step would update nothing.")
                + " Drop optimizer.zero_grad() (and model.zero_grad()) from the loop: engine.step() zeroes the gradients at the "
                "window's end."
            )
        if not scaled and window == 1:
            return  # the gradients are the true ones, whole: a clip of one's own here is torch's plain loop
        raise RuntimeError(
            f"the gradients were changed in place (or replaced) between engine.backward() and {what}: a hand "
            "clip_grad_norm_()/clip_grad_value_() there clips "
            + ("gradients still multiplied by the loss scale" if scaled else "")
            + (" and " if scaled and window > 1 else "")
            + (f"the partial sums of a window of {window} micro-batches" if window > 1 else "")
            + "; zero_grad(set_to_none=False) erases them. Clip with Engine(clip_grad_norm=...) (or clip_grad_value=...), which "
            "clips the unscaled gradients of the whole window; to clip by hand, call engine.unscale_() after the window's last "
            "engine.backward(), then clip, then engine.step()."
        )


def _outside(what: str, window: int, scaled: bool) -> str:
    why = []
    if scaled:
        why.append("engine.backward() multiplies its loss by the loss scale, which engine.step() divides every gradient by: "
                   "the other gradient comes out that many times too small")
    if window > 1:
        why.append(f"engine.backward() divides its loss by the window's {window} micro-batches, the other not")
    return (
        f"a backward outside engine.backward() (loss.backward() of your own) ran in this window, found at {what}: "
        f"{'; '.join(why)}. Give every loss to the engine: engine.backward(loss_a + loss_b), or engine.backward(loss_a) "
        "then engine.backward(loss_b)."
    )
