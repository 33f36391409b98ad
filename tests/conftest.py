"""Fixtures shared by every test: leak guards that keep one test's global state out of the next."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """Fail a test that leaves autocast on, or changes the default dtype or matmul precision."""
    dtype, precision = torch.get_default_dtype(), torch.get_float32_matmul_precision()
    yield
    leaked = []
    if torch.is_autocast_enabled("cpu"):
        leaked.append("CPU autocast still enabled")
    if torch.get_default_dtype() != dtype:
        leaked.append(f"default dtype changed to {torch.get_default_dtype()}")
        torch.set_default_dtype(dtype)
    if torch.get_float32_matmul_precision() != precision:
        leaked.append(f"float32 matmul precision changed to {torch.get_float32_matmul_precision()}")
        torch.set_float32_matmul_precision(precision)
    assert not leaked, "; ".join(leaked)


@pytest.fixture
def hf_gpt2() -> str:
    """Path of examples/train_hf_gpt2.py (a random-init transformers GPT-2, dict batches, ModelOutput with .loss):
    ``f"{hf_gpt2}:model"`` and ``f"{hf_gpt2}:data"`` are what --model and --data take."""
    pytest.importorskip("transformers", reason="Requires: transformers (pip install -e '.[hf]')")
    return str(Path(__file__).resolve().parents[1] / "examples" / "train_hf_gpt2.py")
