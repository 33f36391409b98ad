"""The compiled step against the eager one under the same policy: does torch.compile change the numbers?

torch.compile traces the policy's casts and autocast into a graph and fuses them, and torch's issue tracker holds
reports of compile + autocast giving other dtypes and other values than eager. :func:`check_compiled` runs one
step of a policy eager and one compiled (``Engine(compile=...)``) from the same weights, on the same batch, with
the same dropout masks, and compares each module's gradient in the compiled step with the eager one.

The yardstick is the policy's own error. Fusion changes rounding legitimately (a fused kernel may keep a 16-bit
intermediate in fp32), so a compiled gradient may differ from eager's by as much as eager's differs from the fp32
reference, ``||g_eager - g_fp32|| / ||g_fp32||``, but not by more: more is an error compiling added on top of the
policy's. Dropout must draw the same masks in both steps: inductor's own random numbers differ from eager's, so the
compiled step asks it for eager's (torch.compile's ``options={"fallback_random": True}``), which changes nothing
else. Where the policy is exact (32-true), :data:`FLOOR` stands in. A module diverges when its compiled
gradient is non-finite, lost, or off by more than that limit. The loss is held to the same rule, and the output
must come out in the same dtypes.

    >>> from torch import nn
    >>> from ampkit.numerics._compare import reference_step
    >>> torch.manual_seed(0); model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))  # doctest: +ELLIPSIS
    <...>
    >>> batch = (torch.randn(16, 8), torch.randint(0, 2, (16,)))
    >>> ref = reference_step(model, batch, nn.functional.cross_entropy)
    >>> check = check_compiled(model, batch, nn.functional.cross_entropy, "bf16-mixed", reference=ref,
    ...                        compile={"backend": "aot_eager"})
    >>> check.agrees, check.verdict.split(":")[0]
    (True, 'compiled step agrees with eager under bf16-mixed')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch  # noqa: F401 - the doctests use it
from torch import nn

from ._compare import LossFn, ModuleAgreement, PolicyStep, ReferenceStep, _agreement, policy_step

__all__ = ["CompileCheck", "check_compiled", "compile_label", "same_random", "FLOOR"]

FLOOR = 1e-3
"""The least relative difference a compiled gradient (or loss) may show: fp32 summed in another order differs by
~1e-6, and this leaves room for cancellation while staying below bf16's own rounding (2^-8, about 4e-3)."""


def compile_label(spec: Any) -> str:
    """``Engine(compile=...)``'s argument as the report shows it (a backend function by its name).

    >>> compile_label(True), compile_label("regional"), compile_label({"backend": len})
    ('compile=True', "compile='regional'", "compile={'backend': 'len'}")
    """
    if isinstance(spec, dict):
        spec = {k: getattr(v, "__name__", type(v).__name__) if callable(v) else v for k, v in spec.items()}
    return f"compile={spec!r}"


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.1e}"


