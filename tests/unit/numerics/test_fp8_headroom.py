"""fp8 headroom: the cast's figures against hand-computed controls, the captured operands against autograd, the
two recipes on a tensor with one huge row, a non-finite amax, and the cast against torchao's own."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from ampkit.numerics._fp8_headroom import (
    FLUSH_LIMIT,
    OPERANDS,
    fp8_cast_figures,
    fp8_headroom,
    fp8_round_trip,
    unit_roundoff,
)
from ampkit.numerics._fp8_table import headroom_rows, headroom_summary

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


def test_tiny_values_flush_and_the_error_is_what_they_and_the_rounding_lost() -> None:
    # amax 448 = e4m3's max: the scale is exactly 1, so the control is e4m3's grid itself. 1.0625 is the tie
    # between 1 and 1.125 (spacing 2^-3 in [1, 2)) and rounds to even, 1; 2^-8 is a subnormal that survives;
    # 1e-6 is far below half the smallest subnormal (2^-10) and flushes.
    big = [448.0, 1.0, 0.5, 3.0, 1.0625, 2.0**-8] * 15  # 90 values
    x = torch.tensor(big + [1e-6] * 10 + [0.0] * 5)
    amax, nonzero, flushed, err_sq, norm_sq = fp8_cast_figures(x, E4M3).tolist()
    assert (amax, nonzero, flushed) == (448.0, 100, 10)  # the zeros are not counted: 10% of nonzero values flush
    expected_err_sq = 15 * 0.0625**2 + 10 * 1e-6**2  # the ties' rounding, then the flushed values whole
    assert err_sq == pytest.approx(expected_err_sq, rel=1e-12)
    assert norm_sq == pytest.approx(float((x.double() ** 2).sum()), rel=1e-12)


def test_a_tensor_within_fp8s_normal_range_flushes_nothing_and_errs_within_rounding() -> None:
    torch.manual_seed(0)
    x = torch.empty(4096).uniform_(1.0, 100.0) * torch.randint(0, 2, (4096,)).mul(2).sub(1)  # 2 decades: all normal
    for dtype in (E4M3, E5M2):
        _, nonzero, flushed, err_sq, norm_sq = fp8_cast_figures(x, dtype).tolist()
        assert (nonzero, flushed) == (4096, 0)
        assert 0 < math.sqrt(err_sq / norm_sq) <= unit_roundoff(dtype)
    # An all-zero tensor: amax is floored at EPS (as torchao does), so the scale is finite and nothing is lost.
    assert fp8_cast_figures(torch.zeros(8), E4M3).tolist() == [0.0] * 5


def test_one_huge_row_flushes_the_others_tensorwise_but_not_rowwise() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    x[0] *= 1e6
    s_tensor = 448.0 / x.abs().max().double()
    s_rows = torch.exp2(torch.floor(torch.log2((448.0 / x.abs().amax(dim=1, keepdim=True).double()).float())))
    # The control: round-to-nearest-even sends to zero exactly what scales to at most half the smallest subnormal.
    half_subnormal = 2.0**-10
    expected_tensor = int(((x.abs() * s_tensor) <= half_subnormal).sum())
    expected_rows = int(((x.abs() * s_rows) <= half_subnormal).sum())
    tensorwise = fp8_cast_figures(x, E4M3).tolist()
    rowwise = fp8_cast_figures(x, E4M3, axis=-1, pow2=True).tolist()
    assert tensorwise[2] == expected_tensor and rowwise[2] == expected_rows
    assert expected_tensor > 0.9 * 63 * 32 and expected_rows < 0.01 * x.numel()  # 63 rows lost against none
    assert math.sqrt(rowwise[3] / rowwise[4]) <= unit_roundoff(E4M3)


class _TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def test_captured_operands_are_the_input_weight_and_autograds_gradient_of_the_output() -> None:
    torch.manual_seed(0)
    model, x, y = _TwoLayers(), torch.randn(32, 8), torch.randn(32, 4)
    h = fp8_headroom(model, (x, y), _mse)
    # The control: the same step by hand, each Linear's output gradient taken by autograd.
    h1 = model.fc1(x)
    out = model.fc2(torch.tanh(h1))
    g_h1, g_out = torch.autograd.grad(_mse(out, y), [h1, out])
    expected = {"fc1": {"input": x, "weight": model.fc1.weight, "grad_output": g_h1},
                "fc2": {"input": torch.tanh(h1), "weight": model.fc2.weight, "grad_output": g_out}}  # fmt: skip
    layers = {layer["name"]: layer for layer in h.layers}
    assert set(layers) == {"fc1", "fc2"}
    for name, operands in expected.items():
        for operand, tensor in operands.items():
            entry = layers[name]["operands"][operand]
            dtype = E5M2 if operand == "grad_output" else E4M3
            amax, nonzero, flushed, err_sq, norm_sq = fp8_cast_figures(tensor.detach(), dtype).tolist()
            assert entry["amax"] == pytest.approx(amax, rel=1e-6), (name, operand)
            assert (entry["nonzero"], entry["flushed"]) == (nonzero, flushed)
            assert entry["rel_error"] == pytest.approx(math.sqrt(err_sq / norm_sq), rel=1e-5)
    assert all(p.grad is None for p in model.parameters())  # the model is left untouched


def test_a_linear_called_twice_adds_up_both_calls() -> None:
    torch.manual_seed(0)
    fc = nn.Linear(8, 8)
    model = nn.Sequential(fc, nn.Tanh(), fc)
    x = torch.randn(16, 8)
    layer = fp8_headroom(model, (x, torch.randn(16, 8)), _mse).layers[0]
    assert layer["calls"] == 2
    assert layer["operands"]["input"]["nonzero"] == 2 * x.numel()
    assert layer["operands"]["weight"]["nonzero"] == fc.weight.numel()  # the weight once: one tensor, not two


def test_a_non_finite_amax_is_reported_first_and_the_json_stays_valid() -> None:
    torch.manual_seed(0)
    model = _TwoLayers()
    x = torch.randn(32, 8)
    x[3, 2] = float("inf")
    h = fp8_headroom(model, (x, torch.randn(32, 4)), _mse)
    worst = h.layers[0]
    assert worst["name"] == "fc1" and worst["flagged"] and worst["score"] is None
    assert worst["operands"]["input"]["nonfinite"] == "inf" and worst["operands"]["input"]["amax"] is None
    assert any("amax is inf" in p for p in worst["problems"])
    json.dumps(h.to_dict(), allow_nan=False)  # doctor.json is written without NaN or Infinity


def test_a_gradient_with_many_tiny_values_is_flagged_under_e5m2() -> None:
    # One target far off makes one output gradient column huge; the others' tiny values flush tensorwise.
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    y = torch.zeros(64, 4)
    y[0, 0] = 1e12  # the others sit ~1e-12 below it: under e5m2's 2^-16 subnormal once scaled
    h = fp8_headroom(model, (torch.randn(64, 8) * 1e-4, y), _mse)
    entry = h.layers[0]["operands"]["grad_output"]
    assert entry["format"] == "e5m2" and entry["flushed_share"] > FLUSH_LIMIT
    assert h.layers[0]["flagged"] and h.fine == 0
    assert any(p.startswith("grad_output:") and "flush" in p for p in h.layers[0]["problems"])


def test_a_model_without_linear_layers_has_no_headroom_rows() -> None:
    model = nn.Sequential(nn.Conv1d(2, 2, 3))
    h = fp8_headroom(model, (torch.randn(4, 2, 8), torch.randn(4, 2, 6)), _mse)
    assert h.layers == [] and h.to_dict()["fine"] == 0


def test_an_unknown_recipe_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="tensorwise, rowwise"):
        fp8_headroom(nn.Linear(2, 2), (torch.randn(2, 2), torch.randn(2, 2)), _mse, recipe="blockwise")


@pytest.mark.parametrize(("dtype", "axis", "pow2"), [(E4M3, None, False), (E5M2, None, False), (E4M3, -1, True), (E4M3, 0, True)])
def test_the_cast_matches_torchaos_own(dtype: torch.dtype, axis: int | None, pow2: bool) -> None:
    pytest.importorskip("torchao.float8", reason="Requires: torchao (the fp8 extra)")
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    torch.manual_seed(0)
    x = torch.randn(48, 32) * torch.logspace(-6, 0, 32)  # columns spanning six decades: some values flush
    x[5] *= 1e4  # and one huge row
    x[7], x[:, 3] = 0.0, 0.0  # and an all-zero row and column: amax is floored at EPS, no NaN scale
    granularity = ScalingGranularity.TENSORWISE if axis is None else ScalingGranularity.AXISWISE
    theirs = hp_tensor_to_float8_dynamic(
        x, dtype, LinearMMConfig(), scaling_granularity=granularity, axiswise_dim=axis, round_scales_to_power_of_2=pow2
    ).to_original_precision()
    ours = fp8_round_trip(x, dtype, axis=axis, pow2=pow2)
    assert torch.equal(ours, theirs)
    flushed = int(fp8_cast_figures(x, dtype, axis=axis, pow2=pow2)[2])
    assert flushed == int(((x != 0) & (theirs == 0)).sum()) > 0


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_conv1d_is_measured_as_the_linear_it_is_and_named(hf_conv1d: type[nn.Module], recipe: str) -> None:
    # The control: an nn.Linear holding the Conv1D's weight transposed, on the same batch.
    torch.manual_seed(0)
    conv = nn.Sequential(hf_conv1d(16, 8), nn.Tanh(), nn.Linear(16, 3))
    linear = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    with torch.no_grad():
        linear[0].weight.copy_(conv[0].weight.t())
        linear[0].bias.copy_(conv[0].bias)
    linear[2].load_state_dict(conv[2].state_dict())
    batch = (torch.randn(32, 8), torch.randint(0, 3, (32,)))
    got, control = ({layer["name"]: layer for layer in fp8_headroom(m, batch, nn.functional.cross_entropy, recipe=recipe).layers} for m in (conv, linear))
    assert got.keys() == control.keys() == {"0", "2"}
    assert got["0"]["kind"] == "Conv1D" and control["0"]["kind"] == "Linear" and got["0"]["shape"] == control["0"]["shape"] == [16, 8]
    for operand in OPERANDS:
        g, c = got["0"]["operands"][operand], control["0"]["operands"][operand]
        assert (g["format"], g["axis"], g["nonzero"], g["flushed"]) == (c["format"], c["axis"], c["nonzero"], c["flushed"])
        assert g["amax"] == pytest.approx(c["amax"], rel=1e-6) and g["rel_error"] == pytest.approx(c["rel_error"], rel=1e-5)
    data = fp8_headroom(conv, batch, nn.functional.cross_entropy, recipe=recipe).to_dict()
    assert "1 of the 2 layers is Hugging Face Conv1D" in headroom_summary(data) and "torchao" in headroom_summary(data)
    assert sorted(row[0] for row in headroom_rows(data).rows) == ["0 (Conv1D)", "2"]
