"""Compiling the fused master step: the torch.compile arguments its region gets, and the way back to the unfused
step when compiling fails.

A region ampkit chose to compile must never end a run by failing to compile. torch.compile compiles on the
region's first call (and on a recompilation), so a compiler error surfaces from that call, before any of the step
has run: the region is one graph (``fullgraph=True``) and dynamo runs a graph only once all of it has compiled.
:meth:`~ampkit.training._fused_master_step.FusedMasterStep.step` then puts back what it changed for the call and
raises :class:`FusedStepFailed`; the engine takes the same step unfused and, once that has succeeded, turns the
region off for the rest of the run with one warning. An error of the step's own ops (a state of the wrong shape,
a tensor on another device) comes out of tracing wrapped like a compiler error, but it fails the unfused step as
well, and then that error is the one raised, with the region left on.

    >>> region_compile_kwargs({"backend": "aot_eager"})
    {'fullgraph': True, 'backend': 'aot_eager'}
"""

from __future__ import annotations

import sys
import traceback
import warnings
from collections.abc import Sequence
from types import FrameType
from typing import Any

import torch

from .._compat import foreach_region_inductor_config, with_inductor_config

__all__ = ["FusedStepFailed", "region_compile_kwargs", "describe_failure", "warn_fallback", "steps_to_host"]


class FusedStepFailed(RuntimeError):
    """The fused region failed to compile and nothing of the step was taken; ``__cause__`` is the compiler's error.

    >>> FusedStepFailed(ValueError("bad graph")).reason
    'ValueError: bad graph'
    """

    def __init__(self, error: BaseException) -> None:
        self.reason = describe_failure(error)
        super().__init__(f"the fused master step failed to compile: {self.reason}")


def region_compile_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """torch.compile's keyword arguments for the fused region, from the user's ``options``.

    ``fullgraph=True`` unless the user says otherwise: one graph either compiles whole or runs not at all, so a
    failure leaves nothing half applied (with ``fullgraph=False`` a graph break could run the step's first part
    before the second fails to compile). Inductor gets the settings this torch needs for a region of foreach
    ops (:func:`ampkit._compat.foreach_region_inductor_config`) for this region's compilations alone; the
    user's own ``options`` win over them, the process-wide ``torch._inductor.config`` does not.

    >>> region_compile_kwargs({"mode": "max-autotune-no-cudagraphs", "fullgraph": False})["fullgraph"]
    False
    """
    return with_inductor_config({"fullgraph": True, **options}, foreach_region_inductor_config())


def describe_failure(error: BaseException) -> str:
    """The compiler error's type and first line, with the error it wraps (a backend's, inductor's); where that says
    nothing (a bare ``assert``), the file, line and function that raised it.

    >>> describe_failure(RuntimeError("first line\\nmore"))
    'RuntimeError: first line'
    """
    inner = getattr(error, "inner_exception", None)  # BackendCompilerFailed and inductor's InductorError wrap one
    if not isinstance(inner, BaseException):
        inner = None
    cause = inner if inner is not None else error
    text = f"{type(cause).__name__}: {_first_line(cause)}".rstrip(": ")
    if cause is not error:
        text = f"{type(error).__name__}: {text}"
    if not _first_line(cause):
        frames = traceback.extract_tb(cause.__traceback__)
        if frames:
            where = frames[-1]
            text += f" at {'/'.join(where.filename.split('/')[-2:])}:{where.lineno} in {where.name}"
    return text


def _first_line(error: BaseException | None) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] if error is not None else []
    return lines[0] if lines else ""


def warn_fallback(reason: str, region: str = "the fused master step", instead: str = "the unfused step, which makes the same update in more passes over memory") -> None:
    """The one warning of a run whose compiled region failed to compile: the cause and how to silence it."""
    warnings.warn(
        f"ampkit: {region} failed to compile ({reason}); this run goes on with {instead}. Pass "
        "Engine(fused_step=False) to skip the attempt and this warning.",
        UserWarning,
        stacklevel=_user_stacklevel(),
    )


def _user_stacklevel() -> int:
    """warnings.warn's ``stacklevel`` that names the first caller outside ampkit (the line that called engine.step())."""
    level = 1  # stacklevel 1: the function that calls warnings.warn
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("ampkit."):
        level, frame = level + 1, frame.f_back
    return level


def steps_to_host(opts: Sequence[torch.optim.Optimizer]) -> None:
    """Put each step count back where the optimizer's own step keeps it: on the host, unless its group is
    capturable or fused (a load puts them there too). The fused step moves them to the device, and so does dynamo
    while it traces an optimizer; left there, torch's unfused Adam would read each one with a sync. Once, on a
    failure: not a per-step path.
    """
    for opt in opts:
        for group in opt.param_groups:
            if group.get("capturable") or group.get("fused"):
                continue
            for p in group["params"]:
                step = opt.state.get(p, {}).get("step")
                if isinstance(step, torch.Tensor) and step.device.type != "cpu":
                    opt.state[p]["step"] = step.to("cpu")
