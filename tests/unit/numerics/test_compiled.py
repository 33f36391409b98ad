"""The compiled step against the eager one: agreement through AOTAutograd, and compilers that change one module's
gradient, the output dtype or the loss are caught and named."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ampkit.numerics._compare import reference_step
from ampkit.numerics._compiled import FLOOR, check_compiled

_spec = importlib.util.spec_from_file_location("ampkit_test_fragile_cc", Path(__file__).with_name("fragile.py"))
fragile = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(fragile)  # type: ignore[union-attr]
CE = nn.functional.cross_entropy
HEAD_WEIGHT = (4, 32)
"""The shape of the last Linear's weight, module "4": no other parameter has it."""


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    # Each test compiles new models through the same code; a fresh cache keeps dynamo's recompile limit out of it.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g)


def _check(precision: str, compile: Any) -> Any:
    model, batch = _net(), _batch()
    return check_compiled(model, batch, CE, precision, reference=reference_step(model, batch, CE), compile=compile)


def _casts_output(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """A compiler whose graph hands its output back in fp32 where eager's is bf16."""
    return lambda *args: [t.float() for t in gm(*args)]


def _scales_output(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """A compiler whose graph's output is 10% off: a different loss."""
    return lambda *args: [t * 1.1 for t in gm(*args)]


def test_a_compiled_step_through_aot_autograd_agrees_with_eager() -> None:
    check = _check("bf16-mixed", {"backend": "aot_eager"})
    assert check.agrees and check.compiled == [""] and check.diverging == []
    assert check.loss == pytest.approx(check.eager_loss, rel=FLOOR) and check.output_dtypes == ["bfloat16"] == check.eager_output_dtypes
    # The limits are the policy's own errors against fp32: bf16 rounding, above the floor.
    assert all(m.rel_error is not None and m.rel_error <= max(m.noise or 0.0, FLOOR) for m in check.modules.values())
    assert max(m.noise or 0.0 for m in check.modules.values()) > FLOOR
    assert check.verdict.startswith("compiled step agrees with eager under bf16-mixed") and check.advice == []


def test_a_compiler_that_changes_one_gradient_by_one_percent_is_caught_and_the_module_named() -> None:
    check = _check("bf16-mixed", {"backend": fragile.grad_scaling_backend(HEAD_WEIGHT)})
    assert not check.agrees and check.diverging == ["4"]
    head = check.modules["4"]
    assert head.rel_error == pytest.approx(0.01, rel=0.05) and head.rel_error > max(head.noise or 0.0, FLOOR)  # type: ignore[operator]
    assert check.loss_agrees and check.dtypes_agree  # the forward is untouched
    assert "diverges from eager under bf16-mixed" in check.verdict and "4 off by 1.0e-02" in check.verdict
    assert any("torch.compiler.disable" in a for a in check.advice) and check.to_dict()["diverging"] == ["4"]


def test_a_compiler_that_changes_the_output_dtype_is_caught() -> None:
    check = _check("bf16-mixed", {"backend": _casts_output})
    assert not check.agrees and not check.dtypes_agree
    assert "output float32 where eager gives bfloat16" in check.verdict


def test_a_compiler_that_changes_the_loss_is_caught() -> None:
    check = _check("32-true", {"backend": _scales_output})
    assert check.loss_limit == FLOOR  # 32-true is the reference itself: only the floor is allowed
    assert not check.loss_agrees and "vs eager" in check.verdict


def test_nothing_to_compile_is_refused() -> None:
    model, batch = _net(), _batch()
    with pytest.raises(ValueError, match="nothing to compile"):
        check_compiled(model, batch, CE, "bf16-mixed", reference=reference_step(model, batch, CE), compile=False)


@pytest.mark.slow  # inductor compiles C++ kernels: several seconds
def test_inductor_with_dropout_agrees_with_eager() -> None:
    # Inductor's own random numbers would give other dropout masks than eager's; the check asks for eager's.
    check = _check("bf16-mixed", True)
    assert check.agrees, check.verdict
