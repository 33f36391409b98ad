"""Statistics checked against direct element-wise computation on the same values (the control)."""

from __future__ import annotations

import math

import pytest
import torch

from ampkit.numerics._formats import BF16, FP16
from ampkit.numerics._stats import E_LO, StatsAccumulator, TensorStats, read_summaries


def _values(seed: int = 0, n: int = 20000, device: torch.device | str = "cpu") -> torch.Tensor:
    # Log-uniform magnitudes over 2^-60..2^20 with random signs, some zeros and non-finite values: every region.
    g = torch.Generator().manual_seed(seed)
    x = torch.pow(2.0, torch.empty(n).uniform_(-60, 20, generator=g)) * torch.randint(0, 2, (n,), generator=g).mul(2).sub(1)
    x[:50] = 0.0
    x[50:53] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    return x.to(device)  # drawn on the CPU and moved, so every device sees the same values


def _summary(x: torch.Tensor, chunks: int = 3) -> TensorStats:
    acc = StatsAccumulator()
    for part in x.chunk(chunks):  # several updates must add up to one
        acc.update(part)
    return acc.summary()


def test_shares_match_direct_counts(device: torch.device) -> None:
    x = _values(device=device)
    s = _summary(x)
    finite = torch.isfinite(x)
    a = x.abs()
    nonzero = finite & (a > 0)
    assert s.count == x.numel() and s.zeros == 50 and s.nonfinite == 3
    assert s.underflow("fp16") == int((nonzero & (a < 2.0**-24)).sum())
    assert s.subnormal("fp16") == int((nonzero & (a >= 2.0**-24) & (a < 2.0**-14)).sum())
    assert s.overflow["fp16"] == int((finite & (a > 65504)).sum())
    assert s.share("fp16", "overflow") == pytest.approx(int((finite & (a > 65504)).sum()) / x.numel())
    assert s.max_abs == float(a[finite].max()) and s.min_abs_nonzero == float(a[nonzero].min())
    assert sum(s.histogram) == int(nonzero.sum())


@pytest.mark.parametrize("k", [0, 5, 16, 30])
def test_scaled_underflow_is_exact(k: int, device: torch.device) -> None:
    x = _values(1, device=device)
    s = _summary(x)
    scaled = x * 2.0**k  # exact in fp32 for these magnitudes (no fp32 overflow below 2^50)
    nonzero = torch.isfinite(scaled) & (scaled != 0)
    assert s.underflow("fp16", k) == int((nonzero & (scaled.abs() < 2.0**-24)).sum())


def test_bf16_thresholds(device: torch.device) -> None:
    x = torch.tensor([2.0**-134, 2.0**-130, 2.0**-120, 3.0e38, 1.0], device=device)
    s = _summary(x, chunks=1)
    assert (s.underflow("bf16"), s.subnormal("bf16"), s.overflow["bf16"]) == (1, 1, 0)
    assert s.overflow["fp16"] == 1
    assert BF16.exponent_range == (-133, 127) and FP16.exponent_range == (-24, 15)


def test_rounding_error_matches_a_direct_cast(device: torch.device) -> None:
    x = torch.randn(5000, generator=torch.Generator().manual_seed(2)) * 1e-3
    x = x.to(device)
    s = _summary(x)
    for fmt in (FP16, BF16):
        direct = float((x - x.to(fmt.dtype).float()).double().norm() / x.double().norm())
        assert s.rel_error(fmt) == pytest.approx(direct, rel=1e-6)
    assert s.rel_error("bf16") > 4 * s.rel_error("fp16")  # 3 fewer mantissa bits


def test_overflowing_values_are_not_counted_as_rounding_error() -> None:
    s = _summary(torch.tensor([1e6, 1.0]), chunks=1)
    assert s.overflow["fp16"] == 1 and s.rel_error("fp16") == 0.0


def test_merge_equals_the_statistics_of_the_concatenation() -> None:
    a, b = _values(3, 3000), _values(4, 5000)
    merged = TensorStats.merge([_summary(a), _summary(b)])
    whole = _summary(torch.cat([a, b]), chunks=1)
    assert merged.histogram == whole.histogram
    assert (merged.count, merged.zeros, merged.nonfinite, merged.overflow) == (whole.count, whole.zeros, whole.nonfinite, whole.overflow)
    assert merged.rel_error("fp16") == pytest.approx(whole.rel_error("fp16"), rel=1e-9)


