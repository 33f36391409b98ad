"""The engine protocol: the Engine has every member it names, of the same kind, and the module imports nothing of
ampkit at run time (the point of it: the modules typed by it need not import the Engine's)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable

import torch
from torch import nn

from ampkit import Engine
from ampkit.training._engine_protocol import EngineLike, EngineLoop, StateOwner
from ampkit.training._engine_view import EngineView
from ampkit.training._optimizer_step import OptimizerStep


def _members(protocol: type) -> dict[str, object]:
    """What ``protocol`` declares (its protocol bases' included): name -> the property, function or annotation."""
    found: dict[str, object] = {}
    for cls in reversed(protocol.__mro__):
        if not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        found.update({n: v for n, v in vars(cls).items() if not n.startswith("_")})
        found.update({n: "attribute" for n in inspect.get_annotations(cls) if n not in found})
    return found


def test_the_protocols_name_the_members_the_helpers_read():
    # A guard on the helper above as much as on the protocol: an empty or short list would make the next test vacuous.
    assert set(_members(EngineLoop)) - set(_members(EngineLike)) == {"autocast", "backward", "step"}
    assert {"policy", "models", "optimizers", "scaler", "masters", "step_state", "micro_batch_rows", "named_parameters"} <= set(_members(EngineLike))
    assert set(_members(StateOwner)) == {"state_dict", "load_state_dict"}


def test_the_engine_has_every_member_of_the_kind_declared():
    for name, member in _members(EngineLoop).items():
        mine = inspect.getattr_static(Engine, name, None)
        assert mine is not None, f"Engine has no {name!r}, which EngineLoop declares"
        if isinstance(member, property) or member == "attribute":
            assert isinstance(mine, property), f"Engine.{name} is a {type(mine).__name__}, EngineLike declares a property"
        else:
            assert callable(mine) and not isinstance(mine, property), f"Engine.{name} is not a method"
    # The assignable one is assignable, and only where EngineView says so.
    assert inspect.getattr_static(EngineView, "micro_batch_rows").fset is not None
    for name in ("state_dict", "load_state_dict"):
        assert callable(getattr(OptimizerStep, name))


def test_a_set_up_engine_answers_every_member():
    model = nn.Linear(2, 1)
    engine = Engine("bf16-mixed", accumulate=2)
    model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for name, member in _members(EngineLike).items():
        value = getattr(engine, name)
        if not (isinstance(member, property) or member == "attribute"):
            assert callable(value), name
    assert engine.models == [model] and list(engine.optimizers) == [opt]
    assert [n for n, _ in engine.named_parameters()] == ["weight", "bias"]


def test_importing_it_imports_nothing_of_ampkit_nor_torch():
    code = (
        "import sys, ampkit.training; before = set(sys.modules); import ampkit.training._engine_protocol; "
        "print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['ampkit.training._engine_protocol']"


# A user's hooks as a type checker reads them: typed by the Engine class, by the protocol, or not at all, each is
# taken (a StepHook subclass may narrow the engine to Engine); a hook whose methods take something else is refused.
USER_HOOKS = """\
from ampkit import Engine
from ampkit.training import StepHook
from ampkit.training._engine_protocol import EngineLike
class ByClass(StepHook):
    def after_optimizer_step(self, engine: Engine) -> None: ...
class ByProtocol:
    def before_optimizer_step(self, engine: EngineLike) -> None: ...
class Plain:
    def after_backward(self, engine): ...
class Wrong:
    def after_optimizer_step(self, engine: int) -> None: ...
engine = Engine(hooks=[ByClass(), ByProtocol(), Plain()])
engine.add_hook(ByClass())
engine.add_hook(Wrong())
"""


def test_a_type_checker_takes_hooks_typed_by_the_engine_class_or_the_protocol(mypy_on_user_code: Callable[[str], str]) -> None:
    out = mypy_on_user_code(USER_HOOKS)
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "user.py:14:" in errors[0] and "[arg-type]" in errors[0], out
