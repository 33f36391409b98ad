"""The resnet workload: a ResNet-18-like CNN on random images, throughput and memory only.

The contract shared by every workload (determinism, RNG, a tiny run that learns) is in test_registry.py.
"""

from __future__ import annotations

import pytest
import torch

from ampkit.workloads import _resnet as resnet


def test_batches_shapes_and_dtypes() -> None:
    w = resnet.build("tiny", seed=0)
    for x, y in w.train_batches:
        assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32
        assert y.shape == (4,) and y.dtype == torch.int64 and int(y.max()) < 10
    assert w.metric is None and len(w.eval_batches) == 0 and w.channels_last


def test_resnet18_architecture() -> None:
    # ResNet-18 at width 64 (CIFAR stem, 10 classes) has 11,173,962 parameters, as torchvision's layout.
    with torch.device("meta"):
        model = resnet.ResNet18(width=64, classes=10)
    assert sum(p.numel() for p in model.parameters()) == 11_173_962
    blocks = [m for m in model.modules() if isinstance(m, resnet.BasicBlock)]
    assert len(blocks) == 8
    assert sum(not isinstance(b.shortcut, torch.nn.Identity) for b in blocks) == 3  # one per downsampling stage


@pytest.mark.parametrize("size", ["tiny", "small", "large"])
def test_model_output_per_size(size: str) -> None:
    cfg = resnet._CONFIGS[size]
    with torch.device("meta"):  # shapes only: the large model is never materialised here
        model = resnet.ResNet18(width=cfg.width, classes=cfg.classes)
        out = model(torch.empty(2, 3, cfg.image, cfg.image))
    assert out.shape == (2, cfg.classes)
    assert cfg.steps > cfg.warmup and cfg.distinct_batches >= 1


def test_small_settings() -> None:
    w = resnet.build("small", seed=0)
    assert w.items_per_batch == 32 and w.extra["width"] == 32 and w.steps > w.warmup
    assert "throughput and memory only" in w.description
