"""Accelerate keeps its process state in singletons (``AcceleratorState``, ``GradientState``): an ``Accelerator`` built
with one mixed precision refuses the next one built with another in the same process. Each test starts and ends
with them reset, and with none of the launcher's variables a test may set, so a control run and an ampkit run can
sit in one test and no test's state reaches the next."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.importorskip("accelerate", reason="Requires: accelerate (pip install -e '.[hf]')")

from accelerate.state import AcceleratorState, GradientState

LAUNCHER_VARIABLES = ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "ACCELERATE_USE_MEGATRON_LM",
                      "ACCELERATE_GRADIENT_ACCUMULATION_STEPS")


def reset_accelerate() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in LAUNCHER_VARIABLES if name in os.environ}
    reset_accelerate()
    yield
    reset_accelerate()
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(saved)
