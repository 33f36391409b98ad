"""The step-hook protocol: how tools (the numerics sampler, the memory tracker, a profiler) join the engine's step.

A hook is any object with some of these methods; the engine calls those it has, in the order hooks were added,
and adds nothing to a step when there are none:

* ``wrap_forward(engine, forward) -> ContextManager``: the context the micro-batch's forward runs in
  (``forward`` is the engine's own: autocast, DDP's no_sync); return it, or one that enters it.
* ``before_backward(engine, loss)`` and ``after_backward(engine)``: around each ``engine.backward``; ``loss`` is
  the micro-batch's loss before the engine divides and scales it.
* ``before_optimizer_step(engine)``: at a window's end, with the gradients as the backward left them (scaled,
  16-bit where the model is), before they are unscaled, copied to masters or clipped.
* ``after_optimizer_step(engine)``: once the step is complete (weights updated or the step skipped, gradients
  zeroed); ``engine.steps`` counts it.

Hooks are the tools' side of the engine: they see the public engine and change nothing in it. They are typed
against what they may read of it (:class:`~ampkit.training._engine_protocol.EngineLike`), not the ``Engine`` class,
whose module imports this one.

    >>> from torch import nn
    >>> from ampkit import Engine
    >>> class CountSteps(StepHook):
    ...     def __init__(self): self.seen = []
    ...     def after_optimizer_step(self, engine): self.seen.append(engine.steps)
    >>> counter = CountSteps()
    >>> engine = Engine(accumulate=2, hooks=[counter])
    >>> model = nn.Linear(2, 1); model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> for _ in range(4):
    ...     engine.backward(model(torch.ones(1, 2)).sum()); _ = engine.step()
    >>> counter.seen
    [1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

if TYPE_CHECKING:
    from ._engine_protocol import EngineLike

__all__ = ["HOOK_METHODS", "AnyHook", "HookPoint", "Hooks", "StepHook"]

HookPoint = Literal["wrap_forward", "before_backward", "after_backward", "before_optimizer_step", "after_optimizer_step"]
"""The points of a step where hooks are called."""
HOOK_METHODS: tuple[HookPoint, ...] = ("wrap_forward", "before_backward", "after_backward", "before_optimizer_step", "after_optimizer_step")


# One protocol per hook point: a hook is an object that meets at least one of them (it defines the methods it needs).
class _WrapsForward(Protocol):
    def wrap_forward(self, engine: EngineLike, forward: AbstractContextManager[Any]) -> AbstractContextManager[Any]: ...


class _BeforeBackward(Protocol):
    def before_backward(self, engine: EngineLike, loss: torch.Tensor) -> None: ...


class _AfterBackward(Protocol):
    def after_backward(self, engine: EngineLike) -> None: ...


class _BeforeOptimizerStep(Protocol):
    def before_optimizer_step(self, engine: EngineLike) -> None: ...


class _AfterOptimizerStep(Protocol):
    def after_optimizer_step(self, engine: EngineLike) -> None: ...


AnyHook = _WrapsForward | _BeforeBackward | _AfterBackward | _BeforeOptimizerStep | _AfterOptimizerStep
"""What ``Engine(hooks=...)`` and ``engine.add_hook`` take: an object with at least one hook method, as typed above."""


class StepHook:
    """A base for hooks: every method does nothing, so a subclass defines only the ones it needs."""

    def wrap_forward(self, engine: EngineLike, forward: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        return forward

    def before_backward(self, engine: EngineLike, loss: torch.Tensor) -> None:
        return None

    def after_backward(self, engine: EngineLike) -> None:
        return None

    def before_optimizer_step(self, engine: EngineLike) -> None:
        return None

    def after_optimizer_step(self, engine: EngineLike) -> None:
        return None


class Hooks:
    """The engine's hooks, sorted by method once when added, so a step only runs the calls that exist."""

    def __init__(self, hooks: Sequence[AnyHook] = ()) -> None:
        self.hooks: list[AnyHook] = []
        self.calls: dict[HookPoint, list[Callable[..., Any]]] = {name: [] for name in HOOK_METHODS}
        for hook in hooks:
            self.add(hook)

    def add(self, hook: AnyHook) -> None:
        """Add ``hook``; it must define at least one of :data:`HOOK_METHODS`."""
        methods = [name for name in HOOK_METHODS if callable(getattr(hook, name, None))]
        if not methods:
            raise TypeError(
                f"{type(hook).__name__} is no step hook: it defines none of {', '.join(HOOK_METHODS)} "
                "(see ampkit.training._hooks; subclass StepHook and define the ones you need)."
            )
        if any(h is hook for h in self.hooks):
            raise ValueError(f"{type(hook).__name__} was added to this engine already; add a hook once.")
        self.hooks.append(hook)
        for name in methods:
            if not (isinstance(hook, StepHook) and getattr(type(hook), name) is getattr(StepHook, name)):
                self.calls[name].append(getattr(hook, name))  # StepHook's own do-nothing methods are not called

    @property
    def active(self) -> bool:
        """Whether any hook is attached: the engine tests it before dispatching, so a run without tools makes no
        dispatch call per hook point."""
        return bool(self.hooks)

    def run(self, name: HookPoint, *args: Any) -> None:
        for call in self.calls[name]:
            call(*args)

    def wrap_forward(self, engine: EngineLike, forward: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        for call in self.calls["wrap_forward"]:
            forward = call(engine, forward)
        return forward
