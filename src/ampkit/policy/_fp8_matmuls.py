"""The layers fp8 training would see: every ``nn.Linear``, and Hugging Face's ``Conv1D``, a Linear in all but layout.

transformers builds GPT-2's projections (and those of OpenAI GPT, ImageGPT, CLVP, Decision Transformer) from
``transformers.pytorch_utils.Conv1D``: a weight of shape ``(in, out)`` applied as ``addmm(bias, x, weight)``, the
matmul of ``nn.Linear(in, out)`` whose weight is ``weight.t()``. torchao's float8 training swaps only
``nn.Linear`` (``convert_to_float8_training`` tests ``isinstance(module, nn.Linear)``), so under an fp8 policy
these layers stay in bf16. ampkit does not swap them itself: a Linear needs the weight transposed, a new
Parameter that the optimizer, built before ``Engine.setup``, does not hold (it would go on stepping the old one),
and a checkpoint layout that is no longer the model's. So they are planned and measured as the Linear they are,
and named as not converted, with :data:`CONV1D_FIX`. They are recognised by class name and layout, without
importing transformers (an optional extra).

    >>> from torch import nn
    >>> class Conv1D(nn.Module):  # transformers.pytorch_utils.Conv1D's layout
    ...     def __init__(self, nf, nx):
    ...         super().__init__()
    ...         self.nf, self.weight, self.bias = nf, nn.Parameter(torch.zeros(nx, nf)), nn.Parameter(torch.zeros(nf))
    >>> [(m.name, m.kind, m.in_features, m.out_features) for m in matmul_layers(nn.Sequential(Conv1D(48, 16), nn.Linear(48, 8)))]
    [('0', 'Conv1D', 16, 48), ('1', 'Linear', 48, 8)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import torch
from torch import nn

__all__ = ["CONV1D", "CONV1D_FIX", "CONV1D_REASON", "MatmulLayer", "conv1d_features", "conv1d_note", "matmul_layers"]

CONV1D: Final = "Conv1D"  # Final: its type is the literal, one of MatmulLayer.kind's
"""The class name of Hugging Face's transposed Linear (``transformers.pytorch_utils.Conv1D``)."""
CONV1D_REASON = "Conv1D: torchao converts only nn.Linear"
"""Why a Conv1D layer is not converted, as a plan's reason says it."""
CONV1D_FIX = (
    "to run them in fp8, replace each Conv1D with an nn.Linear(in, out) holding weight.t() before building the "
    "optimizer (the checkpoint then holds the weights transposed)"
)
"""What a user does to run Conv1D layers in fp8: ampkit cannot do it under an optimizer already built."""


@dataclass(frozen=True)
class MatmulLayer:
    """One layer whose forward is ``x @ W^T + b``: its name, module, features and kind (``"Linear"`` or ``"Conv1D"``)."""

    name: str
    module: nn.Module
    in_features: int
    out_features: int
    kind: Literal["Linear", "Conv1D"]

    @property
    def converts(self) -> bool:
        """torchao's float8 conversion can swap this layer (it is an ``nn.Linear``)."""
        return self.kind == "Linear"

    def linear_weight(self) -> torch.Tensor:
        """The weight as ``nn.Linear`` holds it, ``(out, in)``: a Conv1D's transposed (a view, no copy)."""
        weight = self.module.weight
        assert isinstance(weight, torch.Tensor)
        return weight if self.kind == "Linear" else weight.t()


def conv1d_features(module: nn.Module) -> tuple[int, int] | None:
    """``(in_features, out_features)`` of a Hugging Face ``Conv1D`` (by class name and layout: a 2-D weight
    ``(in, out)``, a bias of ``out`` or none, ``nf == out`` where set); None for any other module.

    >>> conv1d_features(nn.Linear(4, 8)) is None
    True
    """
    if type(module).__name__ != CONV1D or isinstance(module, nn.Linear):
        return None
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    n_in, n_out = weight.shape
    if getattr(module, "nf", n_out) != n_out or (isinstance(bias, torch.Tensor) and tuple(bias.shape) != (n_out,)):
        return None
    return int(n_in), int(n_out)


def matmul_layers(model: nn.Module) -> list[MatmulLayer]:
    """Every ``nn.Linear`` and Hugging Face ``Conv1D`` of ``model``, in ``named_modules`` order."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            found.append(MatmulLayer(name, module, module.in_features, module.out_features, "Linear"))
        elif (features := conv1d_features(module)) is not None:
            found.append(MatmulLayer(name, module, *features, CONV1D))
    return found


def conv1d_note(count: int, total: int) -> str:
    """The sentence a plan or a measurement of ``total`` layers ends with when ``count`` are Conv1D; empty for none.

    >>> conv1d_note(0, 1), conv1d_note(8, 9)[:53]
    ('', '8 of the 9 layers are Hugging Face Conv1D (a Linear w')
    """
    if not count:
        return ""
    return (
        f"{count} of the {total} layers {'is' if count == 1 else 'are'} Hugging Face Conv1D (a Linear with its weight "
        f"stored transposed), which torchao's float8 training does not convert: under fp8 policies they stay in bf16; "
        f"{CONV1D_FIX}."
    )
