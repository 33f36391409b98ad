"""The speed-up's bootstrap interval, on constructed step times."""

from __future__ import annotations

import numpy as np
import pytest

from ampkit.bench._speedup import CONFIDENCE, MIN_TIMED_STEPS, RESAMPLES, speedup_interval


def _skewed(median: float, n: int, seed: int) -> np.ndarray:
    """Step times as a busy machine gives them: a floor plus an exponential tail of slow steps."""
    rng = np.random.default_rng(seed)
    return median * (0.95 + rng.exponential(0.05 / np.log(2), n))  # the tail's median is 0.05: the median is ``median``


def test_the_interval_holds_the_true_ratio_and_narrows_with_more_steps() -> None:
    widths = []
    for n in (20, 200):
        ref, run = _skewed(0.010, n, seed=1), _skewed(0.008, n, seed=2)  # truly 1.25x faster
        low, high = speedup_interval(ref, run)
        point = np.median(ref) / np.median(run)
        assert low <= point <= high and low < 1.25 < high
        widths.append(high - low)
    assert widths[1] < widths[0] / 2  # ~1/sqrt(n): ten times the steps, about a third of the width


def test_the_interval_is_the_percentile_bootstrap_of_its_own_seeded_generator() -> None:
    ref, run = _skewed(0.010, 30, seed=3), _skewed(0.010, 30, seed=4)

    def bootstrap(seed: int) -> tuple[float, float]:
        """The control: the module's bootstrap written out, each sample resampled with replacement from one
        generator seeded with ``seed``, the central CONFIDENCE of the ratios of the resampled medians."""
        rng = np.random.default_rng(seed)
        ratios = np.median(ref[rng.integers(0, ref.size, (RESAMPLES, ref.size))], axis=1) / np.median(
            run[rng.integers(0, run.size, (RESAMPLES, run.size))], axis=1
        )
        tail = (1 - CONFIDENCE) / 2 * 100
        low, high = np.percentile(ratios, [tail, 100 - tail])
        return float(low), float(high)

    np.random.seed(7)  # whatever the caller's global state is, the interval is the same and the state stays
    state = np.random.get_state()[1].copy()
    assert speedup_interval(ref, run) == bootstrap(0)
    assert speedup_interval(ref, run, seed=1) == bootstrap(1) != bootstrap(0)  # the seed is the one given
    assert (np.random.get_state()[1] == state).all()


@pytest.mark.parametrize(
    "run",
    [[0.01] * (MIN_TIMED_STEPS - 1), [0.01] * 9 + [float("nan")], [0.01] * 9 + [0.0], []],
)
def test_too_few_or_broken_times_give_no_interval(run: list[float]) -> None:
    assert speedup_interval([0.01] * 10, run) is None
