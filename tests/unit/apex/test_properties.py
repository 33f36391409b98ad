"""The O0-O3 property table and the resolution of the 16-bit type."""

from __future__ import annotations

import pytest
import torch

from ampkit.apex._properties import OPT_LEVELS, check_opt_level, resolve_half_dtype, resolve_properties


def test_the_apex_table():
    rows = {k: (p.cast_model_type, p.patch_torch_functions, p.keep_batchnorm_fp32, p.master_weights, p.loss_scale) for k, p in OPT_LEVELS.items()}
    assert rows == {
        "O0": (torch.float32, False, None, False, 1.0),
        "O1": (None, True, None, None, "dynamic"),
        "O2": (torch.float16, False, True, True, "dynamic"),
        "O3": (torch.float16, False, False, False, 1.0),
    }


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_cast_model_type_is_the_devices_16_bit_type(level):
    assert resolve_properties(level, torch.bfloat16, {}).cast_model_type == torch.bfloat16
    assert resolve_properties(level, torch.float16, {}).cast_model_type == torch.float16
    assert resolve_properties(level, torch.bfloat16, {"cast_model_type": torch.float16}).cast_model_type == torch.float16


def test_string_overrides_from_argparse():
    p = resolve_properties("O2", torch.float16, {"keep_batchnorm_fp32": "True", "loss_scale": "128.0"})
    assert p.keep_batchnorm_fp32 is True and p.loss_scale == 128.0


@pytest.mark.parametrize("typed, meant", [("01", "O1"), ("o2", "O2"), ("03", "O3")])
def test_opt_level_typos(typed, meant):
    with pytest.raises(ValueError, match=f"Did you mean '{meant}'"):
        check_opt_level(typed)


def test_half_dtype_resolution(monkeypatch):
    monkeypatch.delenv("AMPKIT_APEX_HALF_DTYPE", raising=False)
    assert resolve_half_dtype("cpu") == torch.bfloat16 and resolve_half_dtype("cuda") == torch.float16
    monkeypatch.setenv("AMPKIT_APEX_HALF_DTYPE", "bf16")
    assert resolve_half_dtype("cuda") == torch.bfloat16
    assert resolve_half_dtype("cuda", torch.float16) == torch.float16  # the argument beats the environment
    with pytest.raises(ValueError, match="16-bit float type"):
        resolve_half_dtype("cpu", torch.float32)
