"""One training step under a precision policy against the fp32 reference: which modules' gradients diverge.

Control and treatment, as torch's own scaler tests do it: two copies of the same weights, the same batch and
the same dropout masks (the RNG is re-seeded before each forward); the control runs in fp32, the treatment
through :class:`~ampkit.Engine` under the policy with a fixed loss scale. Per module, the gradients of its
own parameters are compared by cosine similarity and relative error ``||g - g_ref|| / ||g_ref||``.

What counts as diverging is measured, not guessed: rounding moves every gradient a little, and a gradient that
is a sum with much cancellation (a BatchNorm bias) moves a lot in relative terms without harming training.
What matters is whether the 16-bit error is larger than the noise SGD lives with anyway. The reference also
takes the fp32 gradient of each half of the batch at the same weights; ``||g_A - g_B|| / ||g_A + g_B||``
estimates the relative sampling noise of the full-batch gradient. A module diverges when its 16-bit gradient
is non-finite, was lost altogether (flushed to zero), or is off by more than that noise. With a one-row batch
(no halves), fixed limits stand in: :data:`COSINE_MIN` and :data:`REL_ERROR_MAX`. A
:class:`~ampkit.numerics._recorder.ModuleRecorder` on the treatment names where inf/NaN first appeared: the
innermost module whose output is non-finite while its inputs were finite (forward), and the first module whose
output gradient arrived non-finite (backward).

    >>> from torch import nn
    >>> torch.manual_seed(0); model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))  # doctest: +ELLIPSIS
    <...>
    >>> batch = (torch.randn(16, 8), torch.randint(0, 2, (16,)))
    >>> ref = reference_step(model, batch, nn.functional.cross_entropy)
    >>> c = compare_step(model, batch, nn.functional.cross_entropy, "bf16-mixed", reference=ref)
    >>> c.finite, c.diverging, c.modules["0"].cosine > 0.99
    (True, [], True)
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._util.model_io import batch_loss, batch_parts, call_model, output_as_float
from ._recorder import ModuleRecorder, floating_tensors

__all__ = ["ModuleAgreement", "ReferenceStep", "StepComparison", "PolicyStep", "reference_step", "compare_step", "policy_step", "COSINE_MIN", "REL_ERROR_MAX"]

COSINE_MIN = 0.99
"""Without a noise estimate, a module whose gradient's cosine similarity to fp32 falls below this diverges..."""
REL_ERROR_MAX = 0.25
"""...or whose gradient is off by more than this fraction of its norm."""

NOISE_FLOOR = 0.01
"""A gradient the halves agree on exactly (noise 0) may still be off by 1% before it counts as diverging."""

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]






