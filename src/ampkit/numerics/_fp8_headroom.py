"""fp8 headroom: would each Linear's three operands survive torchao's dynamic float8 cast?

Under torchao's float8 training every ``nn.Linear`` casts its input, its weight and the gradient of its output
to fp8 with a dynamic scale, ``scale = fp8_max / amax``: the largest value always fits, so what is lost is the
small values. This module runs one training step (forward and backward) of the model in fp32 with hooks on
every Linear and casts each operand as the recipe would, with torch's own float8 dtypes and torchao's scaling
rule (:func:`fp8_cast_figures`), without needing torchao. Per operand it reports the amax, the format, the share
of nonzero elements flushed to zero and the relative error of the round trip ``‖dequant(cast(x)) - x‖ / ‖x‖``.

Recipes (torchao's ``Float8LinearConfig.from_recipe_name``):

- ``tensorwise``: input and weight in e4m3fn, grad_output in e5m2, one scale per tensor;
- ``rowwise``: all three in e4m3fn, one scale per row along the matmul's reduction axis, rounded down to a
  power of two. Each operand enters two matmuls (input: the forward and the weight gradient), reduced along
  its last axis in one and its first (the tokens) in the other: both casts are made and the worse is reported.

A layer is flagged when an operand's amax is non-finite (the scale is then 0 or NaN and the cast is garbage),
when more than :data:`FLUSH_LIMIT` of its nonzero elements flush, or when its error exceeds the format's unit
roundoff: rounding alone keeps every element within ``u·|x|`` (2^-4 for e4m3, 2^-3 for e5m2) as long as it is
a normal fp8 number, so a larger error can only come from values pushed into the subnormals or to zero.

    >>> import torch
    >>> from torch import nn
    >>> torch.manual_seed(0); model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))  # doctest: +ELLIPSIS
    <...>
    >>> batch = (torch.randn(32, 8), torch.randint(0, 3, (32,)))
    >>> h = fp8_headroom(model, batch, nn.functional.cross_entropy)
    >>> [layer["name"] for layer in h.layers], h.recipe, h.fine
    (['0', '2'], 'tensorwise', 2)
    >>> h.layers[0]["operands"]["grad_output"]["format"]
    'e5m2'
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._util.model_io import batch_loss
from ..policy._fp8_matmuls import matmul_layers
from ._compare import seeded

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["EPS", "FLUSH_LIMIT", "OPERANDS", "RECIPES", "RECIPE_DTYPES", "Fp8Headroom", "Fp8Recipe", "fp8_cast_figures", "fp8_headroom", "fp8_round_trip", "unit_roundoff"]

OPERANDS = ("input", "weight", "grad_output")
FLUSH_LIMIT = 0.01
"""Share of an operand's nonzero elements that may flush to zero before its layer is flagged: one term in a
hundred of the matmul dropped is where a flushed gradient stops being rounding noise and starts losing signal."""
EPS = 1e-12
"""torchao's floor on amax (``torchao.float8.float8_utils.EPS``): an all-zero tensor gets a finite scale."""

_FIGURES = ("amax", "nonzero", "flushed", "err_sq", "norm_sq")
"""What :func:`fp8_cast_figures` returns, in order; every one but amax adds up across calls."""


@dataclass(frozen=True, slots=True)
class Fp8Recipe:
    """How a torchao float8 recipe casts a Linear's operands."""

    name: str
    dtypes: dict[str, torch.dtype]
    """The fp8 dtype per operand (``input``, ``weight``, ``grad_output``)."""
    axiswise: bool
    """One scale per row along each matmul's reduction axis (True) or one per tensor."""
    pow2_scales: bool
    """Scales rounded down to a power of two (torchao's ``round_scales_to_power_of_2``)."""


RECIPES = {
    "tensorwise": Fp8Recipe(
        "tensorwise", {"input": torch.float8_e4m3fn, "weight": torch.float8_e4m3fn, "grad_output": torch.float8_e5m2}, False, False
    ),
    "rowwise": Fp8Recipe("rowwise", dict.fromkeys(OPERANDS, torch.float8_e4m3fn), True, True),
}


def _format_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.float8_")


RECIPE_DTYPES = {_format_name(d): d for d in (torch.float8_e4m3fn, torch.float8_e5m2)}
"""The fp8 formats the recipes use, by the name the report gives them."""


def unit_roundoff(dtype: torch.dtype) -> float:
    """Largest relative error of rounding a normal value to ``dtype``: half its machine epsilon.

    >>> unit_roundoff(torch.float8_e4m3fn), unit_roundoff(torch.float8_e5m2)
    (0.0625, 0.125)
    """
    return torch.finfo(dtype).eps / 2


