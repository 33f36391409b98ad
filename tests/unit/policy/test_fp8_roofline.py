"""The fp8 roofline against hand-computed times, and the tokens each Linear sees."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.policy._fp8_roofline import fp8_fits, measure_linear_tokens, predict_linear, predict_model
from ampkit.policy._gpu_specs import GpuSpec, gpu_spec

# Round numbers, so the hand computations below are plain arithmetic: 100 TFLOP/s bf16, 200 fp8, 1 TB/s.
TOY = GpuSpec("toy", bf16_tflops=100.0, tf32_tflops=50.0, fp32_tflops=10.0, fp8_tflops=200.0, bandwidth_tbs=1.0)


def test_a_compute_bound_layer_matches_the_hand_computed_roofline() -> None:
    m, k, n = 8192, 8192, 8192  # 2*m*n*k = 1.0995e12 FLOPs per matmul
    c = predict_linear(TOY, m, k, n)
    flops = 2 * 8192**3
    mat = 8192 * 8192  # every tensor here is one 8192 x 8192 matrix
    # bf16: three matmuls at 100 TFLOP/s (their 6 matrices of 2 bytes need 0.8 ms at 1 TB/s, under the 11 ms of
    # compute); then autocast's fp32->bf16 weight copy (6 bytes/element) and the bf16->fp32 grad copy (6 bytes).
    assert c.bf16_s == pytest.approx(3 * flops / 100e12 + 12 * mat / 1e12, rel=1e-12)
    # fp8: three matmuls at 200 TFLOP/s; casts: input and grad output twice each at 5 bytes/element, the fp32
    # weight twice at 9, plus the grad copy's 6.
    assert c.fp8_matmul_s == pytest.approx(3 * flops / 200e12, rel=1e-12)
    assert c.fp8_cast_s == pytest.approx((2 * (5 + 5 + 9) + 6) * mat / 1e12, rel=1e-12)
    assert c.fits and c.pays and c.speedup == pytest.approx(c.bf16_s / (c.fp8_matmul_s + c.fp8_cast_s))


def test_a_memory_bound_layer_is_predicted_slower_in_fp8() -> None:
    m, k, n = 64, 4096, 4096  # a decode-sized batch: the weight's bytes dominate every matmul
    c = predict_linear(TOY, m, k, n)
    w, x, y = k * n, m * k, m * n
    bf16_mm = 3 * max(2 * m * n * k / 100e12, 2 * (w + x + y) / 1e12)
    assert 2 * (w + x + y) / 1e12 > 2 * m * n * k / 100e12  # really memory-bound at these sizes
    assert c.bf16_s == pytest.approx(bf16_mm + 12 * w / 1e12, rel=1e-12)
    fp8_mm = (
        max(2 * m * n * k / 200e12, (x + w + 2 * y) / 1e12)
        + max(2 * m * n * k / 200e12, (y + w + 2 * x) / 1e12)
        + max(2 * m * n * k / 200e12, (y + x + 2 * w) / 1e12)
    )
    assert c.fp8_matmul_s == pytest.approx(fp8_mm, rel=1e-12)
    assert not c.pays and c.speedup < 1


def test_dimensions_that_are_not_multiples_of_16_never_pay() -> None:
    assert fp8_fits(4096, 4096) and not fp8_fits(4096, 50257) and not fp8_fits(4100, 4096)
    c = predict_linear(TOY, 65536, 8192, 50264)  # 50264 = 8 * 6283: large enough to win, but no fp8 kernel takes it
    assert c.speedup > 1 and not c.fits and not c.pays


def test_the_break_even_grows_with_the_ratio_of_compute_to_bandwidth() -> None:
    # The same layer pays on a GPU whose fp8 peak is high relative to its bandwidth sooner than on one where it is low.
    fast_memory = GpuSpec("a", 100.0, 50.0, 10.0, 200.0, bandwidth_tbs=4.0)
    slow_memory = GpuSpec("b", 100.0, 50.0, 10.0, 200.0, bandwidth_tbs=0.5)
    assert predict_linear(fast_memory, 4096, 4096, 4096).speedup > predict_linear(slow_memory, 4096, 4096, 4096).speedup


def test_bad_input_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="no fp8 tensor cores"):
        predict_linear(gpu_spec("A100"), 8192, 4096, 4096)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be positive"):
        predict_linear(TOY, 0, 4096, 4096)


def test_predict_model_names_each_linear_and_takes_per_layer_tokens() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 16)))
    rows = predict_model(model, TOY, {"0": 100, "2.0": 7})
    assert [(r.name, r.cost.tokens, r.cost.in_features, r.cost.out_features) for r in rows] == [("0", 100, 16, 32), ("2.0", 7, 32, 16)]
    assert [r.name for r in predict_model(model, TOY, {"0": 5})] == ["0"]  # a layer no forward reached is left out


def test_measure_linear_tokens_counts_the_rows_of_every_leading_dimension() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.head = nn.Linear(8, 3)
            self.unused = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.proj(x)[:, -1])  # the head sees only the last position

    net = Net()
    assert measure_linear_tokens(net, lambda: net(torch.zeros(4, 6, 8))) == {"proj": 24, "head": 4}
    assert not any(m._forward_pre_hooks for m in net.modules())  # the hooks are gone
