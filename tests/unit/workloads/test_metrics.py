"""The segmentation and language-model metrics, against figures worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from ampkit.workloads._metrics import LanguageModelMetrics, SegmentationMetrics


def _logits_for(pred: torch.Tensor, classes: int) -> torch.Tensor:
    """Logits ``(B, C, H, W)`` whose argmax is ``pred`` ``(B, H, W)``."""
    return F.one_hot(pred, classes).permute(0, 3, 1, 2).float()


@pytest.fixture
def no_host_reads(monkeypatch: pytest.MonkeyPatch):
    """Make every Python-level read of a tensor's value fail: update() must leave the numbers on the device."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("update() read a tensor value back to the host")

    def install() -> None:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "numpy"):
            monkeypatch.setattr(torch.Tensor, name, refuse)

    return install


@pytest.mark.parametrize("metric", [SegmentationMetrics(3), LanguageModelMetrics()])
def test_metric_protocol_attributes(metric) -> None:
    assert isinstance(metric.name, str) and isinstance(metric.higher_is_better, bool)
    assert isinstance(metric.tolerance, float) and isinstance(metric.relative, bool)


def test_segmentation_settings() -> None:
    m = SegmentationMetrics(5)
    assert (m.name, m.higher_is_better, m.tolerance, m.relative) == ("mIoU", True, 0.02, False)


# ------------------------------------------------------------------------------------------ segmentation


def test_miou_of_a_known_confusion() -> None:
    # targets 0 0 0 1 1 2 2 2, predictions 0 0 1 1 2 2 2 0 give the confusion (rows: target)
    #   [[2, 1, 0],
    #    [0, 1, 1],
    #    [1, 0, 2]]
    # IoU_0 = 2 / (3 + 3 - 2) = 1/2, IoU_1 = 1 / (2 + 2 - 1) = 1/3, IoU_2 = 2 / (3 + 3 - 2) = 1/2
    target = torch.tensor([[[0, 0, 0, 1], [1, 2, 2, 2]]])
    pred = torch.tensor([[[0, 0, 1, 1], [2, 2, 2, 0]]])
    m = SegmentationMetrics(3)
    m.update(_logits_for(pred, 3), target)
    assert m.confusion().tolist() == [[2, 1, 0], [0, 1, 1], [1, 0, 2]]
    out = m.compute()
    assert out["mIoU"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 2) / 3)
    assert out["pixel_accuracy"] == pytest.approx(5 / 8)


def test_classes_absent_from_targets_and_predictions_do_not_count() -> None:
    # Classes 2 and 3 never occur: averaging over all four would halve the figure.
    target = torch.tensor([[[0, 0, 1, 1]]])
    m = SegmentationMetrics(4)
    m.update(_logits_for(torch.tensor([[[0, 1, 1, 1]]]), 4), target)
    assert m.compute()["mIoU"] == pytest.approx((1 / 2 + 2 / 3) / 2)


def test_a_class_only_predicted_counts_as_zero() -> None:
    m = SegmentationMetrics(3)
    m.update(_logits_for(torch.tensor([[[0, 2]]]), 3), torch.tensor([[[0, 0]]]))
    assert m.compute()["mIoU"] == pytest.approx((1 / 2 + 0.0) / 2)


def test_updates_accumulate_like_one_big_batch() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, 5, 7, generator=g)
    target = torch.randint(0, 4, (6, 5, 7), generator=g)
    whole, parts = SegmentationMetrics(4), SegmentationMetrics(4)
    whole.update(logits, target)
    for i in range(0, 6, 2):
        parts.update(logits[i : i + 2], target[i : i + 2])
    assert torch.equal(whole.confusion(), parts.confusion())
    assert whole.compute() == parts.compute()
    assert whole.confusion().sum() == target.numel()


