"""``digits``: a small CNN on scikit-learn's bundled 8x8 handwritten digits (real data, nothing downloaded).

The 1,797 images are split 80/20 once and for all (the split does not depend on the seed, so every seed is
scored on the same 360 held-out digits); the seed sets the initial weights and the batch order.

    >>> w = build("tiny", seed=0)
    >>> x, y = w.batch(0)
    >>> tuple(x.shape), x.dtype, tuple(y.shape), y.dtype
    ((32, 1, 8, 8), torch.float32, (32,), torch.int64)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from .._errors import AmpkitError
from ._workload import SIZES, Accuracy, Batch, Workload, default_optimizer

__all__ = ["DigitsCNN", "build"]


@dataclass(frozen=True)
class _Config:
    width: int  # channels of the first conv; the second has twice as many
    batch: int
    steps: int
    warmup: int
    lr: float


# small: wide enough that the convolutions, not the per-op overhead, set the step time on a CPU, so bf16
# has something to speed up; about 11 epochs over the training split.
_CONFIGS = {
    "tiny": _Config(width=8, batch=32, steps=6, warmup=2, lr=3e-3),
    "small": _Config(width=64, batch=128, steps=150, warmup=3, lr=2e-3),
    "large": _Config(width=128, batch=256, steps=300, warmup=5, lr=2e-3),
}


class DigitsCNN(nn.Module):
    """conv-BN-ReLU x2, 2x2 max-pool, two linear layers: ``(B, 1, 8, 8)`` -> ``(B, 10)`` logits.

    >>> DigitsCNN(width=4)(torch.zeros(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    """

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),  # (B, w, 8, 8)
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2),  # (B, 2w, 4, 4)
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, 4 * width), nn.ReLU(), nn.Linear(4 * width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    try:  # here, not at import: only this workload needs scikit-learn
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise AmpkitError(
            'the digits workload (the default on a CPU) reads its data with scikit-learn, which is not installed; it '
            'needs the bench extra: pip install "ampkit[bench]" (or choose another workload: -w gpt, resnet or segment).'
        ) from exc

    x, y = load_digits(return_X_y=True)
    return x.astype(np.float32) / 16.0, y.astype(np.int64)  # pixel values 0..16 -> [0, 1]


def _split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fixed 80/20 split of the 1,797 digits as ``(N, 1, 8, 8)`` images and labels."""
    x_np, y_np = _digits()
    x, y = torch.from_numpy(x_np.copy()).view(-1, 1, 8, 8), torch.from_numpy(y_np.copy())
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # seed-independent
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def _train_batches(x: torch.Tensor, y: torch.Tensor, cfg: _Config, generator: torch.Generator) -> list[Batch]:
    """``cfg.steps`` full batches, reshuffled every epoch; the short tail of an epoch is dropped so every
    step processes ``cfg.batch`` samples (what ``items_per_batch`` promises)."""
    per_epoch = len(x) // cfg.batch
    batches: list[Batch] = []
    while len(batches) < cfg.steps:
        perm = torch.randperm(len(x), generator=generator)
        for i in range(min(per_epoch, cfg.steps - len(batches))):
            idx = perm[i * cfg.batch : (i + 1) * cfg.batch]
            batches.append((x[idx], y[idx]))
    return batches


def build(size: str = "small", seed: int = 0, batch_size: int | None = None) -> Workload:
    """The digits workload at ``size`` (``tiny``, ``small``, ``large``); same seed, same weights and batches.
    ``batch_size`` replaces the size's batch (rows per training batch).

    >>> w = build("tiny", seed=1)
    >>> w.name, w.unit, w.items_per_batch, w.channels_last, len(w.eval_batches) > 0
    ('digits', 'samples', 32, True, True)
    """
    if size not in _CONFIGS:
        raise ValueError(f"unknown size {size!r} for workload 'digits'; choose one of {', '.join(SIZES)}.")
    cfg = _CONFIGS[size] if batch_size is None else replace(_CONFIGS[size], batch=batch_size)  # --batch-size
    x_train, y_train, x_eval, y_eval = _split()
    if cfg.batch > len(x_train):
        raise ValueError(f"--batch-size {cfg.batch}: the digits workload has {len(x_train)} training images; use at most {len(x_train)}.")
    batches = _train_batches(x_train, y_train, cfg, torch.Generator().manual_seed(seed))
    eval_batch = max(cfg.batch, 128)
    eval_batches = [(x_eval[i : i + eval_batch], y_eval[i : i + eval_batch]) for i in range(0, len(x_eval), eval_batch)]
    # fork_rng(devices=[]): only the CPU generator is forked and seeded (the model is built on the CPU), so
    # the caller's CPU and CUDA RNG states are left exactly as they were.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = DigitsCNN(width=cfg.width)
    params = sum(p.numel() for p in model.parameters())
    return Workload(
        name="digits",
        model=model,
        train_batches=batches,
        eval_batches=eval_batches,
        metric=Accuracy,
        optimizer=functools.partial(default_optimizer, lr=cfg.lr),
        items_per_batch=cfg.batch,
        unit="samples",
        steps=cfg.steps,
        warmup=cfg.warmup,
        channels_last=True,
        description=(
            f"CNN (width {cfg.width}, {params / 1e3:.0f}k params) on sklearn 8x8 digits, "
            f"batch {cfg.batch} x 1x8x8, {len(x_train)} train / {len(x_eval)} eval"
        ),
        extra={"parameters": params, "image_size": [8, 8], "batch_size": cfg.batch, "width": cfg.width,
               "train_samples": len(x_train), "eval_samples": len(x_eval)},
    )
