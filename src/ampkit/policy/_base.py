"""The precision-policy interface: a frozen description, and the parts of a run it builds.

Each family (full, mixed, half, low-bit, fp8) overrides only what differs, after Lightning Fabric's precision
plugins. Setup asks the policy for every precision-specific part instead of reading its flags: the module casts
(:meth:`Policy.convert_module`), the optimizers (:meth:`Policy.convert_optimizers`), the fp32 master weights
(:meth:`Policy.build_masters`), the default loss scaler (:meth:`Policy.default_scaler`), FSDP2's mixed precision
and the casts before sharding (:meth:`Policy.fsdp_mixed_precision`, :meth:`Policy.prepare_for_sharding`). The
defaults follow the description (``param_dtype``, ``master_weights``, ``loss_scaling``...), so a new family states
what it is and overrides the parts it builds otherwise. A policy never holds training state; the parts it builds
belong to the run (the optimizer step owns the masters and the scaler).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from torch import nn

from .. import _compat
from .._errors import UnsupportedPolicyError
from ..scaling import DynamicLossScaler
from ..scaling._protocol import StepScaler
from ._device import Support, as_device
from ._islands import check_keep_fp32, make_fp32_island, match_modules
from ._masters import MasterWeights

if TYPE_CHECKING:  # torch.distributed.fsdp is imported when a policy is first sharded, not with the policies
    from torch.distributed.fsdp import MixedPrecisionPolicy

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
    master_store: ClassVar[type[MasterWeights]] = MasterWeights
    """The class of the fp32 master weights :meth:`build_masters` makes (where ``master_weights``)."""
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

    # -- the parts of a run ---------------------------------------------------------------------
    def build_masters(
        self, models: Sequence[nn.Module], named: Sequence[tuple[str, nn.Parameter]], optimizers: Sequence[torch.optim.Optimizer],
        values: Mapping[int, torch.Tensor] | None = None,
    ) -> MasterWeights | None:
        """fp32 master weights for the parameters :meth:`convert_module` turns 16-bit, put in the optimizers' place of
        them; None for a policy without masters. Called before the cast, while the parameters hold their fp32 values,
        or after it with those values kept by :meth:`master_values` (optimizers built on the converted model).

        >>> import ampkit
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> masters = ampkit.get_policy("O2").build_masters([model], list(model.named_parameters()), [opt])
        >>> masters.names, ampkit.get_policy("bf16-mixed").build_masters([model], [], [opt])  # the norm stays fp32
        (['0.weight', '0.bias'], None)
        """
        if not self.master_weights:
            return None
        converted = {id(p) for m in models for c in self.converted_modules(m) for p in c.parameters(recurse=False)}
        return self.master_store.clone([(n, p) for n, p in named if id(p) in converted], optimizers, values)

    def master_values(self, models: Sequence[nn.Module]) -> dict[int, torch.Tensor]:
        """The fp32 values of the parameters :meth:`convert_module` turns 16-bit, by ``id``, to be taken before the cast
        when the optimizers come after it (``Engine.setup_module``): the masters are cloned from them, not from the
        rounded 16-bit weights. Empty for a policy without masters.

        >>> import ampkit
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
        >>> len(ampkit.get_policy("O2").master_values([model])), ampkit.get_policy("bf16-true").master_values([model])
        (2, {})
        """
        if not self.master_weights:
            return {}
        return {id(p): p.detach().to(torch.float32, copy=True) for m in models for c in self.converted_modules(m)
                for p in c.parameters(recurse=False) if p.is_floating_point()}

    def default_scaler(self) -> StepScaler | None:
        """The loss scaler a run gets unless ``Engine(scaler=...)`` says otherwise: dynamic where ``loss_scaling`` is.

        >>> import ampkit
        >>> type(ampkit.get_policy("16-mixed").default_scaler()).__name__, ampkit.get_policy("bf16-mixed").default_scaler()
        ('DynamicLossScaler', None)
        """
        return DynamicLossScaler() if self.loss_scaling == "dynamic" else None

    def casts_parameters(self) -> bool:
        """Whether setup changes the parameters' dtype (a model wrapped by DDP or FSDP before setup then cannot be used).

        >>> import ampkit
        >>> ampkit.get_policy("bf16-mixed").casts_parameters(), ampkit.get_policy("bf16-true").casts_parameters()
        (False, True)
        """
        return self.master_weights or self.param_dtype != torch.float32

    def fsdp_mixed_precision(self, root: bool = False) -> MixedPrecisionPolicy:
        """FSDP2's mixed precision for the policy's 16-bit part (the table in :mod:`ampkit.distributed._fsdp`); ``root``:
        for the model's own unit. Master-weight policies gather the fp32 shards (the masters) in 16 bits, reduce in
        fp32 and, at the root, return fp32 outputs; 16-bit storage reduces in fp32; fp32 storage needs nothing."""
        mp: type[MixedPrecisionPolicy] = _compat.MixedPrecisionPolicy  # _compat resolves it on first use, untyped
        if self.master_weights:
            return mp(param_dtype=self.param_dtype, reduce_dtype=torch.float32, output_dtype=torch.float32 if root else None)
        if self.param_dtype != torch.float32:
            return mp(reduce_dtype=torch.float32)
        return mp()

    def prepare_for_sharding(self, module: nn.Module, device_type: str) -> list[tuple[str, nn.Module]]:
        """Apply the policy to ``module`` before FSDP2 shards it; returns the fp32 units (sharded on their own, in fp32).

        Without masters the module is converted as on one device. With them the parameters stay fp32 (the shards are
        the masters, gathered in 16 bits by :meth:`fsdp_mixed_precision`): only the 16-bit part's buffers are cast,
        since FSDP casts parameters only and an fp32 buffer would promote the 16-bit activations it meets.
        """
        if not self.master_weights:
            islands = match_modules(module, self.keep_fp32)
            self.convert_module(module, device_type)
            return islands
        islands = self.fp32_islands(module)
        inside = {id(m) for _, island in islands for m in island.modules()}
        for m in module.modules():
            if id(m) in inside:
                continue
            for name, b in m._buffers.items():
                if b is not None and b.is_floating_point() and b.dtype != self.param_dtype:
                    m._buffers[name] = b.to(self.param_dtype)
        for _, island in islands:
            make_fp32_island(island, device_type, output_dtype=self.param_dtype)
        return islands

    def compile_advice(self, device_type: str, compiled: bool) -> str | None:
        """A warning for a run on ``device_type`` (``compiled``: under torch.compile) that will not pay; None by default."""
        return None

    def rounds_updates_away(self) -> bool:
        """Whether a step can lose a 16-bit weight's update to rounding for good (so a per-step audit measures a real
        loss); False where the policy compensates (Kahan summation) or rounds stochastically."""
        return not self.remedies_rounding

    def computes_in(self, dtype: torch.dtype) -> bool:
        """Whether the policy stores or computes tensors of the step in ``dtype``.

        >>> import ampkit
        >>> ampkit.get_policy("16-mixed").computes_in(torch.float16), ampkit.get_policy("bf16-true").computes_in(torch.float16)
        (True, False)
        """
        return dtype in (self.param_dtype, self.compute_dtype)

    def forward_context(self, device_type: str) -> AbstractContextManager[None]:
        """The context the forward pass and loss run in."""
        return contextlib.nullcontext()

    def backward_context(self, device_type: str) -> AbstractContextManager[None]:
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

