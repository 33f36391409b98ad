"""Known defects of torch's fused optimizer kernels, by torch version, device, dtype and optimizer, and their guards.

:data:`KNOWN_DEFECTS` is the one table: each entry names the optimizer class, the condition under which its fused
kernel goes wrong, the torch versions affected, the upstream report and the remedy ampkit applies. The engine
(:meth:`ampkit.Engine.setup` and its step), ``ampkit.apex`` (``FusedSGD``, ``amp.initialize``) and ``ampkit env``
read it; nothing else in ampkit knows about a particular defect. Two remedies exist:

- ``"foreach"``: the affected parameter groups are switched to ``fused=False, foreach=True`` before the first
  step (same update, torch's multi-tensor kernel). Logged once per process at WARNING: the run no longer uses
  the kernel the user asked for, and upgrading torch past the range restores it.
- ``"host_skip"``: while the optimizer holds no state for an affected group, the engine decides on the host
  whether to step (as for an unfused optimizer) instead of handing ``found_inf`` to the kernel, so an overflowed
  first step is never passed to it. Costs one host read per optimizer step until the first real step (none on
  CPU) and nothing after. Logged once per process at INFO: nothing changes for the user and there is nothing
  to do.

To add a defect, add an entry (and a test in tests/unit/training/test_kernel_guards.py that shows the raw kernel is wrong
on the versions the entry claims); to retire one, bound its ``torch_versions``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.torch_version import TorchVersion

from .._compat import set_step_supports_amp_scaling

__all__ = ["KernelDefect", "KNOWN_DEFECTS", "torch_affected", "defects_for", "guard_optimizer", "first_step_pending"]

log = logging.getLogger("ampkit")

Remedy = Literal["foreach", "host_skip"]

_REMEDIES: dict[str, tuple[int, str]] = {
    "foreach": (logging.WARNING, "the affected parameter groups step with fused=False, foreach=True (same update)"),
    "host_skip": (
        logging.INFO,
        (
            "until the optimizer's first real step the engine decides on the host whether to step (one host read per "
            "step, none on CPU) and never hands an overflowed step to the fused kernel"
        ),
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelDefect:
    """One known defect of a torch optimizer kernel: where it strikes, on which torch, and what ampkit does."""

    name: str
    """Short identifier, shown by ``ampkit env`` and in the log."""
    optimizer: type[torch.optim.Optimizer]
    """Affected optimizer class (subclasses such as ``ampkit.apex.optimizers.FusedSGD`` included)."""
    torch_versions: str
    """Comma-separated bounds on ``torch.__version__`` (``"<2.14"``, ``">=2.4,<2.14"``), or ``"*"``: every release."""
    upstream: str
    """Where the defect is reported or, if it is not, where torch's source shows it."""
    description: str
    """What goes wrong, in a sentence."""
    remedy: Remedy
    """What ampkit does about it (see the module docstring)."""
    fused: bool = True
    """The defect is in the ``fused=True`` kernel."""
    devices: frozenset[str] | None = None
    """Parameter device types affected; None: every device."""
    dtypes: frozenset[torch.dtype] | None = None
    """Parameter dtypes affected; None: every dtype."""
    momentum: bool | None = None
    """Only with momentum (True), only without (False), or either (None)."""
    first_step_skipped: bool = False
    """Only when the optimizer's first step is skipped for overflow (``found_inf`` set on a stateless optimizer)."""

    def __post_init__(self) -> None:
        if self.remedy not in _REMEDIES:
            raise ValueError(f"KernelDefect {self.name!r}: remedy={self.remedy!r}; pass one of {sorted(_REMEDIES)}.")
        if self.first_step_skipped != (self.remedy == "host_skip"):
            raise ValueError(f"KernelDefect {self.name!r}: the 'host_skip' remedy is for first_step_skipped defects, and only it is.")
        _bounds(self.torch_versions)  # fails here, at import, on a malformed range

    @property
    def workaround(self) -> str:
        """What ampkit does while the defect applies, in words."""
        return _REMEDIES[self.remedy][1]

    def condition(self) -> str:
        """The condition in words, e.g. ``"SGD(fused=True), cpu, float16/bfloat16"``."""
        parts = [f"{self.optimizer.__name__}(fused={self.fused})"]
        if self.momentum is not None:
            parts.append("with momentum" if self.momentum else "without momentum")
        parts.append(", ".join(sorted(self.devices)) if self.devices else "any device")
        parts.append("/".join(str(d).removeprefix("torch.") for d in sorted(self.dtypes, key=str)) if self.dtypes else "any dtype")
        if self.first_step_skipped:
            parts.append("first step skipped")
        return ", ".join(parts)

    def matches_group(self, optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
        """Whether ``group`` of ``optimizer`` meets the condition (the torch version is not checked here)."""
        if not isinstance(optimizer, self.optimizer) or bool(group.get("fused")) != self.fused:
            return False
        if self.momentum is not None and (group.get("momentum", 0) != 0) != self.momentum:
            return False
        # Device and dtype must hold for the same parameter: a group that mixes CUDA bf16 with CPU fp32 parameters
        # holds no CPU 16-bit one, and switching it would cost the CUDA parameters their fused kernel.
        return any(
            (self.devices is None or p.device.type in self.devices) and (self.dtypes is None or p.dtype in self.dtypes)
            for p in group["params"]
        )


def _bounds(spec: str) -> list[tuple[str, str]]:
    if spec.strip() == "*":
        return []
    out = []
    for part in spec.split(","):
        part = part.strip()
        op = next((o for o in ("<=", ">=", "==", "<", ">") if part.startswith(o)), None)
        if op is None or not part[len(op) :].strip():
            raise ValueError(f"torch_versions={spec!r}: write bounds such as '<2.14' or '>=2.4,<2.14', or '*' for every release.")
        out.append((op, part[len(op) :].strip()))
    return out


_HALF = frozenset({torch.float16, torch.bfloat16})

KNOWN_DEFECTS: tuple[KernelDefect, ...] = (
    KernelDefect(
        name="fused-sgd-cpu-16bit",
        optimizer=torch.optim.SGD,
        torch_versions="<2.14",
        devices=frozenset({"cpu"}),
        dtypes=_HALF,
        upstream="pytorch/pytorch#191763",
        description=(
            "the CPU kernel leaves the vectorised blocks of fp16/bf16 parameters un-updated (only the scalar tail is "
            "stepped) and, with momentum, writes garbage into the momentum buffer: such a model never learns"
        ),
        remedy="foreach",
    ),
    KernelDefect(
        name="fused-sgd-skipped-first-step",
        optimizer=torch.optim.SGD,
        torch_versions="*",
        momentum=True,
        first_step_skipped=True,
        upstream="not reported upstream yet; see torch/optim/sgd.py _fused_sgd",
        description=(
            "_fused_sgd creates the momentum buffers with torch.empty_like on the first step and the kernel returns "
            "early when found_inf is set, so an overflowed first step leaves them uninitialised and the next step "
            "applies garbage (inf, NaN or ~1e33 weights); every device, since the buffers are made in Python"
        ),
        remedy="host_skip",
    ),
)
"""Every known defect; each applies where its condition holds and ``torch_affected`` says so."""


@functools.cache
def torch_affected(defect: KernelDefect, version: str | None = None) -> bool:
    """Whether ``version`` (default: the running torch) lies in ``defect.torch_versions``.

    Pre-releases count as before their release (``2.14.0a0`` < ``2.14``): a nightly may predate the fix.

    >>> torch_affected(KNOWN_DEFECTS[0], "2.13.0+cpu"), torch_affected(KNOWN_DEFECTS[0], "2.14.0")
    (True, False)
    """
    v = TorchVersion(version if version is not None else torch.__version__)
    checks = {"<": v.__lt__, "<=": v.__le__, ">": v.__gt__, ">=": v.__ge__, "==": v.__eq__}
    return all(checks[op](bound) for op, bound in _bounds(defect.torch_versions))


def defects_for(optimizer: torch.optim.Optimizer, version: str | None = None) -> list[KernelDefect]:
    """The defects of :data:`KNOWN_DEFECTS` that apply to some parameter group of ``optimizer`` on this torch.

    The parameters' own devices and dtypes decide, so call it once they are final (after casting the model).

    >>> w = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
    >>> [d.name for d in defects_for(torch.optim.SGD([w], lr=0.1, fused=True), version="2.13.0")]
    ['fused-sgd-cpu-16bit']
    >>> defects_for(torch.optim.SGD([w], lr=0.1, fused=True), version="2.14.0")
    []
    """
    return [
        d
        for d in KNOWN_DEFECTS
        if torch_affected(d, version) and any(d.matches_group(optimizer, g) for g in optimizer.param_groups)
    ]


_logged: set[str] = set()


def guard_optimizer(optimizer: torch.optim.Optimizer) -> list[KernelDefect]:
    """Route ``optimizer`` around the defects that apply to it; returns them. Idempotent; no sync.

    Applies the ``"foreach"`` remedies now (switching the affected groups, and the defaults for groups added
    later); ``"host_skip"`` ones are the engine's to apply at each step (see :func:`first_step_pending`). Each
    defect is logged once per process.

    >>> w = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    >>> opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, fused=True)
    >>> applied = guard_optimizer(opt)  # on torch < 2.14: the CPU kernel is wrong for bf16
    >>> opt.param_groups[0]["fused"] == (not any(d.remedy == "foreach" for d in applied))
    True
    """
    defects = defects_for(optimizer)
    for d in defects:
        if d.remedy == "foreach":
            switched = [g for g in optimizer.param_groups if d.matches_group(optimizer, g)]
            for g in switched:
                g["fused"], g["foreach"] = False, True
            if switched and optimizer.defaults.get("fused"):
                optimizer.defaults["fused"], optimizer.defaults["foreach"] = False, True
            # Callers that unscale inside the optimizer (the engine, GradScaler) may do so only if every group is fused.
            set_step_supports_amp_scaling(optimizer, all(g.get("fused") for g in optimizer.param_groups))
        if d.name not in _logged:
            _logged.add(d.name)
            level, what = _REMEDIES[d.remedy]
            log.log(
                level,
                "torch %s kernel defect %r in %s: %s (%s). ampkit routes around it: %s. `ampkit env` lists the guards.",
                torch.__version__,
                d.name,
                d.condition(),
                d.description,
                d.upstream,
                what,
            )
    return defects


def first_step_pending(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a first-step defect applies to ``optimizer`` and it has not yet stepped an affected group.

    While True, whoever holds ``found_inf`` must decide on the host whether to call ``step()`` rather than pass
    ``found_inf`` to the fused kernel. Cheap enough for every step: after the first real step the check stops at
    the first parameter that has state.

    >>> w = torch.nn.Parameter(torch.zeros(4))
    >>> opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, fused=True)
    >>> first_step_pending(opt)
    True
    >>> w.grad = torch.ones(4); opt.step(); first_step_pending(opt)
    False
    """
    for d in _first_step_defects(torch.__version__):
        if not isinstance(optimizer, d.optimizer):
            continue
        for g in optimizer.param_groups:
            # torch's _init_group leaves an empty state dict behind even when the kernel then writes nothing.
            if not any(optimizer.state.get(p) for p in g["params"]) and d.matches_group(optimizer, g):
                return True
    return False


@functools.cache
def _first_step_defects(version: str) -> tuple[KernelDefect, ...]:
    return tuple(d for d in KNOWN_DEFECTS if d.first_step_skipped and torch_affected(d, version))
