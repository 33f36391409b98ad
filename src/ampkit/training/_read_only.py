"""Why an :class:`~ampkit.training.Engine` attribute cannot be assigned, and what to write instead.

The engine's configuration is fixed when it is built (the checks, the optimizer step and checkpoints were set up
for it), its parts are owned by whoever built them (``setup()``, the optimizer step), and its counters move with the
loop; assigning any of them would change a run behind the back of what was set up for it, or, for a misspelt name,
change nothing at all. ``micro_batch_rows`` is the one attribute to assign: the rows ``train_step`` feeds at once,
which the engine also learns by itself.

    >>> str(refusal("clip_grad_norm"))
    'engine.clip_grad_norm is read-only: build the engine with it, Engine(..., clip_grad_norm=...); a run keeps the settings it was built with.'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, NoReturn, TypeVar, overload

__all__ = ["WRITABLE", "ReadOnly", "refusal"]

O = TypeVar("O")
T = TypeVar("T")

WRITABLE = frozenset({"micro_batch_rows"})
"""Public attributes that may be assigned."""

_SETTINGS = {
    "policy": "precision", "accumulate": "accumulate", "clip_grad_norm": "clip_grad_norm", "clip_grad_value": "clip_grad_value",
    "skip_nonfinite": "skip_nonfinite", "on_oom": "on_oom", "compile_plan": "compile", "numerics": "numerics",
}
_FIXES = {
    "scaler": "the optimizer step built by setup() owns it: pass Engine(..., scaler=...), and restore a scaler's state with engine.load(path)",
    "masters": "the optimizer step built by setup() owns them: the policy makes them, and engine.load(path) restores their values",
    "optimizers": "pass them to engine.setup(model, *optimizers)",
    "schedulers": "pass them to engine.setup(model, optimizer, schedulers=...)",
    "hooks": "join a hook with engine.add_hook(hook), or pass Engine(..., hooks=[...])",
    "steps": "engine.step() counts them; engine.load(path) restores a run's counters",
    "step_state": "engine.step() moves it; engine.load(path) restores a run's counters",
    "strategy": "pass Engine(..., strategy=...); setup() settles it",
}


def refusal(name: str, known: bool = True) -> AttributeError:
    """The error for ``engine.<name> = ...``, naming what to do instead; ``known``: the engine has such an attribute.

    >>> str(refusal("clip_grad_nrom", known=False))
    "Engine has no setting 'clip_grad_nrom' (is it misspelt?): its settings are Engine(...)'s arguments, fixed once it is built."
    """
    if not known:
        return AttributeError(f"Engine has no setting {name!r} (is it misspelt?): its settings are Engine(...)'s arguments, fixed once it is built.")
    if name in _SETTINGS:
        fix = f"build the engine with it, Engine(..., {_SETTINGS[name]}=...); a run keeps the settings it was built with"
    else:
        fix = _FIXES.get(name, "setup() makes it from the models and optimizers it is given, and the optimizer step owns what it holds")
    return AttributeError(f"engine.{name} is read-only: {fix}.")


class ReadOnly(property, Generic[O, T]):
    """An attribute of ``O`` instances that reads ``get(instance)``, typed ``T``, and refuses assignment with its fix.

    A ``property`` (``help()`` lists it under the read-only properties, with ``doc``), typed for type checkers:
    ``instance.<name>`` is a ``T``, ``O.<name>`` the descriptor, and an assignment is flagged (its value would have
    to be of type ``Never``); at run time it raises :func:`refusal`. ``T`` is inferred from ``get``, so each attribute
    has the type of what it reads.

    >>> class View:  # the engine's read side, in miniature
    ...     _steps = 3
    ...     steps = ReadOnly(lambda view: view._steps, "Optimizer steps taken.")
    >>> view = View(); view.steps, View.steps.__doc__
    (3, 'Optimizer steps taken.')
    >>> view.steps = 4
    Traceback (most recent call last):
    ...
    AttributeError: engine.steps is read-only: engine.step() counts them; engine.load(path) restores a run's counters.
    """

    def __init__(self, get: Callable[[O], T], doc: str) -> None:
        super().__init__(get)
        # Set on the instance: given to property.__init__, a subclass's __doc__ reads None on Python 3.11.
        self.__doc__ = doc
        self._name = ""

    def __set_name__(self, owner: type[object], name: str) -> None:
        self._name = name  # the refusal names the attribute

    if TYPE_CHECKING:  # property's own __get__ runs (in C); these say what it returns

        @overload
        def __get__(self, instance: None, owner: type[object] | None = None, /) -> ReadOnly[O, T]: ...
        @overload
        def __get__(self, instance: O, owner: type[object] | None = None, /) -> T: ...
        def __get__(self, instance: O | None, owner: type[object] | None = None, /) -> T | ReadOnly[O, T]: ...

    # NoReturn as the value's type: no value may be assigned, so a type checker flags ``engine.policy = ...``.
    def __set__(self, instance: O, value: NoReturn, /) -> NoReturn:
        raise refusal(self._name)
