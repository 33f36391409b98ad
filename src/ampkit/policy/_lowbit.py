"""``bf16-true`` whose optimizer applies bf16 updates with Kahan summation or stochastic rounding.

The model is exactly ``bf16-true``'s (bf16 weights and compute, ``keep_fp32`` modules in fp32, no masters, no
loss scale); only the optimizer differs. ``Engine.setup()`` replaces each torch optimizer by its library twin
(:mod:`ampkit.policy._lowbit_optimizers`) and returns the twin: build LR schedulers on what setup() returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from ._device import Support
from ._half import BF16True
from ._lowbit_optimizers import LowbitMethod, lowbit_twin, missing_library

__all__ = ["BF16TrueKahan", "BF16TrueSR"]


@dataclass(frozen=True, kw_only=True)
class _Lowbit(BF16True):
    method: ClassVar[LowbitMethod]
    remedies_rounding: ClassVar[bool] = True

    def _support(self, device: torch.device) -> Support:
        # Without the optional library the policy cannot run: said here, tools that list the policies a device
        # runs (ampkit memory, bench) leave it out instead of failing on it.
        missing = missing_library(self.method)
        return Support(False, False, missing) if missing else super()._support(device)

    def convert_optimizers(self, optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
        return [lowbit_twin(opt, self.method) for opt in optimizers]


@dataclass(frozen=True, kw_only=True)
class BF16TrueKahan(_Lowbit):
    """``bf16-true-kahan``: ``bf16-true`` with Kahan-compensated updates (optimi's ``kahan_sum=True``).

    Memory: a bf16 compensation buffer per bf16 weight, +2 bytes per parameter; the moments stay bf16. Converts
    ``torch.optim.Adam``, ``AdamW`` and ``SGD``; refuses what optimi cannot match exactly (amsgrad, nesterov,
    dampening, maximize), an optimizer that has stepped, and one with an LR scheduler attached. Needs
    ``pip install 'ampkit[lowbit]'``.

    >>> import ampkit
    >>> p = ampkit.get_policy("bf16-true-kahan")
    >>> p.param_dtype, p.master_weights, p.loss_scaling
    (torch.bfloat16, False, 'none')
    """

    name: str = "bf16-true-kahan"
    method: ClassVar[LowbitMethod] = "kahan"
    description: ClassVar[str] = "bf16 weights and compute, Kahan-compensated updates (optimi)"


@dataclass(frozen=True, kw_only=True)
class BF16TrueSR(_Lowbit):
    """``bf16-true-sr``: ``bf16-true`` with stochastically rounded updates (torchao's ``bf16_stochastic_round``).

    Memory: nothing beyond ``bf16-true`` (the moments stay bf16). Converts ``torch.optim.Adam`` and ``AdamW``;
    refuses SGD (torchao has no such optimizer: use ``bf16-true-kahan``), maximize, an optimizer that has
    stepped, and one with an LR scheduler attached. The engine's rounding draws from a stream of its own, the
    same on every DDP replica and kept in checkpoints (:mod:`ampkit.training._rounding_stream`). Needs
    ``pip install 'ampkit[lowbit]'``.

    >>> import ampkit
    >>> ampkit.get_policy("bf16-true-sr").description
    'bf16 weights and compute, stochastically rounded updates (torchao)'
    """

    name: str = "bf16-true-sr"
    method: ClassVar[LowbitMethod] = "sr"
    description: ClassVar[str] = "bf16 weights and compute, stochastically rounded updates (torchao)"