def test_to_dict_trims_the_histogram_and_keeps_the_exponents() -> None:
    d = _summary(torch.tensor([0.0, 0.5, 3.0, 2.0**-30]), chunks=1).to_dict()
    assert d["histogram"]["exponent_lo"] == -30
    counts = d["histogram"]["counts"]
    assert len(counts) == 1 - (-30) + 1 and counts[0] == 1 and counts[-1] == 1  # 2^-30 ... 3.0 (exponent 1)
    assert d["zero_share"] == 0.25 and math.isclose(d["range_bits"], math.log2(3.0 / 2.0**-30))


def test_ignores_integer_tensors_and_empty_accumulators() -> None:
    acc = StatsAccumulator()
    acc.update(torch.arange(4))
    assert acc.summary().count == 0 and acc.summary().histogram[0 - E_LO] == 0


def test_unknown_format_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="use one of fp16, bf16"):
        _summary(torch.ones(2)).share("fp8", "underflow")


def test_one_transfer_reads_each_accumulator_as_reading_it_alone(device: torch.device) -> None:
    accs = []
    for i, values in enumerate(([0.0, 1.0, 2.0**-30, float("inf"), -1e5], [float("nan"), 3.0], [2.0**-20] * 3)):
        acc = StatsAccumulator(rounding=i % 2 == 0)  # mixed layouts: with and without rounding sums
        acc.update(torch.tensor(values, device=device))
        accs.append(acc)
    accs.insert(1, StatsAccumulator())  # never updated: no state at all
    stats, values = read_summaries(accs, [torch.tensor(2.0**16, device=device), torch.tensor(0.1, dtype=torch.float64, device=device)])
    assert stats == [read_summaries([acc])[0][0] for acc in accs]
    assert [s.count for s in stats] == [5, 0, 2, 3] and stats[0].overflow["fp16"] == 1 and stats[2].nonfinite == 1
    assert stats[2].squares is None and stats[0].squares is not None
    assert values == [2.0**16, 0.1]


def test_bounded_reading_estimates_shares_and_never_misses_the_extremes(device: torch.device) -> None:
    x = _values(5, 400_000, device=device)
    x[50:53] = 1.0  # no non-finite values in the bulk...
    x[234_567] = 3.0e6  # ...but one overflow far above the rest, which the strided subset is unlikely to hit
    exact, cheap = StatsAccumulator(rounding=False), StatsAccumulator(rounding=False, max_values=2**14)
    exact.update(x)
    cheap.update(x)
    e, c = exact.summary(), cheap.summary()
    assert c.count <= 2**14 < e.count
    for what in ("underflow", "subnormal", "overflow"):
        assert c.share("fp16", what) == pytest.approx(e.share("fp16", what), abs=0.02)
    assert c.max_abs == e.max_abs == 3.0e6  # exact: the loss-scale headroom is read from it
    x[123_457] = float("nan")  # one NaN anywhere is reported, even when the subset skips it
    nan = StatsAccumulator(rounding=False, max_values=2**14)
    nan.update(x)
    assert nan.summary().nonfinite >= 1


def test_16_bit_tensors_are_read_as_their_exact_fp32_values(device: torch.device, half_dtype: torch.dtype) -> None:
    """The sampler reads gradients in the dtype the backward left them (fp16 on CUDA): control, the same values
    upcast to fp32 by hand (exact), read by the same accumulator on the same device."""
    x = _values(7, 5000, device=device).clamp(-60000, 60000).to(half_dtype)
    assert x.dtype == half_dtype and x.device.type == device.type
    assert _summary(x) == _summary(x.float())


def test_bounded_reading_of_a_small_tensor_is_exact() -> None:
    x = _values(6, 1000)
    exact, cheap = StatsAccumulator(), StatsAccumulator(max_values=1000)
    exact.update(x)
    cheap.update(x)
    assert cheap.summary() == exact.summary()


def test_the_accelerator_histogram_counts_what_bincount_counts_on_every_exponent() -> None:
    # Every binary exponent fp32 has (zero, subnormals, the largest normals), in uneven numbers, as update() bins them.
    from ampkit.numerics._stats import E_LO, NBINS, exponent_histogram

    g = torch.Generator().manual_seed(0)
    values = torch.ldexp(torch.rand(50_000, generator=g) + 0.5, torch.randint(-149, 128, (50_000,), generator=g))
    values = torch.cat([values, torch.zeros(7), torch.full((300,), 2.0**-3)])
    bins = torch.frexp(values).exponent - (E_LO + 1)
    assert int(bins.min()) >= 0 and int(bins.max()) < NBINS
    cpu, shared = exponent_histogram(bins), exponent_histogram(bins, shared_memory=True)
    assert shared.dtype == torch.int64 and torch.equal(shared, cpu) and int(shared.sum()) == values.numel()
