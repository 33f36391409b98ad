"""From "Gradient overflow. Skipping step" to a run that trains: diagnose, apply the prescription, watch it.

A small classifier whose middle layer produces activations around 1e5: fine in fp32 and bf16, beyond fp16's
65504. Under plain ``16-mixed`` every step overflows and the loss scale collapses. The doctor names the layer,
prescribes ``keep_fp32`` and a loss scale, and the same loop then trains, with the engine sampling the
numerics every 10 steps as it goes.

    python examples/fix_fp16_with_the_doctor.py
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ampkit import Engine, LossScaleCollapseError
from ampkit.numerics import diagnose


def build() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 4))
    with torch.no_grad():
        model[2].weight.mul_(2e5)  # outputs ~1e5: an unnormalised projection, as in a badly initialised layer
    return model


def batches(n: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    proj = torch.randn(16, 4, generator=g)
    xs = [torch.randn(64, 16, generator=g) for _ in range(n)]
    return [(x, (x @ proj).argmax(1)) for x in xs]  # the class is the argmax of a fixed projection


def train(engine: Engine, steps: int = 40) -> float:
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = engine.setup(model, opt)
    data = batches()
    for step in range(steps):
        x, y = data[step % len(data)]
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()
    return float(loss.detach())


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        train(Engine(precision="16-mixed"))
    except LossScaleCollapseError as exc:
        print(f"plain 16-mixed: {str(exc).splitlines()[0]}\n")

    d = diagnose(build(), batches(), steps=3, target="16-mixed")
    print(f"doctor: keep {d.keep_fp32} in fp32, start the loss scale at 2^{d.loss_scale_log2}")
    print(f"        {d.engine_code()}\n")

    final = train(Engine(**d.engine_kwargs(), numerics=10))
    print(f"\nprescribed 16-mixed: final loss {final:.3f} (fp32: {train(Engine(precision='32-true')):.3f})")


if __name__ == "__main__":
    main()
