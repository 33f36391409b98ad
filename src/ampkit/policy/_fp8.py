"""fp8 training: ``bf16-mixed`` whose large Linear layers multiply in fp8 through torchao's float8 training.

The model is ``bf16-mixed``'s (fp32 weights, bf16 autocast, no loss scale); at setup the Linear layers that pay
(:mod:`ampkit.policy._fp8_roofline`) are swapped for torchao's ``Float8Linear``, which casts the input, the weight
and the output gradient to fp8 with a scale computed from each tensor's absolute maximum on every call (dynamic
scaling), so there is no scaling state to save: a checkpoint holds the same fp32 weights as ``bf16-mixed``'s and
resumes bitwise. Two recipes, torchao's names:

* ``fp8-tensorwise`` (alias ``fp8``): one scale per tensor; e4m3 for inputs and weights, e5m2 for gradients;
  under FSDP2 the weights are all-gathered in fp8. The fastest.
* ``fp8-rowwise``: one power-of-two scale per row, e4m3 throughout; tolerates outlier rows, needs sm90.

Which layers are converted is the policy's ``layers``: ``"auto"`` (default) converts those the roofline predicts
faster in fp8 at ``tokens`` rows per micro-batch on the GPU (``target`` names one to plan for another), ``"all"``
every layer fp8 kernels accept, or a function ``(module, name) -> bool``. On a CPU the policy is refused (no fp8
matrix units); ``emulate=True`` runs torchao's emulation instead, for checking numerics anywhere.

    >>> import ampkit
    >>> p = ampkit.get_policy("fp8")
    >>> p.name, p.recipe, p.compute_dtype, p.loss_scaling
    ('fp8-tensorwise', 'tensorwise', torch.bfloat16, 'none')
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from .._errors import PolicyError
from ._device import Support
from ._fp8_matmuls import CONV1D_FIX, CONV1D_REASON, matmul_layers
from ._fp8_roofline import LinearCost, predict_linear
from ._gpu_specs import GPU_SPECS, GpuSpec, fp8_gpus, gpu_spec
from ._lowbit_optimizers import quiet_library_logs
from ._mixed import BF16Mixed

__all__ = ["DEFAULT_TOKENS", "EXTRA", "PLANNING_GPU", "ChosenLayers", "FP8Policy", "FP8Rowwise", "FP8Tensorwise", "Fp8LayerPlan"]

log = logging.getLogger("ampkit")

EXTRA = "fp8"
"""The ``pip install 'ampkit[...]'`` extra that brings torchao."""

DEFAULT_TOKENS = 8192
"""Rows per micro-batch the ``"auto"`` filter assumes when the policy is given none (a common per-GPU LLM batch)."""

PLANNING_GPU = "H100"
"""The GPU the filter plans for where the device has no fp8 spec of its own (a CPU under emulation, an unlisted GPU)."""

Fp8Recipe = Literal["tensorwise", "rowwise"]
LayerFilter = Literal["auto", "all"] | Callable[[nn.Module, str], bool]

# MultiheadAttention's out_proj is a Linear subclass whose weight the attention function reads directly: swapping
# it changes nothing but the module's type, so it is never converted.
_NOT_CALLED = (nn.modules.linear.NonDynamicallyQuantizableLinear,)


def _fp8_spec(name: str) -> GpuSpec | None:
    """The spec of the GPU named ``name`` if ampkit knows it and it has fp8 tensor cores; else None."""
    spec = gpu_spec(name)
    return spec if spec is not None and spec.fp8_tflops is not None else None


@dataclass(frozen=True, slots=True)
class Fp8LayerPlan:
    """What the policy does with one Linear layer, and why."""

    name: str
    convert: bool
    reason: str
    cost: LinearCost
    """The roofline's prediction on the GPU planned for, whatever decided."""
    by_roofline: bool = False
    """The roofline's prediction decided (``layers="auto"``), not a rule, ``"all"`` or the user's filter."""
    kind: str = "Linear"
    """``"Linear"``, or ``"Conv1D"``: Hugging Face's transposed Linear, never converted (:mod:`~ampkit.policy._fp8_matmuls`)."""


