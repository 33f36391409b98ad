"""``ampkit bench --tolerance``'s help says what the code does: each built-in metric's default and whether it is
absolute or relative, and that the measured eval noise takes the tolerance's place where it is larger."""

from __future__ import annotations

import argparse

import pytest

from ampkit.bench._quality import EvalNoise, Tolerance, judge
from ampkit.cli._parsers import add_bench
from ampkit.workloads._bench_data import EvalLoss
from ampkit.workloads._metrics import LanguageModelMetrics, SegmentationMetrics
from ampkit.workloads._workload import Accuracy


def _help() -> str:
    parser = argparse.ArgumentParser(prog="ampkit")
    add_bench(parser.add_subparsers())
    bench = next(a for a in parser._subparsers._group_actions[0].choices.values())  # type: ignore[union-attr]
    action = next(a for a in bench._actions if "--tolerance" in a.option_strings)
    return " ".join(str(action.help).replace("%%", "%").split())


@pytest.mark.parametrize(
    ("metric", "said"),
    [(Accuracy, "absolute for accuracy"), (SegmentationMetrics, "and mIoU"), (EvalLoss, "and for eval loss"),
     (LanguageModelMetrics, "a fraction of 32-true's figure for perplexity")],
)
def test_each_metric_is_absolute_or_relative_as_the_help_says_with_its_stated_default(metric: type, said: str) -> None:
    text = _help()
    assert said in text
    assert metric.relative == ("fraction" in said)
    assert f"Default: the metric's own ({metric.tolerance:g} for accuracy, mIoU, perplexity and eval loss)" in text


def test_the_eval_noise_takes_the_tolerances_place_where_larger_as_the_help_says() -> None:
    # Before: the help read as if --tolerance alone decided; a gap of 0.03 at --tolerance 0 is "as good" when the
    # eval batches' noise band is wider, so the help must say the noise allows it.
    assert "The eval noise measured on the eval batches (its 95% band) takes its place where larger, so 0 still allows the noise" in _help()
    tol = Tolerance("accuracy", higher_is_better=True, tolerance=0.02, relative=False).with_amount(0.0)
    noise = EvalNoise(standard_error=0.02, batches=31)  # a band of 2.042 * 0.02 = 0.041
    words = [j.word for j in judge([0.87, 0.85, 0.9], reference=0.9, tolerance=tol, noise=noise).runs]
    assert words == ["as good", "worse", "as good"]
    assert [j.word for j in judge([0.87, 0.9], reference=0.9, tolerance=tol, noise=None).runs] == ["worse", "as good"]  # twin: no noise, 0 is 0
