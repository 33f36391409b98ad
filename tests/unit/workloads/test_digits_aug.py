"""The digits-aug workload: the digits workload's stream of training digits, each warped in ``__getitem__``.

The contract shared by every workload (determinism, RNG, a tiny run that learns) is in test_registry.py; here,
what is particular to it: the same batches whoever loads them, real augmentation, the un-augmented control.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from ampkit.bench._runner import run_bench
from ampkit.workloads import _digits as digits, _digits_aug as digits_aug


@pytest.fixture(scope="module")
def tiny():
    return digits_aug.build("tiny", seed=0)


@pytest.fixture(scope="module")
def control():
    return digits_aug.build("tiny", seed=0, augment=False)


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_dataloader_with_workers_yields_the_train_batches(tiny) -> None:
    # Two workers interleave the batches between processes; each sample's randomness is its own, so neither
    # the worker that computes it nor the order matters.
    batch = tiny.items_per_batch
    alone = list(DataLoader(tiny.samples, batch_size=batch, shuffle=False, num_workers=0))
    workers = list(DataLoader(tiny.samples, batch_size=batch, shuffle=False, num_workers=2))
    assert len(alone) == len(workers) == len(tiny.train_batches) == tiny.steps
    for k, (a, w) in enumerate(zip(alone, workers)):
        assert _equal(a, w) and _equal(a, tiny.train_batches[k])


def test_a_sample_does_not_depend_on_what_was_computed_before(tiny) -> None:
    last = len(tiny.samples) - 1
    first = tiny.samples[last]
    for i in (0, 7, last - 1):
        tiny.samples[i]
    assert _equal(tiny.samples[last], first) and _equal(tiny.samples[-1], first)
    with pytest.raises(IndexError, match="out of range"):
        tiny.samples[last + 1]
    with pytest.raises(IndexError, match="out of range"):
        tiny.train_batches[tiny.steps]


def test_the_seed_sets_the_warp(tiny) -> None:
    again, other = digits_aug.build("tiny", seed=0), digits_aug.build("tiny", seed=1)
    assert _equal(tiny.train_batches[0], again.train_batches[0])
    assert not torch.equal(tiny.train_batches[0][0], other.train_batches[0][0])
    # the same digit at the same position warped under another seed: the randomness, not only the order, moved
    same = digits_aug.AugmentedDigits(*digits._split()[:2], order=torch.arange(4), seed=0, upsample=2)
    moved = digits_aug.AugmentedDigits(*digits._split()[:2], order=torch.arange(4), seed=1, upsample=2)
    assert not torch.equal(same[0][0], moved[0][0]) and int(same[0][1]) == int(moved[0][1])
    negative = digits_aug.AugmentedDigits(*digits._split()[:2], order=torch.arange(4), seed=-1, upsample=2)
    assert not torch.equal(negative[0][0], same[0][0])  # --seed -1 is a seed like any other


def test_augment_false_is_the_digits_workload(control) -> None:
    plain = digits.build("tiny", seed=0)
    # batches of 512 cross epochs: the reshuffle of each epoch and the dropped tail of 1437 % 512 are the same too
    wide, wide_plain = digits_aug.build("tiny", seed=0, batch_size=512, augment=False), digits.build("tiny", seed=0, batch_size=512)
    assert all(_equal(a, b) for a, b in zip(wide.train_batches, wide_plain.train_batches, strict=True))
    assert len(control.train_batches) == len(plain.train_batches)
    for a, b in zip(control.train_batches, plain.train_batches):
        assert _equal(a, b)
    assert _equal(control.eval_batches[0], plain.eval_batches[0])
    assert all(torch.equal(p, q) for p, q in zip(control.model.parameters(), plain.model.parameters()))
    assert control.name == "digits-aug" and control.extra["augment"] is False


def test_the_augmentation_changes_the_pixels_but_keeps_the_digit(tiny, control) -> None:
    x, y = tiny.train_batches[0]
    x0, y0 = control.train_batches[0]
    assert torch.equal(y, y0) and x.shape == x0.shape and x.dtype == x0.dtype
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    change = (x - x0).abs().flatten(1).amax(1)
    assert bool((change > 0.1).all())  # every image moved, visibly
    # ... and each still looks more like its own digit than like the other images of the batch
    a, b = x.flatten(1), x0.flatten(1)
    similarity = torch.nn.functional.normalize(a, dim=1) @ torch.nn.functional.normalize(b, dim=1).T
    own, others = similarity.diagonal(), (similarity.sum(1) - similarity.diagonal()) / (len(x) - 1)
    assert float((own > others).float().mean()) > 0.9


def test_the_work_per_sample_grows_with_the_size(tiny) -> None:
    sizes = [digits_aug._UPSAMPLE[size] for size in ("tiny", "small", "large")]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3
    assert tiny.samples.upsample == sizes[0] and tiny.extra["upsample"] == sizes[0]


def test_the_dataset_and_the_batches_survive_pickling(tiny) -> None:
    # What DataLoader workers started by spawn or forkserver receive.
    samples = pickle.loads(pickle.dumps(tiny.samples))
    assert _equal(samples[5], tiny.samples[5])
    batches = pickle.loads(pickle.dumps(tiny.train_batches))
    assert _equal(batches[1], tiny.train_batches[1])


def test_batch_size_sets_the_samples_per_batch() -> None:
    w = digits_aug.build("tiny", seed=0, batch_size=16)
    assert w.items_per_batch == 16 and len(w.samples) == 16 * w.steps and len(w.train_batches[0][0]) == 16
    with pytest.raises(ValueError, match="unknown size 'huge' for workload 'digits-aug'"):
        digits_aug.build("huge")


def test_the_bench_trains_it(tiny) -> None:
    result = run_bench(tiny, ["32-true", "bf16-mixed"], "cpu", rounds=1, count_flops=False)
    assert [run.status for run in result.runs] == ["ok", "ok"]
    assert result.runs[0].eval_metric_name == "accuracy" and len(result.runs[0].losses) == tiny.steps
