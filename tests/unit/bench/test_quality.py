"""The eval metric against the reference's: the noise band, checked against scipy, and the one-sided judgement."""

from __future__ import annotations

import pytest
from scipy import stats

from ampkit.bench._quality import QUALITY, EvalNoise, Tolerance, judge, t_975

ACC = Tolerance("accuracy", higher_is_better=True, tolerance=0.02, relative=False)
PPL = Tolerance("perplexity", higher_is_better=False, tolerance=0.02, relative=True)


@pytest.mark.parametrize("df", [1, 2, 3, 7, 15, 30, 31, 500])
def test_the_t_quantile_is_students(df: int) -> None:
    exact = stats.t.ppf(0.975, df)
    assert t_975(df) == pytest.approx(exact, abs=5e-4 if df <= 30 else 5e-3)  # the table, then an expansion in 1/df


def test_better_is_never_worse_and_the_spread_it_shows_makes_a_worse_gap_unclear() -> None:
    values = [0.90, 0.95, 0.87, 0.83, None, float("nan")]  # reference 0.90: same, better by 5, worse by 3 and 7
    judged = judge(values, 0.90, ACC, None)
    assert [j.word for j in judged.runs] == ["as good", "better", "unclear", "worse", None, "worse"]
    assert judged.spread == pytest.approx(0.05) and judged.best == 1
    assert judged.runs[2].worse_by == pytest.approx(0.03) and judged.runs[1].worse_by == pytest.approx(-0.05)
    alone = judge([0.87], 0.90, ACC, None)  # nothing landed better: the same gap is a loss
    assert alone.runs[0].word == "worse" and alone.spread == 0.0 and alone.best is None
    assert set(QUALITY) == {"as good", "better", "unclear", "worse"}


def test_the_margin_is_the_larger_of_the_tolerance_and_the_noise_band() -> None:
    noise = EvalNoise(standard_error=0.13, batches=4)  # a band of about 0.41 (t 3.18 for 3 degrees of freedom)
    assert noise is not None and noise.band > PPL.allowed(7.3)
    inside, outside = 7.3 + noise.band - 0.01, 7.3 + noise.band + 0.01
    assert [j.word for j in judge([inside, outside], 7.3, PPL, noise).runs] == ["as good", "worse"]
    assert [j.word for j in judge([inside, outside], 7.3, PPL, None).runs] == ["worse", "worse"]
    assert judge([7.0], None, PPL, noise).runs[0].word is None  # no reference figure: nothing is judged
    assert judge([7.0], float("inf"), PPL, noise).runs[0].word is None


def test_a_relative_tolerance_reads_as_a_percentage() -> None:
    assert PPL.describe("32-true") == "perplexity within 2% of 32-true" and PPL.with_amount(0.005).amount() == "0.5%"
    assert PPL.size(-0.35, 7.277) == "4.8%" and ACC.size(0.0312, 0.9) == "0.0312"
    assert Tolerance("eval_loss", False, 0.02, False).describe("32-true") == "eval loss within 0.02 of 32-true"


def test_the_paired_noise_pools_each_runs_per_batch_differences_against_scipy() -> None:
    from ampkit.bench._quality import paired_eval_noise

    ref = [0.60, 0.95, 0.75, 0.99, 0.70]
    a = [0.58, 0.96, 0.72, 0.99, 0.69]
    b = [0.61, 0.93, 0.75, 0.97, 0.71]
    noise = paired_eval_noise(ref, [a, b, [0.9] * 4, [None] * 5])  # runs not scored on the same batches are left out
    assert noise is not None and (noise.batches, noise.runs, noise.dof) == (5, 2, 8)
    d = [[x - y for x, y in zip(r, ref)] for r in (a, b)]
    pooled = (stats.tvar(d[0]) + stats.tvar(d[1])) / 2
    assert noise.standard_error == pytest.approx((pooled / 5) ** 0.5)
    assert noise.band == pytest.approx(stats.t.ppf(0.975, 8) * (pooled / 5) ** 0.5, rel=1e-3)
    assert paired_eval_noise(ref, [[v + 0.03 for v in ref]]).standard_error == pytest.approx(0.0, abs=1e-12)  # a shift is no noise
    assert paired_eval_noise([0.9], [[0.8]]) is None and paired_eval_noise(ref, []) is None
