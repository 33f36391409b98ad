"""``segment``: a miniature ERFNet (Romera et al., 2017) on a deterministic synthetic shapes-segmentation set.

Each RGB image holds one to four overlapping shapes (rectangle, circle, triangle, ring: classes 1-4) of random
position and size over a smooth grey background with pixel noise (class 0). Each class has a colour family and
a fill pattern (stripes, flat, checks, diagonal stripes), randomised within the class: enough local evidence
for a CPU-sized run to converge, while every boundary pixel still depends on the outline. Generated with a
local :class:`torch.Generator`: the same seed gives the same images on every run, and nothing is downloaded.

    >>> images, labels = make_shapes(2, 32, 48, torch.Generator().manual_seed(0))
    >>> tuple(images.shape), tuple(labels.shape), labels.dtype, int(labels.max()) <= 4
    ((2, 3, 32, 48), (2, 32, 48), torch.int64, True)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from ._metrics import SegmentationMetrics
from ._workload import SIZES, Batch, Workload, default_optimizer

__all__ = ["CLASSES", "ERFNet", "build", "make_shapes", "pixel_cross_entropy"]

CLASSES = ("background", "rectangle", "circle", "triangle", "ring")

# Base RGB colour of each shape class (rectangle, circle, triangle, ring): red, green, blue, yellow.
_FAMILIES = torch.tensor([[0.9, 0.25, 0.2], [0.2, 0.85, 0.3], [0.25, 0.35, 0.95], [0.95, 0.85, 0.15]])


@dataclass(frozen=True)
class _Config:
    image: tuple[int, int]  # (H, W), multiples of 2 ** len(widths)
    widths: tuple[int, ...]  # channels at 1/2, 1/4 (and 1/8) resolution (ERFNet: 16, 64, 128)
    quarter_blocks: int  # non_bottleneck_1d blocks at 1/4 resolution (ERFNet: 5)
    dilations: tuple[int, ...]  # one dilated block per entry at the deepest level (ERFNet: 2, 4, 8, 16 twice)
    batch: int
    train_batches: int  # distinct batches, cycled through by the runner
    eval_batches: int
    steps: int
    warmup: int
    lr: float


_CONFIGS = {
    "tiny": _Config(image=(16, 16), widths=(8, 16), quarter_blocks=0, dilations=(2,), batch=4,
                    train_batches=2, eval_batches=1, steps=6, warmup=2, lr=3e-3),
    # small: two levels (down to 1/4). On 64x64 images the full three-level ERFNet's 8x8 bottleneck needs
    # ~250 steps before it separates the shapes at all, and an unconverged run cannot tell fp32 from bf16:
    # its eval figure still swings by more than the 0.02 tolerance from one step to the next.
    "small": _Config(image=(64, 64), widths=(16, 64), quarter_blocks=1, dilations=(2, 4, 8), batch=16,
                     train_batches=40, eval_batches=8, steps=240, warmup=3, lr=3e-3),
    # large: the full ERFNet. Its 1/8-resolution bottleneck takes a few hundred steps before it starts to
    # separate the shapes (about 250 at 64x64 on a CPU), hence 800 steps: cheap on a GPU.
    "large": _Config(image=(128, 256), widths=(16, 64, 128), quarter_blocks=5, dilations=(2, 4, 8, 16) * 2, batch=16,
                     train_batches=24, eval_batches=4, steps=800, warmup=10, lr=2e-3),
}


# ---------------------------------------------------------------------------------------------- the model


class DownsamplerBlock(nn.Module):
    """Halves the resolution: a stride-2 3x3 conv (``out - in`` channels) concatenated with a 2x2 max-pool of
    the input (``in`` channels), then BN and ReLU. The pooled branch keeps the input's information for free."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        if cout <= cin:
            raise ValueError(f"DownsamplerBlock needs cout > cin, got {cin} -> {cout}.")
        self.conv = nn.Conv2d(cin, cout - cin, 3, stride=2, padding=1, bias=True)
        self.pool = nn.MaxPool2d(2, stride=2)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(torch.cat([self.conv(x), self.pool(x)], 1)))