@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG (CUDA's too on a GPU) for the block and restore the caller's state after it: the same
    dropout masks in control and treatment, and the user's random stream left as it was."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _module_grads(model: nn.Module, divide_by: float = 1.0) -> dict[str, torch.Tensor]:
    """Each module's own parameter gradients, flattened into one fp32 vector (missing gradients as zeros)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, module in model.named_modules():
        params = [p for p in module.parameters(recurse=False) if id(p) not in seen and p.requires_grad]
        seen.update(id(p) for p in params)
        if not params:
            continue
        flat = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1) for p in params]
        out[name] = torch.cat(flat) / divide_by
    return out


@dataclass
class ReferenceStep:
    """The fp32 control: the loss and each module's own-parameter gradients on one batch."""

    loss: float
    grads: dict[str, torch.Tensor]
    seed: int
    noise: dict[str, float] = field(default_factory=dict)
    """Per module, the relative sampling noise of its gradient, ``||g_A - g_B|| / ||g_A + g_B||`` over the batch's
    two halves; empty when the batch cannot be halved."""


def reference_step(model: nn.Module, batch: Any, loss_fn: LossFn, *, seed: int = 0) -> ReferenceStep:
    """Forward and backward of an fp32 copy of ``model`` on ``batch``; ``model`` itself is left untouched."""
    loss, grads = _fp32_grads(model, batch, loss_fn, seed)
    return ReferenceStep(loss=float(loss), grads=grads, seed=seed, noise=_sampling_noise(model, batch, loss_fn, seed))


def _fp32_grads(model: nn.Module, batch: Any, loss_fn: LossFn, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    control = copy.deepcopy(model).float()
    device = next((p.device for p in control.parameters()), torch.device("cpu"))
    with seeded(seed, device):
        loss = batch_loss(control, batch, loss_fn)
    loss.backward()
    return loss.detach(), _module_grads(control)


def _sampling_noise(model: nn.Module, batch: Any, loss_fn: LossFn, seed: int) -> dict[str, float]:
    from ..training._micro_batching import batch_rows, split_batch

    try:
        rows = batch_rows(batch)
    except ValueError:
        return {}
    if rows < 2:
        return {}
    _, first = _fp32_grads(model, split_batch(batch, 0, rows // 2), loss_fn, seed)
    _, second = _fp32_grads(model, split_batch(batch, rows // 2, rows), loss_fn, seed)
    noise = {}
    for name, a in first.items():
        b = second[name].double()
        total = float((a.double() + b).norm())
        if total > 0:
            noise[name] = float((a.double() - b).norm()) / total
    return noise


@dataclass
class ModuleAgreement:
    """How one module's gradient under the policy compares with fp32."""

    cosine: float | None
    """Cosine similarity with the fp32 gradient; 0 when the gradient was lost, None when fp32's is zero or the
    policy's non-finite."""
    rel_error: float | None
    """``||g - g_ref|| / ||g_ref||``; None when the fp32 gradient is zero or the policy's is non-finite."""
    nonfinite: bool
    diverges: bool
    noise: float | None = None
    """The fp32 gradient's relative sampling noise (the limit ``rel_error`` is held to); None: not measured."""

    def to_dict(self) -> dict[str, Any]:
        return {"cosine": self.cosine, "rel_error": self.rel_error, "noise": self.noise, "nonfinite": self.nonfinite, "diverges": self.diverges}


@dataclass
class StepComparison:
    """One step under ``policy`` (with ``keep_fp32`` and ``loss_scale``) against the fp32 reference."""

    label: str
    policy: str
    keep_fp32: list[str]
    loss_scale: float | None
    loss: float | None
    reference_loss: float
    forward_origin: str | None
    backward_origin: str | None
    modules: dict[str, ModuleAgreement] = field(default_factory=dict)

    @property
    def finite(self) -> bool:
        """True when the loss and every gradient stayed finite."""
        return self.loss is not None and not any(m.nonfinite for m in self.modules.values()) and self.forward_origin is None

    @property
    def diverging(self) -> list[str]:
        """Modules whose gradients diverge from fp32 (non-finite, turned, or off in size), worst cosine first."""
        bad = [(n, m) for n, m in self.modules.items() if m.diverges]
        return [n for n, _ in sorted(bad, key=lambda nm: (not nm[1].nonfinite, nm[1].cosine if nm[1].cosine is not None else -2.0))]

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "policy": self.policy, "keep_fp32": list(self.keep_fp32), "loss_scale": self.loss_scale,
            "loss": self.loss, "reference_loss": self.reference_loss, "finite": self.finite,
            "forward_origin": self.forward_origin, "backward_origin": self.backward_origin, "diverging": self.diverging,
            "modules": {n: m.to_dict() for n, m in self.modules.items()},
        }


def _agreement(got: torch.Tensor, ref: torch.Tensor, noise: float | None, floor: float = NOISE_FLOOR) -> ModuleAgreement:
    """How ``got`` compares with ``ref``: it diverges when non-finite, lost, or off by more than ``max(noise, floor)``
    (without a ``noise``, by the fixed limits :data:`COSINE_MIN` and :data:`REL_ERROR_MAX`)."""
    nonfinite = not bool(torch.isfinite(got).all())
    if nonfinite:
        return ModuleAgreement(cosine=None, rel_error=None, nonfinite=True, diverges=True)
    ref64, got64 = ref.double(), got.double()
    ref_norm, got_norm = float(ref64.norm()), float(got64.norm())
    rel = float((got64 - ref64).norm()) / ref_norm if ref_norm > 0 else None
    cos = float(got64 @ ref64) / (ref_norm * got_norm) if ref_norm > 0 and got_norm > 0 else None
    if ref_norm > 0 and got_norm == 0:
        cos = 0.0  # the whole gradient was lost (flushed to zero): as far from the reference as it gets
    lost = ref_norm > 0 and got_norm == 0
    if noise is not None:
        diverges = lost or (rel is not None and rel > max(noise, floor))
    else:
        diverges = lost or (cos is not None and cos < COSINE_MIN) or (rel is not None and rel > REL_ERROR_MAX)
    return ModuleAgreement(cosine=cos, rel_error=rel, nonfinite=False, diverges=diverges, noise=noise)


def _origins(rec: ModuleRecorder) -> tuple[str | None, str | None]:
    stats = rec.summaries()

    def bad(name: str, kind: str) -> bool:
        s = stats.get(name, {}).get(kind)
        return s is not None and s.nonfinite > 0

    forward = next((n for n in rec.order if bad(n, "outputs") and not bad(n, "inputs")), None)
    backward = next((n for n in rec.backward_order if bad(n, "output_grads")), None)
    if backward is None:  # the first non-finite gradient may be a parameter's own (e.g. a 16-bit weight gradient)
        backward = next((n for n in reversed(rec.order) if bad(n, "grads")), None)
    return forward, backward


@dataclass
class PolicyStep:
    """One forward and backward of a copy of the model through :class:`~ampkit.Engine`: what the doctor compares."""

    loss: float
    grads: dict[str, torch.Tensor]
    """Each module's own-parameter gradients (fp32, the loss scale divided out), as :func:`_module_grads`."""
    output_dtypes: list[torch.dtype]
    """The dtypes of the model output's floating tensors, before the loss casts them to fp32."""
    policy: str
    forward_origin: str | None = None
    backward_origin: str | None = None
    compiled: list[str] = field(default_factory=list)
    """The regions the engine compiled ('' for the whole model); empty for an eager step."""


def policy_step(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    precision: str,
    *,
    seed: int,
    keep_fp32: Sequence[str] = (),
    loss_scale: float | None = None,
    compile: Any = None,
) -> PolicyStep:
    """One step of a copy of ``model`` under ``precision`` (``keep_fp32``, the loss scaled by ``loss_scale``; None:
    not scaled), dropout seeded by ``seed``, compiled as ``Engine(compile=compile)`` says.

    An eager step runs under a :class:`~ampkit.numerics._recorder.ModuleRecorder`, which names where inf/NaN began.
    A compiled one runs without it: its hooks would be traced into the graph (or break it), and the graph checked
    must be the one a training run compiles.
    """
    from ..scaling import StaticLossScaler
    from ..training._engine import Engine  # the engine imports the policies; imported here to keep this module light

    treated = copy.deepcopy(model).float()
    device = next((p.device for p in treated.parameters()), torch.device("cpu"))
    scaler = StaticLossScaler(loss_scale) if loss_scale is not None else "none"
    engine = Engine(precision, keep_fp32=list(keep_fp32), scaler=scaler, compile=compile)
    treated = engine.setup(treated)
    recorder = ModuleRecorder(treated, rounding=False) if compile is None else contextlib.nullcontext()
    with recorder as rec:
        inputs, target = batch_parts(batch)
        with seeded(seed, device), engine.autocast():
            output = call_model(treated, inputs)
            loss = loss_fn(output_as_float(output), target)
        engine.backward(loss)
        if rec is not None:
            rec.record_parameters(weights=False)
    forward, backward = _origins(rec) if rec is not None else (None, None)
    return PolicyStep(
        loss=float(loss.detach()), grads=_module_grads(treated, divide_by=loss_scale or 1.0),
        output_dtypes=[t.dtype for t in floating_tensors(output)], policy=engine.policy.name,
        forward_origin=forward, backward_origin=backward, compiled=list(engine.compiled),
    )


def compare_step(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    precision: str,
    *,
    reference: ReferenceStep,
    keep_fp32: Sequence[str] = (),
    loss_scale: float | None = None,
    label: str = "",
) -> StepComparison:
    """One forward and backward of a copy of ``model`` under the policy ``precision`` with ``keep_fp32``, the loss
    scaled by ``loss_scale`` (None: no scaling), compared module by module with ``reference``."""
    step = policy_step(model, batch, loss_fn, precision, seed=reference.seed, keep_fp32=keep_fp32, loss_scale=loss_scale)
    modules = {name: _agreement(step.grads[name], ref, reference.noise.get(name)) for name, ref in reference.grads.items() if name in step.grads}
    return StepComparison(
        label=label, policy=step.policy, keep_fp32=list(keep_fp32), loss_scale=loss_scale,
        loss=step.loss if math.isfinite(step.loss) else None, reference_loss=reference.loss,
        forward_origin=step.forward_origin, backward_origin=step.backward_origin, modules=modules,
    )
