"""Fixtures of the Trainer tests: Accelerate's process state reset around each test (a native ``bf16=True`` control and
an ampkit run share a test), no launcher variable leaking in, and the hub kept offline (nothing is downloaded: the
models are built from configs)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.importorskip("transformers", reason="Requires: transformers (pip install -e '.[hf]')")
pytest.importorskip("datasets", reason="Requires: datasets (pip install -e '.[hf]')")

from accelerate.state import AcceleratorState, GradientState

LAUNCHER_VARIABLES = ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "ACCELERATE_USE_MEGATRON_LM")


@pytest.fixture(autouse=True)
def _fresh_accelerate_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    saved = {name: os.environ.pop(name) for name in LAUNCHER_VARIABLES if name in os.environ}
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(saved)
