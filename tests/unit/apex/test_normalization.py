"""apex.normalization on torch's LayerNorm/RMSNorm: values against torch's modules, output dtypes as Apex's."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ampkit.apex.normalization import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm


def _x(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0)).to(dtype)


def _randomise(module: nn.Module) -> nn.Module:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return module


def test_fused_layer_norm_is_layer_norm():
    norm = _randomise(FusedLayerNorm((5, 8)))
    ref = _randomise(nn.LayerNorm((5, 8), eps=1e-5))
    assert isinstance(norm, nn.LayerNorm) and norm.eps == 1e-5 and norm.normalized_shape == (5, 8)
    torch.testing.assert_close(norm(_x()), ref(_x()), rtol=0, atol=0)
    bare = FusedLayerNorm(8, eps=1e-3, elementwise_affine=False, memory_efficient=True)
    assert bare.weight is None and bare.memory_efficient
    torch.testing.assert_close(bare(_x()), F.layer_norm(_x(), (8,), eps=1e-3), rtol=0, atol=0)


def test_fused_rms_norm_is_rms_norm():
    norm = _randomise(FusedRMSNorm(8))
    ref = _randomise(nn.RMSNorm(8, eps=1e-5))
    assert isinstance(norm, nn.RMSNorm) and norm.eps == 1e-5
    torch.testing.assert_close(norm(_x()), ref(_x()), rtol=0, atol=0)
    assert FusedRMSNorm(8, elementwise_affine=False).weight is None


@pytest.mark.parametrize("cls", [FusedLayerNorm, FusedRMSNorm])
def test_fused_norms_return_the_input_dtype_over_fp32_weights(cls: type):
    # amp O2's layout: bf16 activations, fp32 norm weights. The result is bf16, normalised in fp32, no warning.
    norm = _randomise(cls(8))
    out = norm(_x(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, norm(_x(torch.bfloat16).float()).to(torch.bfloat16), rtol=0, atol=0)
    x = _x(torch.bfloat16).requires_grad_()
    norm(x).sum().backward()
    assert x.grad.dtype == torch.bfloat16 and norm.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("cls", [MixedFusedLayerNorm, MixedFusedRMSNorm])
def test_mixed_norms_return_the_parameter_dtype(cls: type):
    fp32_weights = _randomise(cls(8))
    bf16_weights = _randomise(cls(8)).bfloat16()
    x32, x16 = _x(), _x(torch.bfloat16)
    # fp32 activations through bf16 weights: computed in fp32 (the weights upcast), returned in bf16.
    out = bf16_weights(x32)
    assert out.dtype == torch.bfloat16
    reference = cls(8)
    reference.load_state_dict({k: v.float() for k, v in bf16_weights.state_dict().items()})
    torch.testing.assert_close(out, reference(x32).to(torch.bfloat16), rtol=0, atol=0)
    # bf16 activations through fp32 weights: fp32 out, equal to normalising the upcast input.
    out = fp32_weights(x16)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, fp32_weights(x16.float()), rtol=0, atol=0)
    # Same dtypes: the plain module.
    plain = (nn.LayerNorm(8) if cls is MixedFusedLayerNorm else nn.RMSNorm(8, eps=1e-5))
    plain.load_state_dict(fp32_weights.state_dict())
    torch.testing.assert_close(fp32_weights(x32), plain(x32), rtol=0, atol=0)
    # Gradients reach the weights in their own dtype.
    bf16_weights(x32).float().sum().backward()
    assert bf16_weights.weight.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("cls", [MixedFusedLayerNorm, MixedFusedRMSNorm])
def test_mixed_norms_refuse_no_affine_and_log_ignored_kwargs(cls: type, caplog: pytest.LogCaptureFixture):
    with pytest.raises(ValueError, match=r"elementwise_affine=False is not supported.*use FusedLayerNorm or FusedRMSNorm"):
        cls(8, elementwise_affine=False)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        norm = cls(8, 1e-6, elementwise_affine=True, memory_efficient=True, sequence_parallel=True)
    assert norm.eps == 1e-6 and norm.weight is not None
    assert "ignoring sequence_parallel" in caplog.text and "elementwise_affine" not in caplog.text


def test_under_autocast_norms_follow_torchs_rules():
    # Whatever autocast does to torch's LayerNorm on this device, it does to FusedLayerNorm; the Mixed* norms
    # still return their parameters' dtype.
    x = _x(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert FusedLayerNorm(8)(x).dtype == nn.LayerNorm(8)(x).dtype
        assert FusedLayerNorm(8)(x.float()).dtype == nn.LayerNorm(8)(x.float()).dtype
        assert MixedFusedLayerNorm(8)(x).dtype == MixedFusedRMSNorm(8)(x).dtype == torch.float32
        assert FusedRMSNorm(8)(x).dtype == torch.bfloat16


def test_importable_under_apex_names():
    from ampkit.apex import install, uninstall

    install()
    try:
        from apex.normalization import FusedLayerNorm as by_apex

        assert by_apex is FusedLayerNorm
    finally:
        uninstall()