def test_ignore_index_leaves_pixels_out() -> None:
    m = SegmentationMetrics(2, ignore_index=255)
    m.update(_logits_for(torch.tensor([[[0, 1, 1]]]), 2), torch.tensor([[[0, 1, 255]]]))
    assert m.compute() == {"mIoU": 1.0, "pixel_accuracy": 1.0}
    assert m.confusion().sum() == 2


def test_channels_last_and_bf16_logits() -> None:
    pred = torch.tensor([[[0, 1], [1, 0]]])
    logits = _logits_for(pred, 2).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    m = SegmentationMetrics(2)
    m.update(logits, pred)
    assert m.compute() == {"mIoU": 1.0, "pixel_accuracy": 1.0}


def test_segmentation_update_reads_nothing_back(no_host_reads) -> None:
    m = SegmentationMetrics(3, ignore_index=255)
    logits, target = torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))
    no_host_reads()
    m.update(logits, target)
    m.update(logits, target)


def test_segmentation_empty_and_bad_shapes() -> None:
    m = SegmentationMetrics(3)
    assert all(math.isnan(v) for v in m.compute().values())
    with pytest.raises(ValueError, match=r"logits \(B, 3, \.\.\.\)"):
        m.update(torch.zeros(1, 4, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long))
    with pytest.raises(ValueError):
        SegmentationMetrics(0)


# ------------------------------------------------------------------------------------------ language model


def test_language_model_settings() -> None:
    m = LanguageModelMetrics()
    assert (m.name, m.higher_is_better, m.tolerance, m.relative) == ("perplexity", False, 0.02, True)


def test_perplexity_is_exp_of_the_token_mean_cross_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(b, t, 11, generator=g), torch.randint(0, 11, (b, t), generator=g)) for b, t in ((2, 5), (3, 4), (1, 9))]
    m = LanguageModelMetrics()
    for logits, target in batches:
        m.update(logits, target)
    # the mean over all 31 tokens, not the mean of the three batch means
    all_logits = torch.cat([lg.reshape(-1, 11) for lg, _ in batches])
    all_targets = torch.cat([tg.reshape(-1) for _, tg in batches])
    expected = F.cross_entropy(all_logits, all_targets).item()
    out = m.compute()
    assert out["eval_loss"] == pytest.approx(expected, rel=1e-6)
    assert out["perplexity"] == pytest.approx(math.exp(expected), rel=1e-6)


def test_uniform_logits_give_the_vocabulary_size() -> None:
    m = LanguageModelMetrics()
    m.update(torch.zeros(2, 3, 256), torch.randint(0, 256, (2, 3)))
    assert m.compute()["perplexity"] == pytest.approx(256.0)


def test_ignore_index_and_bf16_logits() -> None:
    logits = torch.randn(1, 4, 5).to(torch.bfloat16)
    target = torch.tensor([[1, -100, 3, -100]])
    m = LanguageModelMetrics()
    m.update(logits, target)
    expected = F.cross_entropy(logits.float()[0, [0, 2]], torch.tensor([1, 3])).item()
    assert m.compute()["eval_loss"] == pytest.approx(expected, rel=1e-6)


def test_language_model_update_reads_nothing_back(no_host_reads) -> None:
    m = LanguageModelMetrics()
    logits, target = torch.randn(2, 3, 7), torch.randint(0, 7, (2, 3))
    no_host_reads()
    m.update(logits, target)
    m.update(logits, target)


def test_language_model_empty_diverged_and_bad_shapes() -> None:
    m = LanguageModelMetrics()
    assert all(math.isnan(v) for v in m.compute().values())
    huge = torch.zeros(1, 1, 2)
    huge[0, 0, 0] = 1e4  # the target's logit is 10,000 below the other: loss 1e4, exp overflows a float
    m.update(huge, torch.tensor([[1]]))
    assert m.compute()["perplexity"] == math.inf
    with pytest.raises(ValueError, match=r"\(B, T, V\)"):
        m.update(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long))
