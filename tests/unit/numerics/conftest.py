"""A doctor result for the presentation tests, with statistics measured by :class:`StatsAccumulator`.

The tensors are chosen so every finding is known exactly: ``fc1``'s gradients are spread evenly over the
exponents 2^-40..2^-16 (16 of 25 below fp16's 2^-24 unscaled, 3 of 25 still below at the loss scale 2^13),
``act``'s outputs overflow fp16, and ``head|out_proj`` (a name that would break a Markdown table) has a single
flushed gradient among 20,002 values: a share that must not print as 0.00%.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ampkit.numerics._formats import FP16
from ampkit.numerics._stats import StatsAccumulator, TensorStats

FC1_EXPONENTS = range(-40, -15)
"""One fc1 gradient per exponent, four times over: 100 values."""
HEAD = "head|out_proj"
ENGINE_CODE = 'Engine(precision="16-mixed", keep_fp32=["act"], scaler=ScalerConfig(init_scale=8192.0))'


def _measure(*tensors: torch.Tensor) -> TensorStats:
    acc = StatsAccumulator()
    for tensor in tensors:
        acc.update(tensor)
    return acc.summary()


def _module(name: str, type_: str, order: int, severity: float, problems: list[str], **stats: TensorStats | None) -> dict[str, Any]:
    kinds = ("weights", "grads", "inputs", "outputs", "output_grads")
    out: dict[str, Any] = {"name": name, "type": type_, "order": order, "parameters": 0}
    out.update({kind: None if stats.get(kind) is None else stats[kind].to_dict() for kind in kinds})  # type: ignore[union-attr]
    out.update(problems=problems, severity=severity, keep_fp32=name == "act")
    return out


def _comparison(label: str, policy: str, finite: bool, modules: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "label": label, "policy": policy, "keep_fp32": [], "loss_scale": None, "loss": None, "reference_loss": 2.3,
        "finite": finite, "forward_origin": None, "backward_origin": None,
        "diverging": [name for name, m in modules.items() if m["diverges"]], "modules": modules,
    }  # fmt: skip
    out.update(extra)
    return out


def _entry(cosine: float | None, rel_error: float | None, *, nonfinite: bool = False, diverges: bool = False) -> dict[str, Any]:
    noise = None if nonfinite else 0.05  # the fp32 half-batch disagreement a 16-bit error is measured against
    return {"cosine": cosine, "rel_error": rel_error, "noise": noise, "nonfinite": nonfinite, "diverges": diverges}


@pytest.fixture
def doctor_data() -> dict[str, Any]:
    """A doctor.json dict for a four-module net: worst first is fc1, act, (model), head|out_proj, drop."""
    fc1_grads = _measure(torch.tensor([2.0**e for e in FC1_EXPONENTS] * 4))
    head_grads = _measure(torch.linspace(-4.0, 4.0, 20001), torch.tensor([2.0**-30]))
    act_out = _measure(torch.tensor([1.0, 3.0, 1e5, 2e5]))
    small = torch.linspace(-1.0, 1.0, 64)
    act_grads = _measure(small * 1e-3)
    grads = TensorStats.merge([fc1_grads, head_grads])
    # The largest power of two that keeps the largest gradient (4.0) within fp16's 65504: 2^13.
    k = math.floor(math.log2(FP16.max / grads.max_abs))
    modules = [
        _module("", "TinyNet", 4, 0.5, [], grads=grads, inputs=_measure(small), outputs=_measure(small)),
        _module("fc1", "Linear", 0, 3.0, ["64% of gradients flush to zero in fp16"], weights=_measure(small),
                grads=fc1_grads, inputs=_measure(small), outputs=_measure(small), output_grads=act_grads),
        _module("act", "Exp", 1, 2.0, ["outputs overflow fp16 (max 2e+05)"], inputs=_measure(small), outputs=act_out,
                output_grads=act_grads),
        _module(HEAD, "Linear", 2, 0.1, [], weights=_measure(small), grads=head_grads, inputs=act_out,
                outputs=_measure(small), output_grads=act_grads),
        _module("drop", "Dropout", 3, 0.0, []),
    ]  # fmt: skip
    default = _comparison(
        "default", "16-mixed", False,
        {"fc1": _entry(0.9991, 2.1e-3), "act": _entry(None, None, nonfinite=True, diverges=True),
         HEAD: _entry(None, None, nonfinite=True, diverges=True), "": _entry(None, None, nonfinite=True, diverges=True)},
        loss_scale=65536.0, forward_origin="act",
    )  # fmt: skip
    recommended = _comparison(
        "recommended", "16-mixed", True,
        {"fc1": _entry(0.99991, 4.2e-4), "act": _entry(1.0, 0.0), HEAD: _entry(0.99998712, 1.3e-5),
         "": _entry(0.999999, 2e-6)},
        keep_fp32=["act"], loss_scale=float(2**k), loss=2.31,
    )  # fmt: skip
    return {
        "ampkit": "0.1.0", "torch": "2.13.0+cpu", "device": "cpu", "created": "2026-11-23T10:00:00+00:00",
        "command": "ampkit doctor tiny --steps 4",
        "workload": {"name": "tiny-net", "description": "Four layers with known numerics.", "size": "tiny"},
        "reference_steps": 4, "target": None,
        "recommended_precision": "16-mixed",
        "precision_reasons": ["no native bf16 on this device", "fp16 is safe with a loss scale and act in fp32"],
        "recommended_loss_scale": float(2**k), "loss_scale_log2": k, "gradient_max_abs": grads.max_abs,
        "keep_fp32": ["act"],
        "engine": {"precision": "16-mixed", "keep_fp32": ["act"], "scaler": {"init_scale": float(2**k)}},
        "engine_code": ENGINE_CODE,
        "underflow_share_unscaled": grads.underflow_share("fp16"),
        "underflow_share_scaled": grads.underflow_share("fp16", k),
        "gradient_underflow": {
            "weights": {"unscaled": grads.underflow_share("fp16"), "scaled": grads.underflow_share("fp16", k)},
            "activations": {"unscaled": act_grads.underflow_share("fp16"), "scaled": act_grads.underflow_share("fp16", k)},
        },
        "gradient_histograms": {"weights": grads.to_dict()["histogram"], "activations": act_grads.to_dict()["histogram"]},
        "comparisons": [default, recommended],
        "modules": modules,
    }  # fmt: skip


BlockImport = Callable[[str], None]


@pytest.fixture
def block_import(monkeypatch: pytest.MonkeyPatch) -> BlockImport:
    """Make ``import <name>`` (and its submodules) fail as if the package were not installed."""
    blocked: list[str] = []
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    return blocked.append
