"""Models built to break fp16 in one known layer, shared by the doctor's tests (and usable as --model factories).

- :func:`overflow_net`: ``amplify``'s weights are scaled so its outputs reach ~1e5, beyond fp16's 65504; a
  LayerNorm after it brings them back, so fp32 (and bf16, with fp32's range) trains normally while fp16 autocast
  turns the forward into inf/NaN on every step.
- :func:`underflow_net`: the gradient flowing into ``embed``'s output is multiplied by 2^-28 (a custom autograd
  function; the forward is untouched), and the loss is weighted by 2^-12: ``embed``'s gradients sit near 2^-45,
  which fp16 flushes to zero even at GradScaler's 2^16, while the other layers' gradients allow a scale near
  2^29 that brings them into range. Adam with a tiny eps is invariant to the gradient's size, so in fp32 ``embed``
  learns as much as any layer.
- :func:`shift_net`: ``shift`` adds 256 to its inputs (values near 1) and the LayerNorm after it takes the mean away
  again: exact in fp32, while bf16's 8 bits hold 256 + x only to a step of 2, so the signal is lost in the
  activation handed between the two modules. Under ``bf16-mixed`` keeping the layers before the norm in fp32 hands
  the norm fp32 values (an island's output stays fp32 under autocast); under ``bf16-true`` an island hands its
  output back in bf16, so no ``keep_fp32`` repairs it. fp16's 11 bits (a step of 0.25 at 256) lose less.
- :func:`root_shift_net`: the model's own forward (no submodule) adds 4096 to a matmul's outputs (values near 1)
  and normalises them away: exact in fp32, lost in fp16 (a step of 4 there) and bf16 (a step of 32), in arithmetic no
  ``keep_fp32`` can reach, so no 16-bit policy trains it.
- :func:`grad_scaling_backend`: a torch.compile backend that breaks one module's gradient in the compiled step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

OVERFLOW_LAYER = "amplify"
UNDERFLOW_LAYER = "embed"
UNDERFLOW_LOSS_WEIGHT = 2.0**-12
GRAD_SHRINK = 2.0**-28
SHIFT = 256.0


class OverflowNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.amplify = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 4)
        with torch.no_grad():
            self.amplify.weight.mul_(2e5)  # outputs ~1e5: fine in fp32 and bf16, inf in fp16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(torch.relu(self.amplify(torch.relu(self.embed(x))))))


class _ShrinkGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad * GRAD_SHRINK


class UnderflowNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.body = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _ShrinkGrad.apply(torch.relu(self.embed(x)))
        return self.head(torch.relu(self.body(h)))


class Shift(nn.Module):
    def __init__(self, offset: float) -> None:
        super().__init__()
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offset


class ShiftNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.shift = Shift(SHIFT)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.shift(torch.relu(self.embed(x)))))


def shift_net() -> nn.Module:
    torch.manual_seed(0)
    return ShiftNet()


class RootShiftNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 4) / 4)  # a raw parameter: the matmul is the root's own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x @ self.weight + 4096.0, (4,))


def root_shift_net() -> nn.Module:
    torch.manual_seed(0)
    return RootShiftNet()


def overflow_net() -> nn.Module:
    torch.manual_seed(0)
    return OverflowNet()


def underflow_net() -> nn.Module:
    torch.manual_seed(0)
    return UnderflowNet()


def batches(n: int = 8, rows: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable 4-class problem: the class is the argmax of a fixed projection of the inputs."""
    g = torch.Generator().manual_seed(1)
    proj = torch.randn(16, 4, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(rows, 16, generator=g)
        out.append((x, (x @ proj).argmax(1)))
    return out


def underflow_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return UNDERFLOW_LOSS_WEIGHT * nn.functional.cross_entropy(output, target)


def scale_free_adam(params) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    # eps far below any gradient here: the update depends on the gradient's sign pattern, not its size.
    return torch.optim.Adam(params, lr=1e-2, eps=1e-30)


def grad_scaling_backend(shape: tuple[int, ...], factor: float = 1.01) -> Any:
    """A torch.compile backend (built as torch's custom-backend guide shows) whose backward returns the gradient of
    the parameter of this ``shape`` multiplied by ``factor``: a compiler bug confined to one module."""
    from torch._dynamo.backends.common import aot_autograd

    def boxed(fn: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        fn._boxed_call = True  # type: ignore[attr-defined]  # AOTAutograd calls a boxed function with one list
        return fn

    def forward(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        return boxed(lambda args: gm(*args))

    def backward(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        return boxed(lambda args: [g * factor if isinstance(g, torch.Tensor) and tuple(g.shape) == shape else g for g in gm(*args)])

    return aot_autograd(fw_compiler=forward, bw_compiler=backward)
