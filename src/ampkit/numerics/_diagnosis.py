"""What the doctor found and recommends (:class:`Diagnosis`, returned by :func:`~ampkit.numerics.diagnose`): the
policy, the modules kept in fp32, the loss scale, every check's result, and the Engine line to paste.

    >>> from ampkit.numerics._scale import LossScaleAdvice
    >>> from ampkit.numerics._stats import TensorStats
    >>> empty = TensorStats.merge([])
    >>> d = Diagnosis("bf16-mixed", [], ["fc"], LossScaleAdvice(16, 1.0, 0.0, 0.0, 0.0), None, empty, empty, [], [], 1)
    >>> d.engine_code()
    'Engine(precision="bf16-mixed", keep_fp32=["fc"])'
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._report.dialect import Advice, check_framework, paste_code
from ..policy import get_policy
from ._compare import StepComparison
from ._compiled import CompileCheck
from ._engine_code import engine_code
from ._fp8_headroom import Fp8Headroom
from ._paste import PasteCheck
from ._scale import LossScaleAdvice
from ._stats import TensorStats
from ._update_remedy import UpdatePrecision

__all__ = ["Diagnosis"]


@dataclass
class Diagnosis:
    """What :func:`diagnose` found and recommends; :meth:`to_dict` is doctor.json."""

    recommended_precision: str
    precision_reasons: list[str]
    keep_fp32: list[str]
    scale: LossScaleAdvice
    """The fp16 loss scale the reference gradients allow (reported whatever the precision chosen)."""
    loss_scale_log2: int | None
    """The scale the engine should start from: the advice, lowered if tailoring had to; None without scaling."""
    weight_grads: TensorStats
    activation_grads: TensorStats
    comparisons: list[StepComparison]
    modules: list[dict[str, Any]]
    reference_steps: int
    tailoring_notes: list[str] = field(default_factory=list)
    target: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    """Run facts for the report: device, workload, command."""
    compile_check: CompileCheck | None = None
    """The recommended policy's step compiled against eager (``diagnose(compile=...)``); None when not asked."""
    update_precision: UpdatePrecision | None = None
    """Whether bf16 weights stepped directly lose updates and the remedy that recovers fp32's training
    (:mod:`~ampkit.numerics._update_remedy`); None without an optimizer or with ``update_steps=0``."""
    fp8: Fp8Headroom | None = None
    """How each Linear's input, weight and grad_output fit torchao's float8 cast (:mod:`~ampkit.numerics._fp8_headroom`);
    None with ``fp8_recipe=None``."""
    paste_check: PasteCheck | None = None
    """How the paste was settled when the tailored policy's step still diverged from fp32 (trained against fp32, and
    the nearest configuration that trains pasted instead; :mod:`~ampkit.numerics._paste`); None when it agreed."""
    keep_fp32_paste: list[str | type[nn.Module]] | None = None
    """:attr:`keep_fp32` as the Engine line says it: a torch.nn type in place of its modules where every module of
    the type is kept (:mod:`~ampkit.numerics._keep_types`); None: the names as they are."""
    framework: str | None = None
    """The framework the model came from (``"lightning"``, ``"transformers"``; ``ampkit doctor`` sets it from the
    workload): the prescription is also printed in its terms (:meth:`framework_code`); None: plain PyTorch."""

    @property
    def recommended_loss_scale(self) -> float:
        """The fp16 loss scale to start from: ``2^k``, the largest keeping every gradient within 65504."""
        return 2.0 ** (self.loss_scale_log2 if self.loss_scale_log2 is not None else self.scale.log2)

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`~ampkit.Engine` that apply the recommendation: ``Engine(**d.engine_kwargs())``."""
        from ..scaling import ScalerConfig

        kwargs: dict[str, Any] = {"precision": self.recommended_precision}
        if self.keep_fp32:
            kwargs["keep_fp32"] = list(self._keep_paste())
        scaler = self._scaler_settings()
        if scaler is not None:
            kwargs["scaler"] = ScalerConfig(**scaler)
        return kwargs

    def _scaler_settings(self) -> dict[str, float] | None:
        if get_policy(self.recommended_precision).loss_scaling != "dynamic":
            return None
        init = self.recommended_loss_scale
        settings = {"init_scale": init}
        # ScalerConfig keeps the scale within [1, 2^24] by default; widen the bound the recommendation crosses.
        if init > 2.0**24:
            settings["max_scale"] = init
        if init < 1.0:
            settings["min_scale"] = init
        return settings

    def engine_code(self) -> str:
        """The Python line that builds the recommended engine: the one recommendation, printed as ``Paste:``."""
        return engine_code(self.recommended_precision, self._keep_paste(), self._scaler_settings())

    def _keep_paste(self) -> list[str | type[nn.Module]]:
        return list(self.keep_fp32_paste) if self.keep_fp32_paste is not None else list(self.keep_fp32)

    def advice(self) -> Advice:
        """The prescription as the configuration to recommend (:class:`ampkit._report.dialect.Advice`): the policy,
        the modules kept in fp32 and the scaler's settings, on the device the doctor ran on."""
        device = torch.device(str(self.context.get("device", "cpu"))).type
        return Advice(precision=self.recommended_precision, keep_fp32=tuple(self.keep_fp32), scaler=self._scaler_settings(), device=device)

    def framework_code(self) -> str | None:
        """The prescription as the lines to paste into a script of :attr:`framework` (``L.Trainer`` for Lightning,
        ``TrainingArguments`` and a ``Trainer`` for Hugging Face); None for plain PyTorch, whose line is
        :meth:`engine_code`."""
        return paste_code(self.advice(), self.framework) if check_framework(self.framework) is not None else None

    def _update_dict(self) -> dict[str, Any] | None:
        """doctor.json's ``update_precision``, with whether its prescription is the recommendation's (``applied``:
        the recommended policy steps bf16 weights) or an option beside it (the recommendation keeps fp32 weights)."""
        if self.update_precision is None:
            return None
        check = self.update_precision
        kwargs = check.engine_kwargs()
        code = engine_code(kwargs["precision"], kwargs.get("keep_fp32", ())) if kwargs else None
        applied = check.prescribed is not None and self.recommended_precision == check.prescribed and set(check.keep_fp32) <= set(self.keep_fp32)
        fp32_weights = get_policy(self.recommended_precision).param_dtype == torch.float32
        return {**check.to_dict(), "engine_code": code, "applied": applied, "recommendation_fp32_weights": fp32_weights}

    def to_dict(self) -> dict[str, Any]:
        """The doctor.json document (its keys are listed in :mod:`ampkit.numerics`)."""
        from .. import __version__

        weights_unscaled, acts_unscaled = self.weight_grads.underflow_share("fp16"), self.activation_grads.underflow_share("fp16")
        k = self.loss_scale_log2 if self.loss_scale_log2 is not None else self.scale.log2
        return {
            "ampkit": __version__, "torch": torch.__version__, **self.context, "reference_steps": self.reference_steps,
            "target": self.target, "recommended_precision": self.recommended_precision,
            "precision_reasons": list(self.precision_reasons), "recommended_loss_scale": self.recommended_loss_scale,
            "loss_scale_log2": k, "gradient_max_abs": self.scale.max_abs, "keep_fp32": list(self.keep_fp32),
            "engine": {"precision": self.recommended_precision, "keep_fp32": list(self.keep_fp32), "scaler": self._scaler_settings()},
            "engine_code": self.engine_code(), "paste_check": self.paste_check.to_dict() if self.paste_check is not None else None,
            "framework": self.framework, "framework_code": self.framework_code(),
            "underflow_share_unscaled": self.scale.underflow_unscaled,
            "underflow_share_scaled": TensorStats.merge([self.weight_grads, self.activation_grads]).underflow_share("fp16", k),
            "gradient_underflow": {
                "weights": {"unscaled": weights_unscaled, "scaled": self.weight_grads.underflow_share("fp16", k)},
                "activations": {"unscaled": acts_unscaled, "scaled": self.activation_grads.underflow_share("fp16", k)},
            },
            "gradient_histograms": {
                "weights": self.weight_grads.to_dict()["histogram"], "activations": self.activation_grads.to_dict()["histogram"],
            },
            "tailoring_notes": list(self.tailoring_notes),
            "comparisons": [c.to_dict() for c in self.comparisons],
            "compile_check": self.compile_check.to_dict() if self.compile_check is not None else None,
            "update_precision": self._update_dict(),
            "fp8_headroom": self.fp8.to_dict() if self.fp8 is not None else None,
            "modules": self.modules,
        }

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` to ``path`` atomically (a temporary file renamed into place)."""
        from ..fileio._checkpoint_files import write_text_atomic

        return write_text_atomic(path, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")
