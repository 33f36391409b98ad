"""The engine's read side: its settings and parts read as before, and assigning one is refused, naming what to do."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.policy import Policy
from ampkit.scaling import StepScaler
from ampkit.training._optimizer_step import OptimizerStep


def _engine(**kwargs: object) -> tuple[Engine, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    engine = Engine(**kwargs)  # type: ignore[arg-type]
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return engine, model


def _train(engine: Engine, model: nn.Module, steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps * engine.accumulate):
        with engine.autocast():
            loss = model(torch.randn(3, 4, generator=g)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    return [p.detach().clone() for p in model.parameters()]


REFUSED = [
    ("accumulate", 4, r"Engine\(\.\.\., accumulate=\.\.\.\)"),
    ("clip_grad_norm", 0.1, r"Engine\(\.\.\., clip_grad_norm=\.\.\.\)"),
    ("clip_grad_value", 0.1, r"Engine\(\.\.\., clip_grad_value=\.\.\.\)"),
    ("skip_nonfinite", False, r"Engine\(\.\.\., skip_nonfinite=\.\.\.\)"),
    ("policy", "bf16-mixed", r"Engine\(\.\.\., precision=\.\.\.\)"),
    ("on_oom", "raise", r"Engine\(\.\.\., on_oom=\.\.\.\)"),
    ("scaler", None, r"optimizer step built by setup\(\) owns it: pass Engine\(\.\.\., scaler=\.\.\.\)"),
    ("masters", None, r"optimizer step built by setup\(\) owns them"),
    ("optimizers", [], r"engine\.setup\(model, \*optimizers\)"),
    ("schedulers", [], r"schedulers=\.\.\."),
    ("hooks", [], r"engine\.add_hook\(hook\)"),
    ("steps", 0, r"engine\.load\(path\)"),
    ("device", torch.device("cpu"), r"setup\(\) makes it"),
]
SETTINGS = {"precision": "bf16-mixed", "accumulate": 2, "clip_grad_norm": 1.0, "scaler": 1024.0}


@pytest.mark.parametrize("name, value, fix", REFUSED, ids=[r[0] for r in REFUSED])
def test_assigning_a_setting_or_a_part_is_refused_with_the_line_to_write(name: str, value: object, fix: str) -> None:
    engine = Engine(**SETTINGS)  # type: ignore[arg-type]
    before = getattr(engine, name)
    with pytest.raises(AttributeError, match=rf"engine\.{name} is read-only: .*{fix}"):
        setattr(engine, name, value)
    assert getattr(engine, name) is before


def test_a_run_whose_assignments_were_refused_trains_as_one_never_touched() -> None:
    engine, model = _engine(**SETTINGS)
    for name, value, _ in REFUSED:
        with pytest.raises(AttributeError):
            setattr(engine, name, value)
    control, control_model = _engine(**SETTINGS)
    for a, b in zip(_train(engine, model, 1), _train(control, control_model, 1)):
        assert torch.equal(a, b)


def test_a_misspelt_setting_is_refused_instead_of_changing_nothing() -> None:
    engine = Engine(clip_grad_norm=1.0)
    with pytest.raises(AttributeError, match=r"no setting 'clip_grad_nrom' \(is it misspelt\?\)"):
        engine.clip_grad_nrom = 0.5  # type: ignore[attr-defined]


def test_the_settings_read_back_as_given() -> None:
    engine = Engine("16-mixed", accumulate=3, clip_grad_value=0.5, on_oom="raise", micro_batch_rows=7)
    assert (engine.policy.name, engine.accumulate, engine.clip_grad_norm, engine.clip_grad_value) == ("16-mixed", 3, None, 0.5)
    assert (engine.skip_nonfinite, engine.on_oom, engine.micro_batch_rows, engine.strategy) == (True, "raise", 7, None)
    assert type(engine.scaler).__name__ == "DynamicLossScaler" and engine.masters is None and engine.optimizers == []


def test_the_parts_are_the_optimizer_steps_own() -> None:
    engine, _ = _engine(precision="bf16-true-masters", clip_grad_norm=1.0)
    step = engine.optimizer_step
    assert isinstance(step, OptimizerStep)
    assert engine.masters is step.masters is not None and engine.scaler is step.scaler is None
    assert engine.optimizers is step.optimizers and engine.collapse is step.collapse
    assert step.settings.clip_grad_norm == engine.clip_grad_norm == 1.0


def test_micro_batch_rows_is_the_one_to_assign_and_is_checked() -> None:
    engine, _ = _engine()
    engine.micro_batch_rows = 16
    assert engine.micro_batch_rows == 16 and engine.state_dict()["micro_batch_rows"] == 16
    with pytest.raises(ValueError, match=r"micro_batch_rows must be an int >= 1 or None"):
        engine.micro_batch_rows = 0
    assert engine.micro_batch_rows == 16



# The read-only attributes, as the engine's class holds them (Engine.policy is the descriptor itself).
ReadOnly = type(Engine.policy)
OWNER = next(k for k in Engine.__mro__ if "policy" in vars(k))
READ_ONLY = sorted(name for name, value in vars(OWNER).items() if isinstance(value, ReadOnly))


def test_every_read_only_attribute_keeps_its_docstring_for_help() -> None:
    assert len(READ_ONLY) == 23 and isinstance(Engine.policy, property)  # help() lists them as read-only properties
    assert all(inspect.getdoc(getattr(Engine, name)) for name in READ_ONLY)
    assert inspect.getdoc(Engine.policy) == "The precision policy (a :class:`~ampkit.policy.Policy`)."


@pytest.mark.parametrize("name", READ_ONLY)
def test_assigning_past_the_engine_s_setattr_is_refused_with_the_same_fix(name: str) -> None:
    # object.__setattr__ skips the engine's own __setattr__ and reaches the attribute's descriptor.
    engine = Engine("16-mixed")
    before = getattr(engine, name)
    with pytest.raises(AttributeError) as descriptor:
        object.__setattr__(engine, name, None)
    with pytest.raises(AttributeError) as engine_side:
        setattr(engine, name, None)
    assert str(descriptor.value) == str(engine_side.value) and f"engine.{name} is read-only: " in str(descriptor.value)
    assert getattr(engine, name) is before


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"  # as mypy names a class: where it is defined


# What a user's type checker reads off an engine: each part with its own type, not Any, and an assignment flagged.
USER_CODE = """\
from ampkit import Engine
engine = Engine("16-true-masters")
reveal_type(engine.policy)
reveal_type(engine.scaler)
reveal_type(engine.masters)
reveal_type(engine.clip_grad_norm)
reveal_type(engine.optimizers)
reveal_type(Engine.policy)
engine.clip_grad_norm = 2.0
"""
REVEALED = [
    _qualified(Policy),
    f"{_qualified(StepScaler)} | None",
    f"{_qualified(Policy.master_store)} | None",  # MasterWeights
    "float | None",
    "list[Any]",  # list[torch.optim.Optimizer] where torch is analysed: skipped below, for speed
    f"{_qualified(ReadOnly)}[{_qualified(OWNER)}, {_qualified(Policy)}]",
]


def test_a_type_checker_reads_each_part_with_its_type_and_flags_an_assignment(mypy_on_user_code: Callable[[str], str]) -> None:
    out = mypy_on_user_code(USER_CODE)
    lines = out.splitlines()
    revealed = [line.split('Revealed type is "', 1)[1].rstrip('"') for line in lines if "Revealed type is" in line]
    assert revealed == REVEALED, out
    errors = [line for line in lines if ": error:" in line]
    assert len(errors) == 1 and "user.py:9:" in errors[0] and "[assignment]" in errors[0], out
