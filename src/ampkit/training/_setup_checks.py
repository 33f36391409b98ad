"""What ``Engine.setup()`` is given, refused where it would train wrong in silence: trainable weights already in
16 bits under a mixed policy, and a step with no optimizer to take it.

A mixed policy (``bf16-mixed``, ``16-mixed``, the fp8 ones) promises fp32 weights and computes in 16 bits under
autocast; it does not cast the model. Given a model already made 16-bit (``model.half()``, ``.to(torch.bfloat16)``),
it trains 16-bit weights with no fp32 master: every update smaller than half the weight's spacing rounds away (a
bf16 weight of 1.0 ignores any update under 2**-8), and under ``16-mixed`` the loss scale's gradients are fp16
too. Only the parameters an optimizer steps are checked: a frozen 16-bit base beside fp32 adapters (LoRA) is the
legitimate use, and stays silent.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit.policy import get_policy
    >>> model = nn.Linear(2, 2).half()
    >>> check_fp32_weights(get_policy("16-mixed"), [torch.optim.SGD(model.parameters(), lr=0.1)], model)
    Traceback (most recent call last):
    ...
    ValueError: Engine('16-mixed').setup(): the optimizer steps 2 torch.float16 parameter(s) (weight, bias), but '16-mixed' keeps fp32 weights and computes in 16 bits under autocast: updates below the 16-bit weights' spacing would round away. Pass the fp32 model (drop model.half() / .to(torch.float16) before setup), or keep 16-bit weights with fp32 masters: Engine('16-true-masters').
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..policy import Policy

__all__ = ["check_fp32_weights", "no_optimizer_error"]

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def check_fp32_weights(policy: Policy, optimizers: Sequence[Any], models: Any) -> None:
    """Refuse trainable 16-bit parameters in ``optimizers`` under a policy that keeps fp32 weights and autocasts
    (see the module docstring); ``models``: a module or several, where the names come from. Once at setup: a scan of
    the optimizers' parameters. Arguments of the wrong kind pass untouched: setup's own checks name them."""
    if policy.compute_dtype is None or policy.param_dtype != torch.float32 or policy.master_weights:
        return
    opts = [o for o in optimizers if isinstance(o, torch.optim.Optimizer)]
    half = [p for o in opts for g in o.param_groups for p in g["params"] if p.requires_grad and p.dtype in _SIXTEEN_BIT]
    if not half:
        return
    mods = [models] if isinstance(models, nn.Module) else [m for m in models if isinstance(m, nn.Module)] if isinstance(models, (list, tuple)) else []
    names = {id(p): n for m in mods for n, p in m.named_parameters()}
    shown = [names.get(id(p), "?") for p in half[:3]]
    dtype = half[0].dtype
    true = "16-true-masters" if dtype == torch.float16 else "bf16-true-masters"
    raise ValueError(
        f"Engine({policy.name!r}).setup(): the optimizer steps {len(half)} {dtype} parameter(s) ({', '.join(shown)}"
        f"{', ...' if len(half) > 3 else ''}), but {policy.name!r} keeps fp32 weights and computes in 16 bits under autocast: "
        f"updates below the 16-bit weights' spacing would round away. Pass the fp32 model (drop model.half() / .to({dtype}) "
        f"before setup), or keep 16-bit weights with fp32 masters: Engine({true!r})."
    )


def no_optimizer_error(what: str, later: bool) -> RuntimeError:
    """The error of a step asked of an engine set up without an optimizer (``later``: by ``setup_module``)."""
    if later:
        return RuntimeError(f"engine.{what}() after setup_module(model) and before setup_optimizers(optimizer): there is no optimizer to step yet.")
    return RuntimeError(
        f"engine.{what}() after engine.setup(model) with no optimizer: nothing would update the weights while engine.steps "
        "moves on. Pass the optimizer to setup: model, optimizer = engine.setup(model, optimizer). (engine.backward() "
        "alone, to read gradients, needs none.)"
    )
