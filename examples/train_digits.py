"""Train a small CNN on scikit-learn's bundled 8x8 digits under one or more precision policies.

The whole loop fits on one screen: ampkit's Engine takes care of autocast, loss scaling, accumulation,
clipping, skipped steps and the LR schedule; the loop itself stays the user's. Every policy starts from the
same weights and sees the same batches in the same order, so the table at the end compares like with like.

    python examples/train_digits.py                                    # 32-true and bf16-mixed side by side
    python examples/train_digits.py --precision 16-mixed --accumulate 4
    python examples/train_digits.py --precision bf16-mixed --checkpoint runs/digits.pt   # resumable
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn

import ampkit


def digits(device: torch.device) -> tuple[torch.Tensor, ...]:
    """The 1,797 real 8x8 digit images, scaled to [0, 1]; a fixed 80/20 split. Nothing is downloaded."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0  # (N, 1, 8, 8), pixel values 0..16
    y = torch.tensor(y, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order].to(device), y[order].to(device)
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),   # (B, 32, 8, 8)
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),  # (B, 64, 8, 8)
        nn.MaxPool2d(2), nn.Flatten(),                                   # (B, 1024)
        nn.Linear(1024, 128), nn.ReLU(), nn.Linear(128, 10),             # (B, 10) logits
    )


def train(precision: str, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    torch.manual_seed(args.seed)  # same initial weights and batch order for every policy
    x_train, y_train, x_test, y_test = digits(device)
    model = cnn().to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, fused=True)
    batches_per_epoch = -(-len(x_train) // args.batch_size)
    steps_per_epoch = -(-batches_per_epoch // args.accumulate)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr, total_steps=args.epochs * steps_per_epoch)

    engine = ampkit.Engine(precision, accumulate=args.accumulate, clip_grad_norm=args.clip)
    model, optimizer = engine.setup(model, optimizer, schedulers=scheduler)
    first_epoch = 0
    if args.checkpoint and args.checkpoint.exists():
        first_epoch = engine.load(args.checkpoint)["epoch"] + 1  # weights, optimizer, scaler, RNG: all of it
        print(f"[{precision}] resumed from {args.checkpoint} at epoch {first_epoch}")

    step_times: list[float] = []
    total, seen = torch.zeros((), device=device), 0  # the last epoch's summed loss, kept on the device
    for epoch in range(first_epoch, args.epochs):
        model.train()
        engine.start_epoch(batches_per_epoch)  # the last accumulation window of the epoch may be short
        perm = torch.randperm(len(x_train), device=device)
        total, seen = torch.zeros((), device=device), 0  # summed on the device: no sync per batch
        for i in range(batches_per_epoch):
            idx = perm[i * args.batch_size : (i + 1) * args.batch_size]
            xb, yb = x_train[idx].contiguous(memory_format=torch.channels_last), y_train[idx]
            start = time.perf_counter()
            with engine.autocast():
                loss = nn.functional.cross_entropy(model(xb).float(), yb)
            engine.backward(loss)
            engine.step()  # updates the weights only at the end of an accumulation window
            step_times.append(time.perf_counter() - start)
            total, seen = total + loss.detach() * len(idx), seen + len(idx)
        accuracy = evaluate(model, engine, x_test, y_test)
        scale = f"{engine.scale:g}" if engine.scale is not None else "-"
        print(
            f"[{precision}] epoch {epoch + 1}/{args.epochs}  loss {total.item() / seen:.4f}  test acc {accuracy:.4f}"
            f"  skipped {engine.skipped_steps}  scale {scale}"
        )
        if args.checkpoint:
            engine.save(args.checkpoint, extra={"epoch": epoch})  # atomic: a crash keeps the previous file
    return {
        "loss": total.item() / seen if seen else float("nan"),  # nan: resumed after the last epoch
        "accuracy": evaluate(model, engine, x_test, y_test),
        "ms_per_batch": 1e3 * statistics.median(step_times[len(step_times) // 10 :]) if step_times else float("nan"),
        "skipped": engine.skipped_steps,
    }


@torch.no_grad()
def evaluate(model: nn.Module, engine: ampkit.Engine, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with engine.autocast():
        logits = model(x.contiguous(memory_format=torch.channels_last))
    model.train()
    return (logits.argmax(1) == y).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="32-true,bf16-mixed", help="comma-separated policies or aliases")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, help="save every epoch and resume from it (one policy only)")
    args = parser.parse_args()
    try:
        policies = [ampkit.get_policy(p).name for p in args.precision.split(",")]
    except ampkit.PolicyError as e:
        parser.error(str(e))  # one line that names the valid policies and the closest match
    if args.checkpoint and len(policies) > 1:
        parser.error("--checkpoint takes a single --precision")
    device = torch.device("cpu")

    results = {p: train(p, args, device) for p in policies}
    print(f"\n{'precision':<18} {'ms/batch':>9} {'final loss':>11} {'test acc':>9} {'skipped':>8}")
    for p, r in results.items():
        print(f"{p:<18} {r['ms_per_batch']:>9.2f} {r['loss']:>11.4f} {r['accuracy']:>9.4f} {r['skipped']:>8}")


if __name__ == "__main__":
    main()
