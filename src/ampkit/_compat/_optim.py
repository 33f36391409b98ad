"""The optimizer step's private torch API: the fused AMP kernels, the fused optimizers' flag, step hooks, and the
devices that take ``capturable=True``.
"""

from __future__ import annotations

import torch

__all__ = [
    "amp_non_finite_check_and_unscale_",
    "amp_update_scale_",
    "capturable_supported_devices",
    "optimizer_has_step_hooks",
    "set_step_supports_amp_scaling",
    "step_supports_amp_scaling",
]

# The fused AMP kernels torch.amp.GradScaler itself launches (private ops, present since torch 1.x): aliases, not
# wrappers, so the per-step path pays no extra call.
amp_update_scale_ = torch._amp_update_scale_
amp_non_finite_check_and_unscale_ = torch._amp_foreach_non_finite_check_and_unscale_


def capturable_supported_devices() -> list[str]:
    """The device types on which torch's optimizers accept ``capturable=True`` (CUDA-graph capture).

    >>> "cpu" in capturable_supported_devices()
    False
    """
    from torch.optim.optimizer import (
        _get_capturable_supported_devices,  # private, torch >= 2.3
    )

    return list(_get_capturable_supported_devices())


def step_supports_amp_scaling(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` unscales gradients itself (torch's fused optimizers; private flag since 1.13).

    >>> w = torch.nn.Parameter(torch.zeros(2))
    >>> step_supports_amp_scaling(torch.optim.SGD([w], lr=0.1)), step_supports_amp_scaling(torch.optim.SGD([w], lr=0.1, fused=True))
    (False, True)
    """
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def set_step_supports_amp_scaling(optimizer: torch.optim.Optimizer, value: bool) -> None:
    """Tell torch's GradScaler (and ampkit's engine) whether ``optimizer.step`` may unscale the gradients itself.

    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, fused=True)
    >>> set_step_supports_amp_scaling(opt, False); step_supports_amp_scaling(opt)
    False
    """
    optimizer._step_supports_amp_scaling = value  # type: ignore[attr-defined]


def optimizer_has_step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a step pre- or post-hook applies to ``optimizer`` (its own or a global one; private dicts since 2.0).

    A step that calls the optimizer's undecorated update (the fused master step) would bypass them. A hook whose
    ``ampkit_bypassable`` attribute is true does not count: the engine's guard against an ``optimizer.step()`` of
    the user's own (:mod:`ampkit.training._misuse`), which the engine's own steps need not run.

    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    >>> before = optimizer_has_step_hooks(opt)
    >>> handle = opt.register_step_post_hook(lambda *args: None)
    >>> before, optimizer_has_step_hooks(opt)
    (False, True)
    """
    from torch.optim import optimizer as optim_module

    own = [getattr(optimizer, "_optimizer_step_pre_hooks", None), getattr(optimizer, "_optimizer_step_post_hooks", None)]
    shared = [getattr(optim_module, "_global_optimizer_pre_hooks", None), getattr(optim_module, "_global_optimizer_post_hooks", None)]
    return any(not getattr(hook, "ampkit_bypassable", False) for hooks in (*own, *shared) if hooks for hook in hooks.values())
