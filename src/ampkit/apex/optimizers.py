"""``apex.optimizers`` on torch's own optimizers, which have had fused multi-tensor kernels since Apex's were written.

``FusedAdam``, ``FusedSGD`` and ``FusedAdagrad`` take Apex's signatures and *are* torch's Adam, SGD and
Adagrad (subclasses), so ``isinstance(opt, torch.optim.Adam)`` holds, GradScaler and LR schedulers treat them as
torch's, and torch's fused kernel runs wherever it exists for the parameters' device and dtype (its foreach
kernels elsewhere). Arguments that only tuned Apex's kernels are accepted; arguments that would change the
update where torch has no equivalent raise, naming what to pass instead, because silently running different
math is worse than failing at construction. Apex's LAMB and NovoGrad have no torch counterpart: they raise.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch
from torch.optim.optimizer import required

from .._compat import capturable_supported_devices
from ..training._kernel_guards import guard_optimizer

__all__ = ["FusedAdam", "FusedSGD", "FusedAdagrad", "FusedLAMB", "FusedNovoGrad", "FusedMixedPrecisionLamb"]

log = logging.getLogger("ampkit")

_REAL_APEX = "or keep a real NVIDIA Apex install for it (ampkit.apex.install() leaves a real apex's modules in place)"

_fused_cache: dict[tuple[type, str, torch.dtype], bool] = {}


def _tensor_of(item: Any) -> Any:
    # torch accepts (name, tensor) pairs as well as bare tensors.
    return item[1] if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) else item


def _materialise(params: Any) -> tuple[Any, list[torch.Tensor]]:
    """Read ``params`` once (it may be a generator) and return it in a re-iterable form with its tensors.

    Group dicts are shallow-copied with their ``params`` listed, so the caller's dicts are not modified.
    """
    if isinstance(params, torch.Tensor):
        return params, []  # torch rejects a bare tensor with its own message
    items: list[Any] = []
    tensors: list[torch.Tensor] = []
    for item in params:
        if isinstance(item, Mapping) and "params" in item:
            group = dict(item)
            ps = group["params"]
            group["params"] = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            tensors.extend(t for t in map(_tensor_of, group["params"]) if isinstance(t, torch.Tensor))
            items.append(group)
        else:
            items.append(item)
            t = _tensor_of(item)
            if isinstance(t, torch.Tensor):
                tensors.append(t)
    return items, tensors


def _fused_runs(base: type[torch.optim.Optimizer], device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``base(..., fused=True)`` steps on ``device`` and ``dtype``, asked of torch once per combination.

    Which devices and dtypes have a fused kernel differs between optimizers and torch releases (fused Adagrad
    was CPU-only for a while), so one tiny real step is the only answer that is right on every version.
    """
    key = (base, device.type, dtype)
    if key not in _fused_cache:
        probe = torch.zeros(1, device=device, dtype=dtype, requires_grad=True)
        probe.grad = torch.ones_like(probe)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                base([probe], lr=0.1, fused=True).step()
            _fused_cache[key] = True
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            log.debug("ampkit.apex.optimizers: no fused %s for %s %s (%s); using foreach.", base.__name__, device.type, dtype, exc)
            _fused_cache[key] = False
    return _fused_cache[key]


def _kernel(base: type[torch.optim.Optimizer], tensors: list[torch.Tensor]) -> dict[str, bool]:
    """``{"fused": True}`` when every parameter can take torch's fused kernel, else ``{"foreach": True}``."""
    if not tensors:
        return {}
    combos = {(t.device, t.dtype) for t in tensors}
    if all(t.is_floating_point() for t in tensors) and all(_fused_runs(base, d, dt) for d, dt in combos):
        return {"fused": True}
    return {"foreach": True}


def _group_values(items: Any, key: str, default: Any) -> list[Any]:
    """The value of ``key`` in every parameter group that ``items`` will make (``default`` where unset)."""
    if isinstance(items, list) and items and isinstance(items[0], dict):
        return [g.get(key, default) for g in items]
    return [default]


