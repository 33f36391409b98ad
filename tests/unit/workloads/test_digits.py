"""The digits workload: real 8x8 digits, a fixed split, a CNN that emits class logits.

The contract shared by every workload (determinism, RNG, a tiny run that learns) is in test_registry.py.
"""

from __future__ import annotations

import pytest
import torch

from ampkit.workloads import _digits as digits
from ampkit.workloads._workload import Accuracy


@pytest.fixture(scope="module")
def tiny():
    return digits.build("tiny", seed=0)


def test_batches_shapes_and_dtypes(tiny) -> None:
    for x, y in list(tiny.train_batches) + list(tiny.eval_batches):
        assert x.dtype == torch.float32 and x.shape[1:] == (1, 8, 8) and len(x) == len(y)
        assert y.dtype == torch.int64 and 0 <= int(y.min()) and int(y.max()) <= 9
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0  # scaled from 0..16
    assert all(len(x) == tiny.items_per_batch for x, _ in tiny.train_batches)


def test_fixed_split_whatever_the_seed(tiny) -> None:
    other = digits.build("tiny", seed=5)
    eval_x = torch.cat([x for x, _ in tiny.eval_batches])
    assert len(eval_x) == 360  # 20% of 1,797
    assert torch.equal(eval_x, torch.cat([x for x, _ in other.eval_batches]))
    # no eval image is a training image: compare every training image of the first steps against the eval set
    train_x = torch.cat([x for x, _ in tiny.train_batches]).flatten(1)
    assert not (train_x.unsqueeze(1) == eval_x.flatten(1).unsqueeze(0)).all(-1).any()


def test_each_epoch_reshuffles_and_drops_the_short_tail() -> None:
    x, y = torch.arange(10.0).view(10, 1, 1, 1), torch.arange(10)
    cfg = digits._Config(width=1, batch=4, steps=5, warmup=1, lr=1e-3)
    batches = digits._train_batches(x, y, cfg, torch.Generator().manual_seed(0))
    assert [len(b[0]) for b in batches] == [4] * 5
    first_epoch = torch.cat([batches[0][1], batches[1][1]])
    assert len(set(first_epoch.tolist())) == 8  # no sample twice within an epoch


def test_model_emits_logits(tiny) -> None:
    x, _ = tiny.batch(0)
    out = tiny.model(x)
    assert out.shape == (len(x), 10) and out.dtype == torch.float32
    assert tiny.metric is Accuracy and tiny.channels_last


def test_small_settings() -> None:
    w = digits.build("small", seed=0)
    assert w.steps > 100 and w.warmup >= 1 and w.items_per_batch == 128
    assert w.extra["train_samples"] + w.extra["eval_samples"] == 1797
    assert "8x8 digits" in w.description
