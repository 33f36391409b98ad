"""Train a small CNN on scikit-learn's bundled 8x8 digits with Lightning, any ampkit policy through its plugin.

The LightningModule is ordinary Lightning; the one ampkit line is ``plugins=[AmpkitPrecision(...)]``. Its state
(loss scale, fp32 masters, counters) goes into Lightning's own checkpoint, so ``--resume`` continues with the fp32
masters and the scale where they were, not from the 16-bit weights.

    python examples/train_digits_lightning.py                                      # bf16-mixed
    python examples/train_digits_lightning.py --precision bf16-true-masters --epochs 4 --checkpoint runs/lit
    python examples/train_digits_lightning.py --precision bf16-true-masters --epochs 6 --checkpoint runs/lit --resume

The tools take the same module: ``ampkit bench --model examples/train_digits_lightning.py:LitDigits`` (its
``training_step`` is the loss, its loaders the data) and print their advice as a Lightning ``Trainer(...)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch
from sklearn.datasets import load_digits
from torch import nn

from ampkit.lightning import AmpkitPrecision


class LitDigits(L.LightningModule):
    def __init__(self, lr: float = 2e-3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),   # (B, 32, 8, 8)
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),  # (B, 64, 8, 8)
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),        # (B, 10)
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x).float(), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_accuracy", (self.net(x).argmax(1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)

    def _loader(self, train: bool) -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
        x, y = load_digits(return_X_y=True)  # 1,797 real 8x8 images, bundled: nothing is downloaded
        x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        cut = int(0.8 * len(x))
        rows = order[:cut] if train else order[cut:]
        data = torch.utils.data.TensorDataset(x[rows], torch.tensor(y, dtype=torch.int64)[rows])
        return torch.utils.data.DataLoader(data, batch_size=64, shuffle=train, generator=torch.Generator().manual_seed(1) if train else None)

    def train_dataloader(self) -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
        return self._loader(train=True)

    def val_dataloader(self) -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
        return self._loader(train=False)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="bf16-mixed", help="any ampkit policy (default: bf16-mixed)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoint", type=Path, default=None, help="folder for Lightning's last.ckpt")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint's last.ckpt")
    args = parser.parse_args(argv)
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=args.checkpoint, save_last=True)] if args.checkpoint else []
    trainer = L.Trainer(
        max_epochs=args.epochs, accelerator="cpu", plugins=[AmpkitPrecision(args.precision)], callbacks=callbacks,
        enable_checkpointing=args.checkpoint is not None, logger=False, enable_model_summary=False,
    )
    module = LitDigits()
    trainer.fit(module, ckpt_path=args.checkpoint / "last.ckpt" if args.resume and args.checkpoint else None)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    engine = trainer.precision_plugin.engine
    print(f"{args.precision}: val accuracy {metrics.get('val_accuracy', float('nan')):.3f} after {engine.steps} optimizer steps "
          f"({engine.skipped_steps} skipped)")
    return metrics


if __name__ == "__main__":
    main()
