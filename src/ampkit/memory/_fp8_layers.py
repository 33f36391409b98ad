"""Which Linear layers of a model pay in fp8 on a GPU, predicted on any machine from one fake forward.

The rows each Linear multiplies come from a forward of a fake copy of the model on the example batch (nothing is
allocated: :class:`~ampkit.memory._fake.FakeCopies`); each layer's bf16 and fp8 times come from the roofline
(:mod:`ampkit.policy._fp8_roofline`) on the GPU planned for, and the policy's filter says which layers it converts.

    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
    >>> plan = fp8_layer_plan(model, (torch.randn(2, 2048, 4096, device="meta"), None), gpu="H100")
    >>> plan.tokens, [(p.name, p.convert) for p in plan.layers]
    (4096, [('0', True), ('2', False)])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._errors import PolicyError
from .._util.model_io import batch_parts, call_model
from ..policy import get_policy
from ..policy._fp8 import ChosenLayers, Fp8LayerPlan, FP8Policy
from ..policy._fp8_roofline import LinearCost, measure_linear_tokens
from ._fake import FakeCopies

__all__ = ["Fp8Plan", "LayerGroup", "fp8_layer_plan", "group_layers", "linear_tokens", "planned_policy"]


@dataclass(frozen=True)
class Fp8Plan:
    """The per-layer plan of an fp8 policy for one model and batch on one GPU, and the Linear time it predicts."""

    policy: str
    gpu: str
    tokens: int
    """The most rows any Linear multiplies per micro-batch (what the policy's ``tokens`` is set to)."""
    layers: list[Fp8LayerPlan]

    @property
    def linear_bf16_s(self) -> float:
        """Predicted time of every Linear's forward and backward in bf16."""
        return sum(p.cost.bf16_s for p in self.layers)

    @property
    def linear_planned_s(self) -> float:
        """The same with the converted layers in fp8."""
        return sum((p.cost.fp8_s if p.convert else p.cost.bf16_s) for p in self.layers)

    @property
    def speedup(self) -> float:
        """Predicted speed-up of the Linear layers' time under the plan (1.0: nothing converted)."""
        return self.linear_bf16_s / self.linear_planned_s if self.linear_planned_s else 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the plan's totals and, per layer, its shape, predicted times and decision."""
        return {
            "policy": self.policy,
            "gpu": self.gpu,
            "tokens": self.tokens,
            "linear_bf16_s": self.linear_bf16_s,
            "linear_planned_s": self.linear_planned_s,
            "predicted_linear_speedup": self.speedup,
            "layers": [
                {"name": p.name, "convert": p.convert, "reason": p.reason, "by_roofline": p.by_roofline,
                 "tokens": p.cost.tokens, "in_features": p.cost.in_features, "out_features": p.cost.out_features,
                 "fits": p.cost.fits, "bf16_s": p.cost.bf16_s, "fp8_s": p.cost.fp8_s, "fp8_matmul_s": p.cost.fp8_matmul_s,
                 "fp8_cast_s": p.cost.fp8_cast_s, "kind": p.kind,
                 "predicted_speedup": p.cost.speedup}
                for p in self.layers
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fp8Plan:
        """Rebuild from :meth:`to_dict` output (results.json).

        >>> from torch import nn
        >>> plan = fp8_layer_plan(nn.Sequential(nn.Linear(64, 64)), (torch.zeros(4, 64), None))
        >>> Fp8Plan.from_dict(plan.to_dict()) == plan
        True
        """
        layers = [
            Fp8LayerPlan(
                d["name"], d["convert"], d["reason"],
                LinearCost(d["tokens"], d["in_features"], d["out_features"], d["fits"], d["bf16_s"], d["fp8_matmul_s"], d["fp8_cast_s"]),
                by_roofline=d["by_roofline"], kind=d.get("kind", "Linear"),  # results.json written before Conv1D was planned
            )
            for d in data["layers"]
        ]
        return cls(data["policy"], data["gpu"], data["tokens"], layers)


def linear_tokens(model: nn.Module, example_batch: Any) -> dict[str, int]:
    """The rows each ``nn.Linear`` (and Hugging Face ``Conv1D``) of ``model`` multiplies on ``example_batch``, from a
    forward of fake copies.

    >>> from torch import nn
    >>> linear_tokens(nn.Sequential(nn.Linear(8, 8)), (torch.zeros(3, 5, 8), None))
    {'0': 15}
    """
    inputs = batch_parts(example_batch)[0]
    with FakeCopies() as fake:
        device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
        copy = fake.model(model, device)
        fake_inputs = fake.batch(inputs, device)
        return measure_linear_tokens(copy, lambda: call_model(copy, fake_inputs))


def fp8_layer_plan(model: nn.Module, example_batch: Any, policy: str | FP8Policy = "fp8-tensorwise", gpu: str | None = None) -> Fp8Plan:
    """The layers ``policy`` converts on ``gpu`` (a name such as ``"H100"``; default: this GPU, else H100) at the
    batch's own rows per Linear, with each layer's predicted bf16 and fp8 times."""
    resolved = get_policy(policy)
    if not isinstance(resolved, FP8Policy):
        raise PolicyError(f"fp8_layer_plan() plans an fp8 policy (fp8-tensorwise, fp8-rowwise), not {resolved.name!r}.")
    # The policy checks the GPU's name and picks its own (target, else this GPU, else H100): one rule for both.
    spec = (dataclasses.replace(resolved, target=gpu) if gpu else resolved).planning_spec("cuda")
    tokens = linear_tokens(model, example_batch)
    most = max(tokens.values(), default=0)
    planned = dataclasses.replace(resolved, target=spec.name, tokens=most or None)
    layers = [p for p in planned.plan_layers(model, "cuda", tokens) if p.name in tokens]
    return Fp8Plan(planned.name, spec.name, most, layers)


def planned_policy(plan: Fp8Plan, policy: FP8Policy | None = None) -> FP8Policy:
    """The plan's policy set to convert exactly the layers the plan converts (each decided at its own rows), on the
    plan's GPU. ``policy``: the policy object the plan was made for, whose other settings (``keep_fp32``) it keeps;
    default: the plan's policy by name.

    >>> from torch import nn
    >>> p = planned_policy(fp8_layer_plan(nn.Sequential(nn.Linear(64, 64)), (torch.zeros(4, 64), None), gpu="L4"))
    >>> p.name, p.layers, p.tokens, p.target
    ('fp8-tensorwise', ChosenLayers(names=frozenset()), 4, 'L4')
    """
    chosen = ChosenLayers(frozenset(p.name for p in plan.layers if p.convert))
    base = policy if policy is not None else get_policy(plan.policy)
    return dataclasses.replace(base, layers=chosen, tokens=plan.tokens or None, target=plan.gpu)  # type: ignore[arg-type]


@dataclass(frozen=True)
class LayerGroup:
    """Layers of one plan that differ only by a block index (``blocks.*.mlp.0``): one shape, one decision."""

    pattern: str
    count: int
    first: Fp8LayerPlan


def group_layers(plan: Fp8Plan) -> list[LayerGroup]:
    """The plan's layers folded by name pattern (each number in a name becomes ``*``), shape and decision, in order.

    >>> from torch import nn
    >>> model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)])
    >>> [(g.pattern, g.count) for g in group_layers(fp8_layer_plan(model, (torch.zeros(4, 64), None)))]
    [('*', 3)]
    """
    groups: dict[tuple[Any, ...], LayerGroup] = {}
    for p in plan.layers:
        pattern = ".".join("*" if part.isdigit() else part for part in p.name.split("."))
        shape = (p.cost.tokens, p.cost.in_features, p.cost.out_features)
        key = (pattern, shape, p.convert, p.kind)
        seen = groups.get(key)
        groups[key] = LayerGroup(pattern, seen.count + 1 if seen else 1, seen.first if seen else p)
    return list(groups.values())