class NonBottleneck1d(nn.Module):
    """ERFNet's residual block: two factorised 3x3 convs (3x1 then 1x3), the second pair dilated, with BN,
    dropout and a residual connection. Factorising cuts the weights by a third at the same receptive field."""

    def __init__(self, channels: int, dropout: float, dilation: int) -> None:
        super().__init__()
        c, d = channels, dilation
        self.conv3x1_1 = nn.Conv2d(c, c, (3, 1), padding=(1, 0))
        self.conv1x3_1 = nn.Conv2d(c, c, (1, 3), padding=(0, 1))
        self.bn1 = nn.BatchNorm2d(c, eps=1e-3)
        self.conv3x1_2 = nn.Conv2d(c, c, (3, 1), padding=(d, 0), dilation=(d, 1))
        self.conv1x3_2 = nn.Conv2d(c, c, (1, 3), padding=(0, d), dilation=(1, d))
        self.bn2 = nn.BatchNorm2d(c, eps=1e-3)
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.conv3x1_1(x))
        out = F.relu(self.bn1(self.conv1x3_1(out)))
        out = F.relu(self.conv3x1_2(out))
        out = self.dropout(self.bn2(self.conv1x3_2(out)))
        return F.relu(out + x)


class UpsamplerBlock(nn.Module):
    """Doubles the resolution: a stride-2 3x3 transposed conv, BN, ReLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1, bias=True)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class ERFNet(nn.Module):
    """ERFNet in miniature: ``(B, 3, H, W)`` -> ``(B, classes, H, W)`` logits.

    ``widths`` holds the channels after each downsampler: three entries (ERFNet: 16, 64, 128) go down to 1/8
    resolution, two stop at 1/4. Encoder: downsample to 1/2 and 1/4, ``quarter_blocks`` residual blocks, (with
    three widths) downsample to 1/8, then one dilated residual block per entry of ``dilations``. Decoder: per
    level, an upsampler and two residual blocks; a stride-2 transposed conv gives the full-resolution logits.
    ``H`` and ``W`` must be multiples of ``2 ** len(widths)``.

    >>> ERFNet(classes=5, widths=(4, 8, 16), quarter_blocks=1, dilations=(2,))(torch.zeros(1, 3, 16, 24)).shape
    torch.Size([1, 5, 16, 24])
    >>> ERFNet(classes=5, widths=(4, 8), quarter_blocks=0, dilations=(2, 4))(torch.zeros(1, 3, 12, 8)).shape
    torch.Size([1, 5, 12, 8])
    """

    def __init__(
        self,
        classes: int = len(CLASSES),
        widths: tuple[int, ...] = (16, 64, 128),
        quarter_blocks: int = 5,
        dilations: tuple[int, ...] = (2, 4, 8, 16, 2, 4, 8, 16),
        dropout: tuple[float, float] = (0.03, 0.1),
    ) -> None:
        super().__init__()
        if len(widths) not in (2, 3):
            raise ValueError(f"ERFNet takes two or three widths (down to 1/4 or 1/8 resolution), got {widths}.")
        # ERFNet drops 0.03 in the early blocks and 0.3 in the dilated ones; 0.1 here because the bench trains
        # for a few hundred steps, not 150 epochs, and heavy dropout would only slow convergence.
        layers: list[nn.Module] = [DownsamplerBlock(3, widths[0]), DownsamplerBlock(widths[0], widths[1])]
        layers += [NonBottleneck1d(widths[1], dropout[0], 1) for _ in range(quarter_blocks)]
        if len(widths) == 3:
            layers.append(DownsamplerBlock(widths[1], widths[2]))
        layers += [NonBottleneck1d(widths[-1], dropout[1], d) for d in dilations]
        self.encoder = nn.Sequential(*layers)
        layers = []
        for cin, cout in zip(widths[:0:-1], widths[-2::-1]):  # e.g. 128 -> 64, then 64 -> 16
            layers += [UpsamplerBlock(cin, cout), NonBottleneck1d(cout, 0.0, 1), NonBottleneck1d(cout, 0.0, 1)]
        layers.append(nn.ConvTranspose2d(widths[0], classes, 2, stride=2))
        self.decoder = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def pixel_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all pixels: logits ``(B, C, H, W)``, labels ``(B, H, W)`` (int64).

    >>> loss = pixel_cross_entropy(torch.zeros(1, 4, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long))  # uniform
    >>> round(loss.item(), 4)  # log(4)
    1.3863
    """
    return F.cross_entropy(output, target)


