"""LARC: layer-wise adaptive rate control (https://arxiv.org/abs/1708.03888) around any torch optimizer.

For each parameter with non-zero weight and gradient norms it computes a local rate
``trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps)`` and applies it by rescaling the gradient
(after folding the group's weight decay into it), so the wrapped optimizer's own update does the rest. In clip
mode the rate is capped at the group's lr (the gradient is scaled by ``min(local_rate / lr, 1)``). The weight
decay is zeroed in each group for the inner step, since it is already in the gradient, and restored afterwards.

The norms and the rescaling run as a handful of foreach launches per parameter group, with no host-device
sync: Apex's version launched several kernels and synced once per parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["LARC"]

_ABSENT = object()


class LARC:
    """Wrap ``optimizer`` so each parameter's step is scaled by its layer-wise adaptive rate (Apex's LARC).

    A duck-typed optimizer, like Apex's: ``param_groups``, ``state`` and ``defaults`` are the wrapped
    optimizer's, and ``optim`` is the wrapped optimizer itself (give that to LR schedulers, which accept only
    ``torch.optim.Optimizer`` instances; they change the same parameter groups LARC reads).

    >>> w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    >>> opt = LARC(torch.optim.SGD([w], lr=1.0), trust_coefficient=0.1, clip=False)
    >>> w.grad = torch.tensor([0.6, 0.8]); opt.step()
    >>> w.detach()  # local rate 0.1 * 5 / 1 = 0.5 scales the gradient
    tensor([2.7000, 3.6000])
    """

    def __init__(self, optimizer: Any, trust_coefficient: float = 0.02, clip: bool = True, eps: float = 1e-8) -> None:
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.clip = clip
        self.eps = eps

    # ----------------------------------------------------------------------------- the wrapped optimizer
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optim.param_groups = value

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.optim.state

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's defaults."""
        return self.optim.defaults

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict (LARC itself holds no state)."""
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict`` into the wrapped optimizer."""
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Clear gradients through the wrapped optimizer (``None``: its own default)."""
        if set_to_none is None:
            self.optim.zero_grad()
        else:
            self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer."""
        self.optim.add_param_group(param_group)

    def __repr__(self) -> str:
        return f"LARC(trust_coefficient={self.trust_coefficient}, clip={self.clip}, eps={self.eps}) over {self.optim!r}"

    # ----------------------------------------------------------------------------------------- the step
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Rescale every gradient by its adaptive rate, then step the wrapped optimizer; returns the closure's loss.

        A closure is evaluated first (it produces the gradients LARC reads); the inner optimizer then steps
        without it. Each group's ``weight_decay`` is restored even if the inner step raises.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        saved: list[Any] = []
        try:
            with torch.no_grad():
                for group in self.optim.param_groups:
                    weight_decay = group.get("weight_decay", _ABSENT)
                    saved.append(weight_decay)
                    self._rescale(group, 0.0 if weight_decay is _ABSENT else weight_decay)
                    if weight_decay is not _ABSENT:
                        group["weight_decay"] = 0  # already folded into the gradient
            self.optim.step()
        finally:
            for group, weight_decay in zip(self.optim.param_groups, saved):
                if weight_decay is not _ABSENT:
                    group["weight_decay"] = weight_decay
        return loss

    def _rescale(self, group: dict[str, Any], weight_decay: Any) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        if any(p.grad.is_sparse for p in params):
            raise TypeError("LARC needs dense gradients (torch.norm of a sparse gradient is not its layer norm); use nn.Embedding(sparse=False) with LARC.")
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for p in params:
            by_device.setdefault(p.device, []).append(p)
        for ps in by_device.values():
            grads = [p.grad for p in ps]
            # Norms in fp32 whatever the parameters' dtype: a 16-bit norm of a large layer overflows.
            p_norm = torch.stack(torch._foreach_norm(ps, 2, dtype=torch.float32))
            g_norm = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32))
            rate = self.trust_coefficient * p_norm / (g_norm + p_norm * weight_decay + self.eps)
            if self.clip:
                rate = torch.clamp(rate / group["lr"], max=1.0)
            # Where the weight or the gradient norm is zero, the gradient is left as it was (no decay, no scaling).
            live = (p_norm != 0) & (g_norm != 0)
            if weight_decay != 0:
                decay = torch.where(live, torch.as_tensor(weight_decay, dtype=torch.float32, device=live.device), 0.0)
                torch._foreach_add_(grads, torch._foreach_mul(ps, list(decay.unbind())))
            torch._foreach_mul_(grads, list(torch.where(live, rate, 1.0).unbind()))