@torch.no_grad()
def fp8_round_trip(x: torch.Tensor, dtype: torch.dtype, *, axis: int | None = None, pow2: bool = False) -> torch.Tensor:
    """``x`` cast to ``dtype`` and back as torchao's dynamic scaling does: ``cast(x * scale) / scale``.

    ``axis`` None: one scale for the tensor, ``scale = fp8_max / max(amax, EPS)``; else one scale per slice
    along ``axis`` of ``x`` seen as 2-D (``x.reshape(-1, x.shape[-1])``, as torchao's Linear does; the result
    has that 2-D shape). ``pow2``: scales rounded down to a power of two (the rowwise recipe).

    >>> fp8_round_trip(torch.tensor([448.0, 1.0625, 2.0**-8, 2.0**-11]), torch.float8_e4m3fn).tolist()
    [448.0, 1.0, 0.00390625, 0.0]
    """
    x2 = x if axis is None else x.reshape(-1, x.shape[-1])
    amax = x2.abs().amax() if axis is None else x2.abs().amax(dim=axis, keepdim=True)
    # torchao's amax_to_scale: the division in float64 (compile and eager agree), the scale kept in float32.
    scale = (torch.finfo(dtype).max / amax.double().clamp(min=EPS)).float()
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    fp8_max = torch.finfo(dtype).max
    bits = (x2.float() * scale).clamp(-fp8_max, fp8_max).to(dtype)  # saturated, as torchao's to_fp8_saturated
    return bits.to(x2.dtype) / scale  # torchao's dequantisation


@torch.no_grad()
def fp8_cast_figures(x: torch.Tensor, dtype: torch.dtype, *, axis: int | None = None, pow2: bool = False) -> torch.Tensor:
    """What :func:`fp8_round_trip` loses of ``x``, in float64 on ``x``'s device (no host sync):
    ``[amax, nonzero count, flushed count, ‖dq - x‖², ‖x‖²]``; flushed: nonzero in ``x``, zero after the trip.

    >>> x = torch.tensor([448.0, 1.0, 2.0**-20, 0.0])
    >>> fp8_cast_figures(x, torch.float8_e4m3fn).tolist()  # 2^-20 is below e4m3's smallest subnormal, 2^-9
    [448.0, 3.0, 1.0, 9.094947017729282e-13, 200705.0]
    """
    dq = fp8_round_trip(x, dtype, axis=axis, pow2=pow2)
    x2 = x.reshape(dq.shape)
    nonzero = x2 != 0
    err = torch.linalg.vector_norm((dq - x2).double())
    norm = torch.linalg.vector_norm(x2.double())
    return torch.stack([x2.abs().amax().double(), nonzero.sum().double(), (nonzero & (dq == 0)).sum().double(), err.square(), norm.square()])


def _operand_entry(figures: list[float], dtype: torch.dtype, axis: str | None) -> dict[str, Any]:
    amax, nonzero, flushed, err_sq, norm_sq = figures
    entry: dict[str, Any] = {"format": _format_name(dtype), "axis": axis, "nonzero": int(nonzero), "flushed": int(flushed)}
    if not math.isfinite(amax):
        # inf or NaN amax: the scale is 0 or NaN, every figure of the cast is meaningless.
        return entry | {"amax": None, "nonfinite": "nan" if math.isnan(amax) else "inf", "flushed_share": None, "rel_error": None, "score": None}
    share = flushed / nonzero if nonzero else 0.0
    rel = math.sqrt(err_sq / norm_sq) if norm_sq > 0 else 0.0
    score = max(share / FLUSH_LIMIT, rel / unit_roundoff(dtype))
    return entry | {"amax": amax, "nonfinite": None, "flushed_share": share, "rel_error": rel, "score": score}


