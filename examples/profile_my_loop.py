"""Profile your own training loop with ampkit's Profiler: where each step's time goes, the host syncs and the lines
that make them, and the DataLoader settings that make the step faster, each timed on this loop.

The loop is an ordinary one: a Dataset whose ``__getitem__`` does per-sample work (here, a noisy blur of each
image, in numpy), a DataLoader as most scripts build it, and the loss printed every step. The Profiler joins the
engine as a step hook; the loop reads its batches through ``profiler.batches`` so the wait for data and the copy
are timed apart from the loop's own code.

    python examples/profile_my_loop.py                       # prints the table and the advice
    python examples/profile_my_loop.py --out runs/profile    # also profile.json, report.md, phases.png, trials.png
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import ampkit
from ampkit.profile import Profiler, save_profile, show_profile, try_loader_settings


class NoisyBlurredImages(Dataset):
    """``n`` random 32x32 images with a class each; every read adds noise and blurs the image in numpy, as an
    augmentation pipeline does: deliberately slow per-sample work."""

    def __init__(self, n: int, work: int) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.random((n, 32, 32), dtype=np.float32)
        self.labels = rng.integers(0, 10, n)
        self.work = work  # blur passes per sample: the knob of the per-sample cost

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = self.images[i] + np.random.default_rng(i).normal(0, 0.1, (32, 32)).astype(np.float32)
        for _ in range(self.work):
            image = (image + np.roll(image, 1, 0) + np.roll(image, -1, 0) + np.roll(image, 1, 1) + np.roll(image, -1, 1)) / 5
        return torch.from_numpy(image).unsqueeze(0), int(self.labels[i])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--work", type=int, default=40, help="blur passes per sample (the per-sample cost)")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--timed", type=int, default=15, help="steps whose phases are timed")
    parser.add_argument("--out", help="write profile.json, report.md and the plots here")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16 * 16, 10))
    engine = ampkit.Engine(args.precision)
    model, optimizer = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    loader = DataLoader(NoisyBlurredImages(args.samples, args.work), batch_size=64)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()
        return loss

    with Profiler(engine, warmup=3, plain_steps=5, timed=args.timed, sync_steps=5, trace_steps=3, trace_dir=args.out) as profiler:
        for i, batch in enumerate(profiler.batches(loader)):
            loss = step(batch)
            print(f"step {i} loss {loss.item():.3f}", end="\r")  # a read-back every step, as most loops log
    print()
    trials = try_loader_settings(loader, step, engine.device)  # the DataLoader's variants, timed on this step
    profile = profiler.result(trials=trials)
    show_profile(profile)
    if args.out:
        json_path, report = save_profile(profile, args.out)
        print(f"wrote {json_path} and {report}")


if __name__ == "__main__":
    main()
