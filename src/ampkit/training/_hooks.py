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

Hooks are the tools' side of the engine: they see the public engine and change nothing in it. A hook annotates the
engine it is handed as it likes: the ``Engine`` class, or :class:`~ampkit.training._engine_protocol.EngineLike`
(what the engine's own tools read: the engine's module imports this one, which can name only the protocol). The hook protocols
are generic in that type, so ``Engine(hooks=...)`` takes a hook typed either way and refuses one typed otherwise;
:class:`StepHook` leaves it open (``Any``), so that a subclass may narrow it without breaking the override rule.

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
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import torch

if TYPE_CHECKING:
    from ._engine_protocol import EngineLike

__all__ = ["HOOK_METHODS", "AnyHook", "HookPoint", "Hooks", "StepHook"]

HookPoint = Literal["wrap_forward", "before_backward", "after_backward", "before_optimizer_step", "after_optimizer_step"]
"""The points of a step where hooks are called."""
HOOK_METHODS: tuple[HookPoint, ...] = ("wrap_forward", "before_backward", "after_backward", "before_optimizer_step", "after_optimizer_step")


E_contra = TypeVar("E_contra", contravariant=True)
"""The type a hook's methods take the engine as. The engine asks for ``AnyHook[Engine]``, which a hook meets whose
methods take an ``Engine``, an ``EngineLike`` (wider) or an unannotated engine."""


# One protocol per hook point: a hook is an object that meets at least one of them (it defines the methods it needs).
class _WrapsForward(Protocol[E_contra]):
    def wrap_forward(self, engine: E_contra, forward: AbstractContextManager[Any]) -> AbstractContextManager[Any]: ...


class _BeforeBackward(Protocol[E_contra]):
    def before_backward(self, engine: E_contra, loss: torch.Tensor) -> None: ...


class _AfterBackward(Protocol[E_contra]):
    def after_backward(self, engine: E_contra) -> None: ...


class _BeforeOptimizerStep(Protocol[E_contra]):
    def before_optimizer_step(self, engine: E_contra) -> None: ...


class _AfterOptimizerStep(Protocol[E_contra]):
    def after_optimizer_step(self, engine: E_contra) -> None: ...


AnyHook = (
    _WrapsForward[E_contra] | _BeforeBackward[E_contra] | _AfterBackward[E_contra] | _BeforeOptimizerStep[E_contra] | _AfterOptimizerStep[E_contra]
)
"""What ``Engine(hooks=...)`` and ``engine.add_hook`` take (as ``AnyHook[Engine]``): an object with at least one hook
method, as typed above."""


class StepHook:
    """A base for hooks: every method does nothing, so a subclass defines only the ones it needs (and types the
    engine as it likes: see the module docstring)."""

    def wrap_forward(self, engine: Any, forward: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        return forward

    def before_backward(self, engine: Any, loss: torch.Tensor) -> None:
        return None

    def after_backward(self, engine: Any) -> None:
        return None

    def before_optimizer_step(self, engine: Any) -> None:
        return None

    def after_optimizer_step(self, engine: Any) -> None:
        return None


class Hooks:
    """The engine's hooks, sorted by method once when added, so a step only runs the calls that exist."""

    def __init__(self, hooks: Sequence[AnyHook[Any]] = ()) -> None:
        self.hooks: list[AnyHook[Any]] = []
        self.calls: dict[HookPoint, list[Callable[..., Any]]] = {name: [] for name in HOOK_METHODS}
        for hook in hooks:
            self.add(hook)

    def add(self, hook: AnyHook[Any]) -> None:
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