def _worse(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    if a["score"] is None or b["score"] is None:
        return a if a["score"] is None else b
    return a if a["score"] >= b["score"] else b


def _problems(operands: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for name, e in operands.items():
        if e["nonfinite"]:
            out.append(f"{name}: amax is {e['nonfinite']}, the scale breaks")
            continue
        if e["flushed_share"] > FLUSH_LIMIT:
            out.append(f"{name}: {e['flushed_share']:.2%} of nonzero values flush to zero in {e['format']}")
        u = unit_roundoff(RECIPE_DTYPES[e["format"]])
        if e["rel_error"] > u:
            out.append(f"{name}: error {e['rel_error']:.1e} beyond {e['format']} rounding ({u:g})")
    return out


@dataclass
class Fp8Headroom:
    """Per Linear layer, how its operands fit the recipe's fp8 cast; :meth:`to_dict` is doctor.json's ``fp8_headroom``."""

    recipe: str
    layers: list[dict[str, Any]] = field(default_factory=list)
    """Worst first: ``name``, ``kind`` (``Linear``, or ``Conv1D``: Hugging Face's, which torchao does not convert),
    ``shape`` (out, in), ``calls``, ``score`` (the worst operand's, None when an amax is
    non-finite), ``flagged``, ``problems`` and ``operands`` (per operand: ``format``, ``amax``, ``nonfinite``,
    ``nonzero``, ``flushed``, ``flushed_share``, ``rel_error``, ``axis`` of the worse rowwise cast, ``score``)."""

    @property
    def fine(self) -> int:
        """Layers no operand of which is flagged."""
        return sum(not layer["flagged"] for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        formats = {name: {"max": torch.finfo(d).max, "unit_roundoff": unit_roundoff(d)} for name, d in RECIPE_DTYPES.items()}
        return {"recipe": self.recipe, "flush_limit": FLUSH_LIMIT, "formats": formats, "fine": self.fine, "layers": self.layers}


class _Capture:
    """Hooks on every Linear: each call's input and output gradient, and the weight once, measured where they live."""

    def __init__(self, model: nn.Module, recipe: Fp8Recipe) -> None:
        self.recipe = recipe
        # Hugging Face's Conv1D too: the same matmul, its weight read as the Linear's (out, in) for the row-wise axes.
        self.linears = {layer.name: layer for layer in matmul_layers(model)}
        self.figures: dict[tuple[str, str], list[list[torch.Tensor]]] = defaultdict(list)
        self.calls: dict[str, int] = defaultdict(int)
        self.handles: list[Any] = []

    def _measure(self, name: str, operand: str, x: torch.Tensor) -> None:
        if x.numel() == 0:
            return
        dtype, pow2 = self.recipe.dtypes[operand], self.recipe.pow2_scales
        axes: tuple[int | None, ...] = (-1, 0) if self.recipe.axiswise else (None,)
        self.figures[(name, operand)].append([fp8_cast_figures(x.detach(), dtype, axis=a, pow2=pow2) for a in axes])

    def _pre_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self.calls[name] == 0:  # the weight is the same at every call of one step
                self._measure(name, "weight", self.linears[name].linear_weight())
            self.calls[name] += 1
            if args and isinstance(args[0], torch.Tensor):
                self._measure(name, "input", args[0])

        return hook

    def _forward_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            # A hook on the output tensor receives exactly d(loss)/d(output): the Linear's grad_output.
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda g: self._measure(name, "grad_output", g))

        return hook

    def __enter__(self) -> Self:
        for name, layer in self.linears.items():
            m = layer.module
            self.handles += [m.register_forward_pre_hook(self._pre_hook(name)), m.register_forward_hook(self._forward_hook(name))]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()

    def result(self) -> Fp8Headroom:
        keys = [k for k in self.figures if self.figures[k]]
        if not keys:
            return Fp8Headroom(self.recipe.name)
        axes = len(self.figures[keys[0]][0])
        merged = []
        for key in keys:
            calls = torch.stack([torch.stack(per_call) for per_call in self.figures[key]])  # (calls, axes, figures)
            merged.append(torch.cat([calls[..., :1].amax(dim=0), calls[..., 1:].sum(dim=0)], dim=-1))
        values = torch.stack(merged).tolist()  # the one host transfer: every figure of every layer at once
        axis_names: tuple[str | None, ...] = ("rows", "columns") if axes == 2 else (None,)
        per_layer: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        for (name, operand), per_axis in zip(keys, values):
            dtype = self.recipe.dtypes[operand]
            entries = [_operand_entry(f, dtype, a) for f, a in zip(per_axis, axis_names)]
            worst = entries[0]
            for e in entries[1:]:
                worst = _worse(worst, e)
            per_layer[name][operand] = worst
        layers = []
        for name, operands in per_layer.items():
            ordered = {op: operands[op] for op in OPERANDS if op in operands}
            scores = [e["score"] for e in ordered.values()]
            score = None if None in scores else max(scores)
            problems = _problems(ordered)
            layer = self.linears[name]
            layers.append({
                "name": name, "kind": layer.kind, "shape": [layer.out_features, layer.in_features], "calls": self.calls[name], "score": score,
                "flagged": bool(problems), "problems": problems, "operands": ordered,
            })  # fmt: skip
        # Worst first: a non-finite amax before any finite score.
        layers.sort(key=lambda layer: -math.inf if layer["score"] is None else -layer["score"])
        return Fp8Headroom(self.recipe.name, layers)


def fp8_headroom(model: nn.Module, batch: Any, loss_fn: Callable[[Any, Any], torch.Tensor], *, recipe: str = "tensorwise", seed: int = 0) -> Fp8Headroom:
    """One fp32 forward and backward of a copy of ``model`` on ``batch``, every Linear's operands cast as ``recipe``.

    ``model`` is left untouched (no gradients, no BatchNorm statistics). Returns an :class:`Fp8Headroom` with no
    layers when the model has no ``nn.Linear``. One host sync, at the end.
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown fp8 recipe {recipe!r}; pick one of {', '.join(RECIPES)} (torchao's Float8LinearConfig.from_recipe_name).")
    work = copy.deepcopy(model).float()
    work.train()
    device = next((p.device for p in work.parameters()), torch.device("cpu"))
    with seeded(seed, device), _Capture(work, RECIPES[recipe]) as capture:
        if not capture.linears:
            return Fp8Headroom(recipe)
        batch_loss(work, batch, loss_fn).backward()
    return capture.result()