@dataclass(frozen=True)
class ChosenLayers:
    """A ``layers`` filter that converts exactly the named layers: a plan's decisions, made at each layer's own rows
    (``ampkit.memory.planned_policy``), carried into the policy. Picklable, unlike a lambda.

    >>> ChosenLayers(frozenset({"mlp.0"}))(nn.Linear(2, 2), "mlp.0")
    True
    """

    names: frozenset[str]

    def __call__(self, module: nn.Module, name: str) -> bool:
        return name in self.names


def missing_torchao() -> str | None:
    """Why fp8 cannot run here (torchao is not installed, said with the fix), or None. Imports nothing.

    >>> missing_torchao() is None or "pip install" in missing_torchao()
    True
    """
    if importlib.util.find_spec("torchao") is not None:
        return None
    return f"needs torchao: pip install 'ampkit[{EXTRA}]' (torchao 0.17 for torch 2.11, 0.18 for torch 2.13)"


@dataclass(frozen=True, kw_only=True)
class FP8Policy(BF16Mixed):
    """The fp8 policies' common part (see the module's docstring); build one through ``get_policy("fp8-...")``."""

    recipe: ClassVar[Fp8Recipe]
    min_capability: ClassVar[tuple[int, int]]
    needs_compile: ClassVar[bool] = True

    layers: LayerFilter = "auto"
    """Which Linear layers run in fp8: ``"auto"`` (the roofline's choice), ``"all"``, or ``fn(module, name) -> bool``."""
    tokens: int | None = None
    """Rows each Linear multiplies per micro-batch, for the ``"auto"`` filter (None: :data:`DEFAULT_TOKENS`)."""
    target: str | None = None
    """The GPU the ``"auto"`` filter predicts for (a name such as ``"H100"``; None: the device trained on)."""
    emulate: bool = False
    """Run torchao's fp8 emulation: fp8 numerics on any device, slower than bf16; for tests and numerics checks."""
    fp8_all_gather: bool = field(default=False, repr=False)
    """Set under FSDP2 by :meth:`sharded`: weights all-gathered in fp8 (tensorwise only)."""

    def __post_init__(self) -> None:
        if not (self.layers in ("auto", "all") or callable(self.layers)):
            raise PolicyError(f"{self.name}: layers must be 'auto', 'all' or a function (module, name) -> bool, got {self.layers!r}.")
        if self.tokens is not None and (isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens <= 0):
            raise PolicyError(f"{self.name}: tokens must be a positive int (rows per micro-batch), got {self.tokens!r}.")
        if self.target is not None and _fp8_spec(self.target) is None:
            raise PolicyError(f"{self.name}: target {self.target!r} is not a GPU with fp8 that ampkit knows; use one of {', '.join(fp8_gpus())}.")

    # -- device ---------------------------------------------------------------------------------
    def _support(self, device: torch.device) -> Support:
        # The device first: installing torchao does not give a CPU or an sm80 GPU fp8 matmuls, so where the device
        # cannot run fp8 that is the reason, and the missing install is said after it (for the GPU moved to).
        missing = missing_torchao()
        also = f"; fp8 also {missing}" if missing else ""
        if device.type == "cuda" and not self.emulate:
            cap = torch.cuda.get_device_capability(device)
            if cap < self.min_capability:
                need = ".".join(map(str, self.min_capability))
                return Support(
                    False, False, f"{torch.cuda.get_device_name(device)} (sm{cap[0]}{cap[1]}) has no {self.recipe} fp8 matmul (needs sm{need}+); use 'bf16-mixed'{also}"
                )
        elif device.type != "cuda" and not self.emulate:
            return Support(
                False,
                False,
                f"{device.type} has no fp8 matrix units (fp8 matmuls run there only emulated, slower than bf16); use 'bf16-mixed' "
                f"here, and plan fp8 for a GPU with `ampkit memory --fp8`{also}",
            )
        if missing:
            return Support(False, False, missing)
        if self.emulate:
            return Support(True, False, "fp8 emulated by torchao: fp8's numerics, slower than bf16 (for checks, not speed)")
        return Support(True, True, "fp8 tensor cores: pays on large Linear layers under torch.compile (see `ampkit memory --fp8`)")

    # -- which layers ---------------------------------------------------------------------------
    def planning_spec(self, device_type: str) -> GpuSpec:
        """The GPU the ``"auto"`` filter predicts for: ``target``, else this CUDA device, else :data:`PLANNING_GPU`."""
        if self.target is not None and (spec := _fp8_spec(self.target)) is not None:  # __post_init__ refused any other
            return spec
        if device_type == "cuda" and torch.cuda.is_available() and (spec := _fp8_spec(torch.cuda.get_device_name())) is not None:
            return spec
        return next(s for s in GPU_SPECS if s.name == PLANNING_GPU)

    def plan_layers(self, module: nn.Module, device_type: str, tokens: dict[str, int] | None = None) -> list[Fp8LayerPlan]:
        """Each Linear layer of ``module`` (Hugging Face's Conv1D included, never converted): converted to fp8 or
        not, and why. ``tokens`` per layer overrides ``self.tokens``.

        >>> import ampkit
        >>> model = nn.Sequential(nn.Linear(4096, 4096), nn.Linear(4096, 10))
        >>> [(p.name, p.convert) for p in ampkit.get_policy("fp8").plan_layers(model, "cuda")]
        [('0', True), ('1', False)]
        """
        islands = [name for name, _ in self.fp32_islands(module)]
        spec = self.planning_spec(device_type)
        plans = []
        for layer in matmul_layers(module):
            rows = (tokens or {}).get(layer.name, self.tokens or DEFAULT_TOKENS)
            cost = predict_linear(spec, rows, layer.in_features, layer.out_features)
            plan = self._plan(layer.name, layer.module, cost, islands, spec)
            if not layer.converts:
                # Planned as the Linear it is, so the table shows what fp8 would give it; torchao cannot swap it.
                reason = f"{CONV1D_REASON} (as one: {plan.reason})" if plan.convert else plan.reason
                plan = Fp8LayerPlan(layer.name, False, reason, cost, by_roofline=plan.by_roofline and not plan.convert, kind=layer.kind)
            plans.append(plan)
        return plans

    def _plan(self, name: str, m: nn.Module, cost: LinearCost, islands: list[str], spec: GpuSpec) -> Fp8LayerPlan:
        if any(i == "" or name == i or name.startswith(i + ".") for i in islands):
            return Fp8LayerPlan(name, False, "kept in fp32 (keep_fp32)", cost)
        if isinstance(m, _NOT_CALLED):
            return Fp8LayerPlan(name, False, "MultiheadAttention reads this weight directly", cost)
        if not cost.fits:
            return Fp8LayerPlan(name, False, f"{cost.in_features}x{cost.out_features}: fp8 kernels need multiples of 16", cost)
        if isinstance(self.layers, ChosenLayers):
            chosen = name in self.layers.names
            return Fp8LayerPlan(name, chosen, "faster in fp8 at its rows" if chosen else "slower in fp8 at its rows", cost)
        if callable(self.layers):
            chosen = bool(self.layers(m, name))
            return Fp8LayerPlan(name, chosen, "chosen by your filter" if chosen else "left out by your filter", cost)
        if self.layers == "all":
            return Fp8LayerPlan(name, True, "layers='all'", cost)
        verdict = "faster" if cost.pays else "slower"
        return Fp8LayerPlan(name, cost.pays, f"{cost.speedup:.2f}x predicted on {spec.name}: {verdict} in fp8", cost, by_roofline=True)

    # -- hooks ----------------------------------------------------------------------------------
    def compile_advice(self, device_type: str, compiled: bool) -> str | None:
        if device_type != "cuda" or compiled:
            return None
        return f"{self.name} without torch.compile runs each fp8 cast as kernels of its own: expect it slower than bf16-mixed. Pass Engine(compile=True)."

    def sharded(self) -> FP8Policy:
        return dataclasses.replace(self, fp8_all_gather=self.recipe == "tensorwise")

    def float8_config(self) -> Any:
        """torchao's ``Float8LinearConfig`` for this policy (imports torchao)."""
        with quiet_library_logs("torchao", "torchao.kernel.intmm", "torch.utils._pytree"):
            from torchao.float8 import Float8LinearConfig

        config = Float8LinearConfig.from_recipe_name(self.recipe)
        return dataclasses.replace(config, emulate=self.emulate, enable_fsdp_float8_all_gather=self.fp8_all_gather)

    def convert_module(self, module: nn.Module, device_type: str) -> None:
        super().convert_module(module, device_type)
        plans = self.plan_layers(module, device_type)
        chosen = {p.name for p in plans if p.convert}
        _warn_unconverted(self.name, plans)
        if "" in chosen:
            raise PolicyError(f"{self.name} converts the Linear layers inside a model, and this model is one nn.Linear: wrap it, e.g. nn.Sequential(model).")
        if not chosen:
            log.warning("%s: no Linear layer is converted to fp8 (%d considered); the model trains as bf16-mixed. %s",
                        self.name, len(plans), _why_none(plans))
            return
        with quiet_library_logs("torchao", "torchao.kernel.intmm", "torch.utils._pytree"):
            from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(module, module_filter_fn=lambda m, name: name in chosen, config=self.float8_config())
        log.info("%s: %d of %d Linear layers run in fp8", self.name, len(chosen), len(plans))