# ----------------------------------------------------------------------------------------------- the data


def make_shapes(n: int, height: int, width: int, generator: torch.Generator, max_shapes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` synthetic images ``(n, 3, H, W)`` (float32, roughly zero-mean, unit-variance) and their per-pixel
    labels ``(n, H, W)`` (int64, 0 = background, 1-4 = :data:`CLASSES`). Later shapes occlude earlier ones.

    Vectorised over the images (one pass per shape slot), so even the large size generates in a few seconds.

    >>> x, y = make_shapes(1, 16, 16, torch.Generator().manual_seed(3))
    >>> bool((y > 0).any()), x.dtype
    (True, torch.float32)
    """

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=generator)

    # Background: a smooth, weakly tinted grey field (bilinear upsampling of a coarse random grid).
    coarse = rand(n, 1, max(2, height // 16), max(2, width // 16)) + 0.3 * rand(n, 3, max(2, height // 16), max(2, width // 16))
    images = 0.1 + 0.6 * F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    labels = torch.zeros(n, height, width, dtype=torch.int64)

    ys = torch.arange(height, dtype=torch.float32).view(1, height, 1) + 0.5
    xs = torch.arange(width, dtype=torch.float32).view(1, 1, width) + 0.5
    side = float(min(height, width))
    count = 1 + (rand(n) * max_shapes).long()  # 1..max_shapes shapes per image
    for k in range(max_shapes):
        cls = 1 + (rand(n) * 4).long().clamp_(max=3)  # 1..4
        r = side * (0.1 + 0.15 * rand(n))  # "radius": half the shape's extent
        cx = r + (width - 2 * r) * rand(n)
        cy = r + (height - 2 * r) * rand(n)
        aspect = 0.55 + 0.45 * rand(n)  # rectangles are not all squares
        flip = rand(n) < 0.5  # rectangles lie or stand
        inner = 0.35 + 0.2 * rand(n)  # ring thickness
        # Each class has a colour family (a base colour, jittered per shape) and a darker second colour for
        # its pattern, so the class is visible locally and a short run can learn it.
        colour = (_FAMILIES[cls - 1] + 0.3 * (rand(n, 3) - 0.5)).clamp_(0.0, 1.0)
        second = colour * (0.35 + 0.25 * rand(n, 1))
        period = 4.0 + 3.0 * rand(n)  # fill pattern: period in pixels and phase, random per shape
        phase = period * rand(n)
        r, cx, cy, aspect, inner, period, phase = (t.view(n, 1, 1) for t in (r, cx, cy, aspect, inner, period, phase))
        dx, dy = xs - cx, ys - cy
        d2 = dx * dx + dy * dy
        half_w = torch.where(flip.view(n, 1, 1), r * aspect, r)
        half_h = torch.where(flip.view(n, 1, 1), r, r * aspect)
        rectangle = (dx.abs() <= half_w) & (dy.abs() <= half_h)
        circle = d2 <= r * r
        t = (dy + r) / (2 * r)  # 0 at the apex, 1 at the base
        triangle = (t >= 0) & (t <= 1) & (dx.abs() <= t * r)
        ring = circle & (d2 >= (inner * r) ** 2)
        c = cls.view(n, 1, 1)
        mask = torch.where(c == 1, rectangle, torch.where(c == 2, circle, torch.where(c == 3, triangle, ring)))
        mask &= (k < count).view(n, 1, 1)
        labels = torch.where(mask, c, labels)
        # Fill patterns: rectangles striped along their long side, circles flat, triangles checked, rings
        # striped diagonally. A few pixels of context name the class; the outline still decides every boundary.
        along = torch.where(flip.view(n, 1, 1), xs, ys)
        stripes = ((along + phase) / period).floor() % 2
        checks = (((xs + phase) / period).floor() + ((ys + phase) / period).floor()) % 2
        diagonal = ((xs + ys + phase) / period).floor() % 2
        pattern = torch.where(c == 1, stripes, torch.where(c == 2, 0.0, torch.where(c == 3, checks, diagonal)))
        fill = colour.view(n, 3, 1, 1) + (second - colour).view(n, 3, 1, 1) * pattern.unsqueeze(1)
        images = torch.where(mask.unsqueeze(1), fill, images)

    images = images + 0.08 * torch.randn(images.shape, generator=generator)  # pixel noise over everything
    return (images - 0.5) / 0.3, labels


def _batches(count: int, cfg: _Config, generator: torch.Generator) -> list[Batch]:
    x, y = make_shapes(count * cfg.batch, *cfg.image, generator)
    return [(x[i * cfg.batch : (i + 1) * cfg.batch].clone(), y[i * cfg.batch : (i + 1) * cfg.batch].clone()) for i in range(count)]


def build(size: str = "small", seed: int = 0, batch_size: int | None = None) -> Workload:
    """The segment workload at ``size`` (``tiny``, ``small``, ``large``); same seed, same weights and batches.
    ``batch_size`` replaces the size's batch (rows per training batch).

    >>> w = build("tiny", seed=0)
    >>> x, y = w.batch(0)
    >>> tuple(x.shape), tuple(y.shape), w.metric().name
    ((4, 3, 16, 16), (4, 16, 16), 'mIoU')
    """
    if size not in _CONFIGS:
        raise ValueError(f"unknown size {size!r} for workload 'segment'; choose one of {', '.join(SIZES)}.")
    cfg = _CONFIGS[size] if batch_size is None else replace(_CONFIGS[size], batch=batch_size)  # --batch-size
    generator = torch.Generator().manual_seed(seed)
    train = _batches(cfg.train_batches, cfg, generator)
    # Drawn after the training set: disjoint images; the size's own eval set whatever the training batch.
    evals = _batches(cfg.eval_batches, _CONFIGS[size], generator)
    # fork_rng(devices=[]): only the CPU generator is forked and seeded (the model is built on the CPU), so
    # the caller's CPU and CUDA RNG states are left exactly as they were.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = ERFNet(len(CLASSES), cfg.widths, cfg.quarter_blocks, cfg.dilations)
    params = sum(p.numel() for p in model.parameters())
    h, w = cfg.image
    return Workload(
        name="segment",
        model=model,
        train_batches=train,
        eval_batches=evals,
        metric=functools.partial(SegmentationMetrics, num_classes=len(CLASSES)),
        loss_fn=pixel_cross_entropy,
        optimizer=functools.partial(default_optimizer, lr=cfg.lr),
        items_per_batch=cfg.batch,
        unit="samples",
        steps=cfg.steps,
        warmup=cfg.warmup,
        channels_last=True,
        description=(
            f"ERFNet-style encoder-decoder (down to 1/{2 ** len(cfg.widths)}, widths {'/'.join(map(str, cfg.widths))}, "
            f"{params / 1e6:.2f}M params) on synthetic shapes, "
            f"batch {cfg.batch} x 3x{h}x{w}, {len(CLASSES)} classes"
        ),
        extra={"parameters": params, "image_size": [h, w], "batch_size": cfg.batch, "classes": len(CLASSES),
               "widths": list(cfg.widths), "train_images": cfg.train_batches * cfg.batch,
               "eval_images": cfg.eval_batches * _CONFIGS[size].batch},
    )