@dataclass
class CompileCheck:
    """One compiled step against the eager step of the same policy (see the module's docstring)."""

    policy: str
    keep_fp32: list[str]
    loss_scale: float | None
    compile: str
    """How it was compiled, as :func:`compile_label` writes it."""
    compiled: list[str]
    """The regions compiled ('' for the whole model)."""
    loss: float | None
    """The compiled step's loss; None when it is not finite."""
    eager_loss: float
    reference_loss: float
    loss_limit: float
    """How far (relative) the compiled loss may be from eager's: eager's from fp32's, at least :data:`FLOOR`."""
    output_dtypes: list[str]
    eager_output_dtypes: list[str]
    modules: dict[str, ModuleAgreement] = field(default_factory=dict)
    """Per module, its compiled gradient against the eager one; ``noise`` holds the limit (the policy's own error)."""

    @property
    def loss_agrees(self) -> bool:
        if self.loss is None:
            return not math.isfinite(self.eager_loss)
        return abs(self.loss - self.eager_loss) <= self.loss_limit * max(abs(self.eager_loss), 1e-12)

    @property
    def dtypes_agree(self) -> bool:
        return self.output_dtypes == self.eager_output_dtypes

    @property
    def diverging(self) -> list[str]:
        """Modules whose compiled gradient diverges from eager's, non-finite first, then the farthest past its limit."""
        def excess(m: ModuleAgreement) -> float:
            return math.inf if m.nonfinite or m.rel_error is None else m.rel_error / max(m.noise or 0.0, FLOOR)

        return sorted((n for n, m in self.modules.items() if m.diverges), key=lambda n: -excess(self.modules[n]))

    @property
    def agrees(self) -> bool:
        return self.loss_agrees and self.dtypes_agree and not self.diverging

    @property
    def verdict(self) -> str:
        """One line: whether the compiled step agrees with eager, and if not where it does not."""
        head = f"compiled step {'agrees with' if self.agrees else 'diverges from'} eager under {self.policy}"
        facts = []
        if not self.loss_agrees:
            facts.append(f"loss {self.loss!s:.8} vs eager {self.eager_loss!s:.8} (fp32 {self.reference_loss!s:.8})")
        if not self.dtypes_agree:
            facts.append(f"output {', '.join(self.output_dtypes)} where eager gives {', '.join(self.eager_output_dtypes)}")
        for name in self.diverging[:5]:
            m = self.modules[name]
            off = "non-finite" if m.nonfinite else f"off by {_fmt(m.rel_error)} (limit {_fmt(max(m.noise or 0.0, FLOOR))})"
            facts.append(f"{name or '(model)'} {off}")
        if len(self.diverging) > 5:
            facts.append(f"{len(self.diverging) - 5} more modules")
        if self.agrees:
            worst = max((m.rel_error / max(m.noise or 0.0, FLOOR) for m in self.modules.values() if m.rel_error is not None), default=0.0)
            facts.append(f"loss {self.loss!s:.8} vs {self.eager_loss!s:.8}, output {', '.join(self.output_dtypes) or 'not floating'}, "
                         f"largest module gradient difference {worst:.2f} of its limit")  # fmt: skip
        return f"{head}: {'; '.join(facts)}"

    @property
    def advice(self) -> list[str]:
        """What to do when the compiled step does not agree; empty when it does."""
        if self.agrees:
            return []
        out = []
        if self.diverging:
            names = ", ".join(n or "(model)" for n in self.diverging[:5])
            regional = "" if "regional" in self.compile else " or compile only the repeated blocks (Engine(compile='regional'))"
            out.append(f"keep {names} eager: m.forward = torch.compiler.disable(m.forward) for each{regional}")
        out.append(
            "try compile={'backend': 'aot_eager'} (ampkit doctor --compile-backend aot_eager): if that agrees the "
            "difference is the compiler's (inductor); report it to PyTorch with the model, the policy and this report"
        )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "keep_fp32": list(self.keep_fp32), "loss_scale": self.loss_scale, "compile": self.compile,
            "compiled": list(self.compiled), "agrees": self.agrees, "verdict": self.verdict, "advice": self.advice,
            "loss": self.loss, "eager_loss": self.eager_loss, "reference_loss": self.reference_loss, "loss_limit": self.loss_limit,
            "output_dtypes": list(self.output_dtypes), "eager_output_dtypes": list(self.eager_output_dtypes),
            "diverging": self.diverging,
            "modules": {n: {"cosine": m.cosine, "rel_error": m.rel_error, "limit": max(m.noise or 0.0, FLOOR),
                            "nonfinite": m.nonfinite, "diverges": m.diverges} for n, m in self.modules.items()},
        }  # fmt: skip


def same_random(spec: Any) -> Any:
    """``spec`` with inductor told to draw random numbers as eager does, so dropout masks match the eager step's.

    torch.compile refuses ``options`` beside ``mode``; with a ``mode`` the spec is left as it is.

    >>> same_random(True), same_random({"backend": "aot_eager"})
    ({'options': {'fallback_random': True}}, {'backend': 'aot_eager'})
    """
    options = {"regional": True} if spec == "regional" else {} if spec is True else dict(spec)
    if options.get("backend", "inductor") != "inductor" or "mode" in options:
        return spec
    options["options"] = {"fallback_random": True, **(options.get("options") or {})}
    return options


def _relative(got: float, ref: float) -> float:
    return abs(got - ref) / abs(ref) if ref != 0 else abs(got - ref)


def check_compiled(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    precision: str,
    *,
    reference: ReferenceStep,
    compile: Any = True,
    keep_fp32: Sequence[str] = (),
    loss_scale: float | None = None,
) -> CompileCheck:
    """One step of ``precision`` (with ``keep_fp32`` and ``loss_scale``) eager and one compiled as
    ``Engine(compile=compile)`` would, on copies of ``model``, compared module by module (see the module's docstring)."""
    from ..training._compile import compile_plan

    if compile_plan(compile) is None:
        raise ValueError(f"check_compiled(compile={compile!r}) has nothing to compile: pass True, 'regional' or torch.compile options.")
    kwargs: dict[str, Any] = {"seed": reference.seed, "keep_fp32": keep_fp32, "loss_scale": loss_scale}
    eager: PolicyStep = policy_step(model, batch, loss_fn, precision, **kwargs)
    done: PolicyStep = policy_step(model, batch, loss_fn, precision, compile=same_random(compile), **kwargs)
    modules = {}
    for name, ref in reference.grads.items():
        if name not in eager.grads or name not in done.grads:
            continue
        own = _agreement(eager.grads[name], ref, None).rel_error  # the policy's own error against fp32
        modules[name] = _agreement(done.grads[name], eager.grads[name], own or 0.0, floor=FLOOR)
    return CompileCheck(
        policy=eager.policy, keep_fp32=list(keep_fp32), loss_scale=loss_scale, compile=compile_label(compile), compiled=done.compiled,
        loss=done.loss if math.isfinite(done.loss) else None, eager_loss=eager.loss, reference_loss=reference.loss,
        loss_limit=max(_relative(eager.loss, reference.loss), FLOOR),
        output_dtypes=[str(d).removeprefix("torch.") for d in done.output_dtypes],
        eager_output_dtypes=[str(d).removeprefix("torch.") for d in eager.output_dtypes],
        modules=modules,
    )