class _SetGradNone:
    """Apex's ``set_grad_none``: what a bare ``zero_grad()`` does, per optimizer."""

    set_grad_none: bool

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Clear the gradients: to None when ``set_to_none`` (default: the ``set_grad_none`` given at construction)."""
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)  # type: ignore[misc]


class FusedAdam(_SetGradNone, torch.optim.Adam):
    """Apex's ``FusedAdam`` as torch's Adam: AdamW by default (``adam_w_mode=True``), Adam with L2 otherwise.

    Runs torch's fused Adam kernel where the parameters' device and dtype have one, its foreach kernel
    elsewhere. ``bias_correction=False`` and ``master_weights=True`` have no torch equivalent and raise;
    ``capturable`` is passed on where torch supports it (CUDA graphs) and is harmless elsewhere; ``amsgrad=True``,
    which Apex refused, runs torch's AMSGrad. Moment estimates are kept in the parameters' dtype (torch's rule;
    Apex kept them in fp32), so keep 16-bit models' optimizers on fp32 master weights (amp O2).

    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> opt = FusedAdam([w], lr=0.1, weight_decay=0.01)
    >>> w.grad = torch.ones(2); opt.step()
    >>> w.detach()
    tensor([0.8990, 0.8990])
    >>> isinstance(opt, torch.optim.Adam), opt.defaults["fused"]
    (True, True)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
        capturable: bool = False,
        master_weights: bool = False,
    ) -> None:
        items, tensors = _materialise(params)
        if not bias_correction or not all(_group_values(items, "bias_correction", True)):
            raise NotImplementedError(
                "FusedAdam(bias_correction=False) has no torch equivalent: torch's Adam always corrects the bias of its "
                f"moment estimates. Drop bias_correction=False (True is Apex's default and torch's behaviour), {_REAL_APEX}."
            )
        if master_weights:
            raise NotImplementedError(
                "FusedAdam(master_weights=True) kept fp32 copies of 16-bit parameters inside the optimizer; torch's Adam "
                "has no such option. Drop master_weights and either keep the model in fp32 under autocast "
                "(amp.initialize(model, optimizer, opt_level='O1')) or let amp.initialize(model, optimizer, "
                "opt_level='O2') keep the fp32 master weights."
            )
        # Adam(decoupled_weight_decay=True) is AdamW's update (torch 2.7+, ampkit's floor), so one class serves both modes.
        kwargs: dict[str, Any] = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, decoupled_weight_decay=adam_w_mode, **_kernel(torch.optim.Adam, tensors)
        )
        if capturable:
            # Only CUDA-graph capture needs it, and torch refuses it on devices without graph support (the CPU).
            if tensors and all(t.device.type in capturable_supported_devices() for t in tensors):
                kwargs["capturable"] = True
            else:
                log.debug("ampkit.apex FusedAdam: capturable=True only matters for CUDA graphs; ignored on %s.", sorted({t.device.type for t in tensors}))
        super().__init__(items, **kwargs)
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict from torch's Adam, from this class, or from Apex's FusedAdam.

        Apex counted steps once per group (``group["step"]``); torch counts per parameter. An Apex state dict is
        converted on the way in (the caller's dict is left as it was), so Apex checkpoints resume here.
        """
        super().load_state_dict(_steps_per_param(state_dict))


def _steps_per_param(state_dict: dict[str, Any], missing_step: float | None = None) -> dict[str, Any]:
    """Move Apex's per-group ``step`` into each parameter's state (or set ``missing_step`` where none is known)."""
    groups = state_dict.get("param_groups", [])
    if not any("step" in g for g in groups) and missing_step is None:
        return state_dict
    state = {k: dict(v) for k, v in state_dict.get("state", {}).items()}
    new_groups = []
    for g in groups:
        g = dict(g)
        step = g.pop("step", missing_step)
        g.pop("bias_correction", None)
        if step is not None:
            for pid in g["params"]:
                if pid in state and "step" not in state[pid]:
                    state[pid]["step"] = torch.tensor(float(step))
        new_groups.append(g)
    return {**state_dict, "state": state, "param_groups": new_groups}


class FusedSGD(_SetGradNone, torch.optim.SGD):
    """Apex's ``FusedSGD`` as torch's SGD (the same update: weight decay, then momentum, then Nesterov).

    ``wd_after_momentum=True`` has no torch equivalent and raises. ``materialize_master_grads`` only steered
    Apex amp's fp16 gradient copies and is accepted; ``set_grad_none`` decides what ``zero_grad()`` does
    (False, Apex's default: zero-filled gradients).

    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> opt = FusedSGD([w], lr=0.5, momentum=0.9)
    >>> w.grad = torch.ones(2); opt.step()
    >>> w.detach(), isinstance(opt, torch.optim.SGD)
    (tensor([0.5000, 0.5000]), True)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: Any = required,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        wd_after_momentum: bool = False,
        materialize_master_grads: bool = True,
        set_grad_none: bool = False,
    ) -> None:
        if wd_after_momentum:
            raise NotImplementedError(
                "FusedSGD(wd_after_momentum=True) applied weight decay after the momentum update; torch's SGD adds it "
                f"to the gradient before momentum (Apex's default). Drop wd_after_momentum=True, {_REAL_APEX}."
            )
        if not materialize_master_grads:
            log.debug("ampkit.apex FusedSGD: materialize_master_grads=False only changed Apex amp's fp16 grad copies; ignored.")
        items, tensors = _materialise(params)
        lr_required = lr is required
        if lr_required and None in _group_values(items, "lr", None):
            raise TypeError("FusedSGD needs a learning rate: pass lr=... (or an 'lr' in every parameter group), as with torch.optim.SGD.")
        # With lr in every group the default is never read; it is restored to `required` below so that a later
        # add_param_group without an lr fails as Apex's did.
        super().__init__(
            items,
            lr=0.0 if lr_required else lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            **_kernel(torch.optim.SGD, tensors),
        )
        if lr_required:
            self.defaults["lr"] = required
        guard_optimizer(self)  # torch's fused SGD is wrong on some devices and dtypes: see ampkit.training._kernel_guards
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads
        self.set_grad_none = set_grad_none


class FusedAdagrad(_SetGradNone, torch.optim.Adagrad):
    """Apex's ``FusedAdagrad`` as torch's Adagrad (L2 weight decay folded into the gradient, as Apex's default).

    ``adagrad_w_mode=True`` (decoupled weight decay) has no torch equivalent and raises.

    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> opt = FusedAdagrad([w], lr=0.1)
    >>> w.grad = torch.ones(2); opt.step()
    >>> w.detach(), isinstance(opt, torch.optim.Adagrad)
    (tensor([0.9000, 0.9000]), True)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        set_grad_none: bool = True,
        adagrad_w_mode: bool = False,
    ) -> None:
        if adagrad_w_mode:
            raise NotImplementedError(
                "FusedAdagrad(adagrad_w_mode=True) decoupled weight decay from the gradient; torch's Adagrad only adds "
                f"it to the gradient (L2, Apex's default). Drop adagrad_w_mode=True, {_REAL_APEX}."
            )
        items, tensors = _materialise(params)
        super().__init__(items, lr=lr, eps=eps, weight_decay=weight_decay, **_kernel(torch.optim.Adagrad, tensors))
        self.adagrad_w_mode = adagrad_w_mode
        self.set_grad_none = set_grad_none

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load torch's or Apex's Adagrad state; Apex kept no step count, which only a decaying lr would read."""
        super().load_state_dict(_steps_per_param(state_dict, missing_step=0.0))


class _Unavailable(torch.optim.Optimizer):
    """An Apex optimizer torch has no counterpart for: constructing it raises, saying what to use instead."""

    _why: ClassVar[str] = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"apex.optimizers.{type(self).__name__}: {self._why}")


