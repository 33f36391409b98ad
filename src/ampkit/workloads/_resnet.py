"""``resnet``: a ResNet-18-like CNN on synthetic random images, for throughput and memory only.

Random images carry nothing to learn, so there is no eval metric: the workload measures how fast, and in how
much memory, each policy runs the convolution-heavy step that dominates vision training.

    >>> w = build("tiny")
    >>> x, y = w.batch(0)
    >>> tuple(x.shape), tuple(y.shape), w.metric is None, w.eval_batches
    ((4, 3, 16, 16), (4,), True, ())
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from ._workload import SIZES, Batch, Workload, default_optimizer

__all__ = ["BasicBlock", "ResNet18", "build"]


@dataclass(frozen=True)
class _Config:
    width: int  # channels of the first stage; the next three double it (ResNet-18: 64)
    image: int  # square images, a multiple of 8
    classes: int
    batch: int
    distinct_batches: int  # the runner cycles through them; random data needs no more
    steps: int
    warmup: int


_CONFIGS = {
    "tiny": _Config(width=4, image=16, classes=10, batch=4, distinct_batches=2, steps=6, warmup=2),
    # small: width 32 on 32x32 images keeps a step near 0.2 s in fp32 on two cores, with convolutions wide
    # enough (32 to 256 channels) for bf16 to pay.
    "small": _Config(width=32, image=32, classes=10, batch=32, distinct_batches=4, steps=50, warmup=3),
    "large": _Config(width=64, image=64, classes=100, batch=128, distinct_batches=8, steps=300, warmup=10),
}


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers and a residual connection; a 1x1 conv-BN shortcut where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for small images: a 3x3 stem (no 7x7 conv, no max-pool, as for CIFAR), four stages of two
    BasicBlocks at ``width``, 2x, 4x, 8x channels (strides 1, 2, 2, 2), global average pooling, a linear head.

    >>> ResNet18(width=4, classes=7)(torch.zeros(2, 3, 16, 16)).shape
    torch.Size([2, 7])
    """

    def __init__(self, width: int = 64, classes: int = 10, stages: tuple[int, ...] = (2, 2, 2, 2)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks: list[nn.Module] = []
        cin = width
        for i, n in enumerate(stages):
            cout = width * 2**i
            for j in range(n):
                blocks.append(BasicBlock(cin, cout, stride=2 if i > 0 and j == 0 else 1))
                cin = cout
        self.stages = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # He initialisation, as torchvision's ResNet
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(size: str = "small", seed: int = 0, batch_size: int | None = None) -> Workload:
    """The resnet workload at ``size`` (``tiny``, ``small``, ``large``); same seed, same weights and batches.
    ``batch_size`` replaces the size's batch (rows per training batch).

    >>> w = build("tiny", seed=2)
    >>> w.name, w.channels_last, w.unit, w.extra["image_size"]
    ('resnet', True, 'samples', [16, 16])
    """
    if size not in _CONFIGS:
        raise ValueError(f"unknown size {size!r} for workload 'resnet'; choose one of {', '.join(SIZES)}.")
    cfg = _CONFIGS[size] if batch_size is None else replace(_CONFIGS[size], batch=batch_size)  # --batch-size
    generator = torch.Generator().manual_seed(seed)
    batches: list[Batch] = [
        (
            torch.randn(cfg.batch, 3, cfg.image, cfg.image, generator=generator),
            torch.randint(0, cfg.classes, (cfg.batch,), generator=generator),
        )
        for _ in range(cfg.distinct_batches)
    ]
    # fork_rng(devices=[]): only the CPU generator is forked and seeded (the model is built on the CPU), so
    # the caller's CPU and CUDA RNG states are left exactly as they were.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = ResNet18(width=cfg.width, classes=cfg.classes)
    params = sum(p.numel() for p in model.parameters())
    return Workload(
        name="resnet",
        model=model,
        train_batches=batches,
        eval_batches=(),
        metric=None,
        optimizer=functools.partial(default_optimizer, lr=1e-3),
        items_per_batch=cfg.batch,
        unit="samples",
        steps=cfg.steps,
        warmup=cfg.warmup,
        channels_last=True,
        description=(
            f"ResNet-18-like (width {cfg.width}, {params / 1e6:.2f}M params) on synthetic random images, "
            f"batch {cfg.batch} x 3x{cfg.image}x{cfg.image}, {cfg.classes} classes (throughput and memory only)"
        ),
        extra={"parameters": params, "image_size": [cfg.image, cfg.image], "batch_size": cfg.batch,
               "width": cfg.width, "classes": cfg.classes},
    )
