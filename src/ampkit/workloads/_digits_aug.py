"""``digits-aug``: the digits CNN fed through a deliberately CPU-heavy, per-sample augmentation in ``__getitem__``.

The workload whose input pipeline, not the model, sets the step time when samples are loaded in the training
process: what ``ampkit profile``'s loader advice (``num_workers``, ``pin_memory``, ``persistent_workers``,
``prefetch_factor``) has to find and fix. Model, split, batch order, eval set and weights are those of
:mod:`~ampkit.workloads._digits` at the same size and seed; only the training images differ: each is a
random affine + elastic warp of its digit (Simard et al., 2003), sampled on a grid ``upsample`` times finer than
8x8 and area-averaged back down (anti-aliased). The finer grid is what makes the work heavy, and it grows with
the size (``tiny`` stays fast for tests).

Measured on a shared 2-core CPU (torch 2.13, 2 threads, ``num_workers=0``): the data work of one batch against
the compute of one training step, and its share of a step that does both in one process:

=====  ========  ==========  =====================  ============================  ====================
size   upsample  per sample  data per batch         compute fp32 / bf16-mixed     data share
=====  ========  ==========  =====================  ============================  ====================
tiny   2         ~0.2 ms     ~7 ms (32 samples)     (tests)
small  5         ~0.4 ms     ~50 ms (128 samples)   27-36 ms / 19-27 ms           59-65% / 66-73%
large  8         ~0.8 ms     ~205 ms (256 samples)  174 ms / 88 ms                54% / 70%
=====  ========  ==========  =====================  ============================  ====================

DataLoader workers take the warp out of the step only if they get cores of their own: on those 2 cores, with
torch's default 2 intra-op threads, workers left the small fp32 step at ~82-86 ms (the threads and the workers
preempt each other); with ``torch.set_num_threads(1)`` and 1-2 workers it fell to ~57 ms, the step time without
augmentation (bf16-mixed: ~87 ms with none -> ~42 ms with 2 workers, against ~38 ms unaugmented).

Deterministic whoever computes it: sample ``i`` is the digit the ``digits`` workload puts at position ``i`` of
its training stream, warped with randomness seeded by ``(seed, i)`` alone, so a DataLoader with any number of
workers yields exactly ``train_batches``.

    >>> w = build("tiny", seed=0)
    >>> x, y = w.batch(0)
    >>> tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, len(w.samples) == w.steps * w.items_per_batch
    ((32, 1, 8, 8), torch.float32, (32,), torch.int64, True)
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from dataclasses import replace
from typing import overload

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from . import _digits as digits
from ._workload import SIZES, Batch, Workload

__all__ = ["AugmentedDigits", "build"]

# The supersampling factor per size: the per-sample cost grows with its square (the warp and the smoothing of
# the displacement field run on (8*upsample)^2 points). small's 5 puts one batch's data work at 50-75% of a
# single-process step on a 2-core CPU, fp32 and bf16-mixed alike (see the module docstring).
_UPSAMPLE = {"tiny": 2, "small": 5, "large": 8}

# The warp, in units of the original 8x8 pixels whatever the upsampling, so every size sees the same digits.
_ROTATE_DEG = 12.0
_SCALE = 0.1  # zoom in [1 - _SCALE, 1 + _SCALE]
_SHEAR = 0.1
_SHIFT_PX = 0.5
_ELASTIC_SIGMA_PX = 1.0  # smoothness of the displacement field
_ELASTIC_PX = 0.3  # its standard deviation


class AugmentedDigits(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample ``i``: the ``order[i]``-th digit of ``images`` warped with randomness seeded by ``(seed, i)``, as a
    ``(1, 8, 8)`` float32 image in [0, 1] and its int64 label. ``augment=False`` returns the digit untouched (the control with the slow part
    removed). Picklable (plain arrays, no closures), so DataLoader workers can start under spawn or forkserver.

    >>> images, labels = torch.rand(3, 1, 8, 8), torch.tensor([4, 7, 1])
    >>> ds = AugmentedDigits(images, labels, order=torch.tensor([2, 0]), seed=0, upsample=2)
    >>> x, y = ds[0]
    >>> tuple(x.shape), int(y), torch.equal(x, images[2]), bool(0 <= x.min() and x.max() <= 1)
    ((1, 8, 8), 1, False, True)
    >>> torch.equal(ds[0][0], x), torch.equal(ds.with_augment(False)[0][0], images[2])
    (True, True)
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, order: torch.Tensor, seed: int, upsample: int, augment: bool = True) -> None:
        if images.shape[1:] != (1, 8, 8) or len(images) != len(labels):
            raise ValueError(f"AugmentedDigits needs (N, 1, 8, 8) images and N labels; got {tuple(images.shape)} and {tuple(labels.shape)}.")
        if upsample < 1:
            raise ValueError(f"AugmentedDigits(upsample={upsample}): the supersampling factor must be an int >= 1.")
        self.images = images[:, 0].numpy().astype(np.float64)  # scipy works in float64 anyway
        self.labels = labels.numpy().astype(np.int64)
        self.order = order.numpy().astype(np.int64)
        self.seed, self.upsample, self.augment = seed, upsample, augment

    def with_augment(self, augment: bool) -> AugmentedDigits:
        """The same samples with the augmentation on or off."""
        other = copy.copy(self)  # shares the (read-only) arrays
        other.augment = augment
        return other

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = _checked(i, len(self), "sample")
        j = self.order[i]
        # numpy's seeds are non-negative; --seed may not be (torch takes -1): % 2**64 keeps each seed distinct.
        image = _warp(self.images[j], self.upsample, np.random.default_rng((self.seed % 2**64, i))) if self.augment else self.images[j]
        return torch.from_numpy(image.astype(np.float32)[None]), torch.tensor(self.labels[j])


def _checked(i: int, n: int, what: str) -> int:
    """``i`` as a non-negative index into ``n`` items; IndexError past the end (which also ends iteration)."""
    i = operator.index(i)
    if not -n <= i < n:
        raise IndexError(f"{what} {i} is out of range: there are {n}.")
    return i % n


def _warp(image: np.ndarray, upsample: int, rng: np.random.Generator) -> np.ndarray:
    """A random affine + elastic warp of an 8x8 ``image``, sampled on an ``8*upsample`` grid and area-averaged back."""
    from scipy import (
        ndimage,  # here, not at import: scipy comes with scikit-learn, which only digits needs
    )

    n = 8 * upsample
    # The centres of the fine grid's points, in original-pixel coordinates (pixel k spans [k - 0.5, k + 0.5]).
    fine = (np.arange(n) + 0.5) / upsample - 0.5
    grid = np.stack(np.meshgrid(fine, fine, indexing="ij")).reshape(2, -1) - 3.5  # about the image centre
    angle = np.deg2rad(rng.uniform(-_ROTATE_DEG, _ROTATE_DEG))
    rotate = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    shear = np.array([[1.0, rng.uniform(-_SHEAR, _SHEAR)], [0.0, 1.0]])
    # Where each output point reads from: the inverse map (hence the division by the zoom), then the shift.
    source = (rotate @ shear) @ grid / rng.uniform(1 - _SCALE, 1 + _SCALE) + 3.5 + rng.uniform(-_SHIFT_PX, _SHIFT_PX, (2, 1))
    # Elastic: white noise smoothed into a displacement field, scaled to a fixed spread in original pixels.
    field = ndimage.gaussian_filter(rng.uniform(-1.0, 1.0, (2, n, n)), sigma=(0, _ELASTIC_SIGMA_PX * upsample, _ELASTIC_SIGMA_PX * upsample))
    field *= _ELASTIC_PX / max(float(field.std()), 1e-12)
    source = source + field.reshape(2, -1)
    # Cubic spline on the 8x8 digit; outside it is background (0), as the digits' borders are.
    fine_image = ndimage.map_coordinates(image, source, order=3, mode="constant", cval=0.0).reshape(8, upsample, 8, upsample)
    return np.clip(fine_image.mean(axis=(1, 3)), 0.0, 1.0)  # the spline overshoots a little near strokes


class _CollatedBatches(Sequence[Batch]):
    """Batch ``k`` = ``default_collate`` of samples ``[k*batch, (k+1)*batch)``, computed when asked for (never
    stored): what a ``DataLoader(samples, batch_size=batch, shuffle=False)`` yields, as a sequence."""

    def __init__(self, samples: AugmentedDigits, batch: int) -> None:
        self.samples, self.batch = samples, batch

    def __len__(self) -> int:
        return len(self.samples) // self.batch

    @overload
    def __getitem__(self, k: int) -> Batch: ...

    @overload
    def __getitem__(self, k: slice) -> Sequence[Batch]: ...

    def __getitem__(self, k: int | slice) -> Batch | Sequence[Batch]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        k = _checked(k, len(self), "batch")
        x, y = default_collate([self.samples[i] for i in range(k * self.batch, (k + 1) * self.batch)])
        return x, y


def build(size: str = "small", seed: int = 0, batch_size: int | None = None, *, augment: bool = True) -> Workload:
    """The digits-aug workload at ``size`` (``tiny``, ``small``, ``large``); same seed, same weights and batches.
    ``batch_size`` replaces the size's batch. ``augment=False``: the same workload with the augmentation skipped,
    whose batches are exactly the ``digits`` workload's.

    >>> w = build("tiny", seed=1)
    >>> w.name, w.unit, w.items_per_batch, len(w.train_batches) == w.steps, w.samples.upsample
    ('digits-aug', 'samples', 32, True, 2)
    >>> plain, control = digits.build("tiny", seed=1), build("tiny", seed=1, augment=False)
    >>> all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain.train_batches, control.train_batches))
    True
    """
    if size not in _UPSAMPLE:
        raise ValueError(f"unknown size {size!r} for workload 'digits-aug'; choose one of {', '.join(SIZES)}.")
    base = digits.build(size, seed, batch_size)  # the model, eval set and optimizer, and the checks of batch_size
    cfg = replace(digits._CONFIGS[size], batch=base.items_per_batch)
    x_train, y_train, _, _ = digits._split()
    # The digits workload's training stream, as indices: the same per-epoch shuffles, the same dropped tails.
    index = torch.arange(len(x_train))
    order = torch.cat([idx for idx, _ in digits._train_batches(index, index, cfg, torch.Generator().manual_seed(seed))])
    samples = AugmentedDigits(x_train, y_train, order, seed=seed, upsample=_UPSAMPLE[size], augment=augment)
    what = f"augmented per sample in __getitem__ (affine + elastic at {samples.upsample}x)" if augment else "not augmented (control)"
    return replace(
        base,
        name="digits-aug",
        train_batches=_CollatedBatches(samples, cfg.batch),
        samples=samples,
        description=f"{base.description}, {what}",
        extra={**base.extra, "augment": augment, "upsample": samples.upsample},
    )