def _warn_unconverted(policy: str, plans: list[Fp8LayerPlan]) -> None:
    """Warn when Conv1D layers the policy would run in fp8 stay in bf16: the speed asked for is silently missing."""
    missed = [p.name for p in plans if p.kind != "Linear" and p.reason.startswith(CONV1D_REASON)]
    if missed:
        shown = ", ".join(missed[:4]) + (f" and {len(missed) - 4} more" if len(missed) > 4 else "")
        log.warning("%s: %d Conv1D layer%s (%s) stay%s in bf16: %s; %s.", policy, len(missed), "s" if len(missed) > 1 else "",
                    shown, "" if len(missed) > 1 else "s", CONV1D_REASON, CONV1D_FIX)


def _why_none(plans: list[Fp8LayerPlan]) -> str:
    if not plans:
        return "The model has no nn.Linear (and no Hugging Face Conv1D)."
    return "First: " + "; ".join(f"{p.name}: {p.reason}" for p in plans[:3]) + ". Pass layers='all' to convert every layer that fits."


@dataclass(frozen=True, kw_only=True)
class FP8Tensorwise(FP8Policy):
    """``fp8-tensorwise``: ``bf16-mixed`` with fp8 Linear layers, one dynamic scale per tensor (torchao's default).

    Needs ``pip install 'ampkit[fp8]'`` and a GPU of compute capability 8.9+ (Ada, Hopper, Blackwell); pays with
    ``torch.compile`` on large layers only (the default ``layers="auto"`` converts only those).

    >>> import ampkit
    >>> ampkit.get_policy("fp8-tensorwise", keep_fp32=["head"]).keep_fp32
    ('head',)
    """

    name: str = "fp8-tensorwise"
    recipe: ClassVar[Fp8Recipe] = "tensorwise"
    min_capability: ClassVar[tuple[int, int]] = (8, 9)
    description: ClassVar[str] = "fp32 weights, bf16 autocast, fp8 Linear layers with per-tensor scales (torchao)"


@dataclass(frozen=True, kw_only=True)
class FP8Rowwise(FP8Policy):
    """``fp8-rowwise``: ``bf16-mixed`` with fp8 Linear layers, one power-of-two scale per row (torchao's rowwise).

    More robust to outlier rows than tensorwise, a little slower; its kernel needs compute capability 9.0
    (Hopper) or newer. Needs ``pip install 'ampkit[fp8]'``.

    >>> import ampkit
    >>> ampkit.get_policy("fp8-rowwise").description
    'fp32 weights, bf16 autocast, fp8 Linear layers with per-row scales (torchao)'
    """

    name: str = "fp8-rowwise"
    recipe: ClassVar[Fp8Recipe] = "rowwise"
    min_capability: ClassVar[tuple[int, int]] = (9, 0)
    description: ClassVar[str] = "fp32 weights, bf16 autocast, fp8 Linear layers with per-row scales (torchao)"
