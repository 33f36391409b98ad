"""The precision-policy interface: a frozen description plus hooks that default to doing nothing.

Each family (full, mixed, half) overrides only the hooks that differ, after Lightning Fabric's precision
plugins. A policy never holds training state; the engine does.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import nn

from ..errors import UnsupportedPolicyError
from .device import Support, as_device
from .islands import check_keep_fp32, make_fp32_island, match_modules

__all__ = ["Policy"]

LossScaling = Literal["none", "dynamic"]


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A precision policy: how the model is stored, how the forward computes, whether the loss is scaled.

    Build one through :func:`ampkit.get_policy`, which resolves aliases:

    >>> import ampkit
    >>> p = ampkit.get_policy("bf16", keep_fp32=["head"])
    >>> p.name, p.compute_dtype, p.keep_fp32
    ('bf16-mixed', torch.bfloat16, ('head',))
    """

    name: str
    """Canonical name, e.g. ``"bf16-mixed"``."""
    keep_fp32: tuple[str | type[nn.Module], ...] = field(default=())
    """Module names (shell wildcards allowed) or module types that always run in float32."""

    param_dtype: ClassVar[torch.dtype] = torch.float32
    compute_dtype: ClassVar[torch.dtype | None] = None
    master_weights: ClassVar[bool] = False
    master_remainders: ClassVar[bool] = False  # masters kept as bf16 weight + int16 remainder + tie bit (2.125 B/param, not 8)
    # The 16-bit weights' updates are compensated (Kahan) or stochastically rounded: what one step rounds away is
    # not lost, so a per-step audit of lost updates would misreport it.
    remedies_rounding: ClassVar[bool] = False
    loss_scaling: ClassVar[LossScaling] = "none"
    # fp8: torchao's casts are separate kernels unless torch.compile fuses them, which makes the eager step slower
    # than bf16-mixed's; the engine says so when a GPU run is not compiled.
    needs_compile: ClassVar[bool] = False
    description: ClassVar[str] = ""

    # -- what a device can do -------------------------------------------------------------------
    def support(self, device: torch.device | str | None = None) -> Support:
        """Whether this policy runs on ``device``, whether it is fast there, and why.

        >>> import ampkit
        >>> ampkit.get_policy("tf32").support("cpu").supported
        False
        """
        device = as_device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            return Support(False, False, "CUDA is not available here (a CPU-only torch build, or no GPU visible); train on 'cpu'")
        return self._support(device)

    def _support(self, device: torch.device) -> Support:
        # Each family overrides this with what it knows of the device; base: runs anywhere at full speed.
        return Support(True, True, "runs everywhere")

    def check_device(self, device: torch.device | str | None = None) -> None:
        """Raise UnsupportedPolicyError, naming an alternative, if ``device`` cannot run this policy."""
        s = self.support(as_device(device))
        if not s.supported:
            raise UnsupportedPolicyError(f"Policy {self.name!r} cannot run on {as_device(device)}: {s.reason}")

    # -- hooks ----------------------------------------------------------------------------------
    def fp32_islands(self, module: nn.Module) -> list[tuple[str, nn.Module]]:
        """The outermost ``(name, module)`` pairs of ``module`` that run in fp32 under this policy.

        >>> import ampkit
        >>> m = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
        >>> [n for n, _ in ampkit.get_policy("bf16-mixed").fp32_islands(m)], [n for n, _ in ampkit.get_policy("O2").fp32_islands(m)]
        ([], ['1'])
        """
        return match_modules(module, self.keep_fp32)

    def convert_module(self, module: nn.Module, device_type: str) -> None:
        """Convert ``module`` in place (parameter identity is kept, so optimizers stay valid)."""
        for _, island in self.fp32_islands(module):
            make_fp32_island(island, device_type)

    def converted_modules(self, module: nn.Module) -> list[nn.Module]:
        """The modules whose own parameters :meth:`convert_module` turns 16-bit (none by default)."""
        return []

    def convert_optimizers(self, optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
        """The optimizers setup() steps and returns in place of ``optimizers`` (the same ones by default)."""
        return list(optimizers)

    def sharded(self) -> Policy:
        """This policy as FSDP2 runs it (the same by default; fp8-tensorwise all-gathers its weights in fp8)."""
        return self

    def forward_context(self, device_type: str) -> ContextManager[None]:
        """The context the forward pass and loss run in."""
        return contextlib.nullcontext()

    def backward_context(self, device_type: str) -> ContextManager[None]:
        """The context the backward pass runs in (the engine's ``backward`` and ``grad``).

        Autocast needs none (backward ops run in the dtype their forward chose), but a process-global math mode
        does: the backward's matmuls read it when they run, after the forward's context has exited.
        """
        return contextlib.nullcontext()

    # -- convenience ----------------------------------------------------------------------------
    def with_keep_fp32(self, *modules: str | type[nn.Module]) -> Policy:
        """A copy of this policy that also keeps ``modules`` in fp32.

        >>> import ampkit
        >>> ampkit.get_policy("16-mixed").with_keep_fp32("decoder.out").keep_fp32
        ('decoder.out',)
        """
        return dataclasses.replace(self, keep_fp32=tuple(self.keep_fp32) + check_keep_fp32(modules))

    def __str__(self) -> str:
        return self.name