class FusedLAMB(_Unavailable):
    """Not provided: torch has no LAMB. Constructing it raises, naming the alternatives.

    >>> FusedLAMB([torch.zeros(1, requires_grad=True)])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    NotImplementedError: apex.optimizers.FusedLAMB: torch has no native LAMB optimizer...
    """

    _why = (
        "torch has no native LAMB optimizer, so ampkit.apex does not provide one. Use torch.optim.AdamW (LAMB's update "
        "without the per-layer trust ratio; retune lr), wrap an optimizer in ampkit.apex.parallel.LARC for layer-wise "
        f"trust ratios, {_REAL_APEX}."
    )


class FusedMixedPrecisionLamb(_Unavailable):
    """Not provided: torch has no LAMB. Constructing it raises, naming the alternatives.

    >>> FusedMixedPrecisionLamb([torch.zeros(1, requires_grad=True)])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    NotImplementedError: apex.optimizers.FusedMixedPrecisionLamb: torch has no native LAMB optimizer...
    """

    _why = FusedLAMB._why


class FusedNovoGrad(_Unavailable):
    """Not provided: torch has no NovoGrad. Constructing it raises, naming the alternatives.

    >>> FusedNovoGrad([torch.zeros(1, requires_grad=True)])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    NotImplementedError: apex.optimizers.FusedNovoGrad: torch has no native NovoGrad optimizer...
    """

    _why = (
        "torch has no native NovoGrad optimizer, so ampkit.apex does not provide one. Use torch.optim.AdamW (the "
        f"closest native update; retune lr and weight_decay), {_REAL_APEX}."
    )
