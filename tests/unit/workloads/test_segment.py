"""The segment workload: synthetic shapes and a miniature ERFNet.

The contract shared by every workload (determinism, RNG, a tiny run that learns) is in test_registry.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampkit.workloads import _segment as segment
from ampkit.workloads._metrics import SegmentationMetrics


def test_make_shapes_is_deterministic() -> None:
    a = segment.make_shapes(3, 16, 24, torch.Generator().manual_seed(4))
    b = segment.make_shapes(3, 16, 24, torch.Generator().manual_seed(4))
    c = segment.make_shapes(3, 16, 24, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_make_shapes_shapes_dtypes_and_classes() -> None:
    x, y = segment.make_shapes(64, 32, 32, torch.Generator().manual_seed(0))
    assert x.shape == (64, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (64, 32, 32) and y.dtype == torch.int64
    counts = torch.bincount(y.flatten(), minlength=len(segment.CLASSES))
    assert len(counts) == len(segment.CLASSES) and (counts > 0).all()  # every class turns up
    assert counts[0] > counts[1:].sum()  # mostly background, as in street scenes
    assert (y > 0).flatten(1).any(1).all()  # every image has at least one shape
    assert abs(x.mean().item()) < 0.5 and 0.3 < x.std().item() < 1.5  # roughly normalised


def test_erfnet_blocks() -> None:
    x = torch.randn(2, 8, 8, 8)
    assert segment.DownsamplerBlock(8, 20)(x).shape == (2, 20, 4, 4)
    assert segment.UpsamplerBlock(8, 4)(x).shape == (2, 4, 16, 16)
    block = segment.NonBottleneck1d(8, dropout=0.1, dilation=2)
    assert block(x).shape == x.shape
    convs = [m for m in block.modules() if isinstance(m, nn.Conv2d)]
    assert [c.kernel_size for c in convs] == [(3, 1), (1, 3), (3, 1), (1, 3)]  # factorised
    assert [c.dilation for c in convs] == [(1, 1), (1, 1), (2, 1), (1, 2)]
    with pytest.raises(ValueError, match="cout > cin"):
        segment.DownsamplerBlock(8, 8)


@pytest.mark.parametrize("size", ["tiny", "small", "large"])
def test_model_output_per_size(size: str) -> None:
    cfg = segment._CONFIGS[size]
    h, w = cfg.image
    assert h % 2 ** len(cfg.widths) == 0 and w % 2 ** len(cfg.widths) == 0
    with torch.device("meta"):  # shapes only: the large model is never materialised here
        model = segment.ERFNet(len(segment.CLASSES), cfg.widths, cfg.quarter_blocks, cfg.dilations)
        out = model(torch.empty(2, 3, h, w))
    assert out.shape == (2, len(segment.CLASSES), h, w)
    assert cfg.steps > cfg.warmup


def test_erfnet_rejects_other_depths() -> None:
    with pytest.raises(ValueError, match="two or three widths"):
        segment.ERFNet(widths=(8,))


def test_workload_wiring() -> None:
    w = segment.build("tiny", seed=0)
    x, y = w.batch(0)
    assert x.shape == (4, 3, 16, 16) and y.shape == (4, 16, 16) and y.dtype == torch.int64
    assert w.channels_last and w.loss_fn is segment.pixel_cross_entropy
    metric = w.metric()
    assert isinstance(metric, SegmentationMetrics) and metric.num_classes == len(segment.CLASSES)
    out = w.model(x)
    assert out.shape == (4, len(segment.CLASSES), 16, 16)
    assert w.loss_fn(out, y).item() == pytest.approx(F.cross_entropy(out, y).item())
    # eval images are drawn after the training images: none is repeated
    assert not any(torch.equal(ex, tx) for ex, _ in w.eval_batches for tx, _ in w.train_batches)


def test_small_settings() -> None:
    cfg = segment._CONFIGS["small"]
    assert cfg.image == (64, 64) and cfg.batch == 16 and cfg.steps > 100
