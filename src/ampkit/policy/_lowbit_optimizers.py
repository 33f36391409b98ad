"""The library twin of a torch optimizer that applies bf16 updates with Kahan summation or stochastic rounding.

``bf16-true-kahan`` steps with optimi's optimizers (``kahan_sum=True``: a bf16 compensation buffer per weight
carries what rounding dropped into the next step); ``bf16-true-sr`` with torchao's ``_AdamW``
(``bf16_stochastic_round=True``: the fp32 result is rounded up or down at random, in proportion, so small
updates land on average; the engine gives its draws a stream of their own, the same on every replica:
:mod:`ampkit.training._rounding_stream`). Both libraries' steps are the torch optimizers' arithmetic, reordered, so a plain
``torch.optim.AdamW`` is rebuilt as its twin over the same groups with the same settings; only settings with
an exact equivalent are mapped, the rest are refused, naming the fix. Nothing here is written that the
libraries provide: this module translates settings, checks that the translation is exact, and gives the engine
torchao's step in a form torch.compile can trace as one region (:func:`region_step`; torchao's own step compiles
one call per parameter, see there).

The libraries are optional (``pip install 'ampkit[lowbit]'``) and imported only when such a policy is set up.

    >>> from torch import nn
    >>> model = nn.Linear(4, 2)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    >>> lowbit_twin(opt, "kahan")
    Traceback (most recent call last):
    ...
    ValueError: bf16-true-kahan cannot step SGD(nesterov=True): optimi has no exact equivalent. Drop nesterov=True, or train with 'bf16-true-remainder', which steps any torch optimizer.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, cast

import torch

from .._util.library_logs import quiet_library_logs

__all__ = ["EXTRA", "LowbitMethod", "lowbit_twin", "missing_library", "quiet_library_logs", "region_step"]

LowbitMethod = Literal["kahan", "sr"]

EXTRA = "lowbit"
"""The ``pip install 'ampkit[...]'`` extra that brings torch-optimi and torchao."""

_POLICY = {"kahan": "bf16-true-kahan", "sr": "bf16-true-sr"}
_LIBRARY = {"kahan": ("optimi", "torch-optimi"), "sr": ("torchao.optim", "torchao")}


def missing_library(method: LowbitMethod) -> str | None:
    """Why ``method`` cannot run here (its library is not installed, said with the fix), or None. Imports nothing.

    >>> missing_library("kahan") is None or "pip install" in missing_library("kahan")
    True
    """
    module, package = _LIBRARY[method]
    if importlib.util.find_spec(module.split(".")[0]) is not None:
        return None
    return f"needs {package}: pip install 'ampkit[{EXTRA}]', or train with 'bf16-true-remainder'"


def _library(method: LowbitMethod) -> ModuleType:
    module, package = _LIBRARY[method]
    try:
        with quiet_library_logs("torchao", "torch.utils._pytree"):
            return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"Policy {_POLICY[method]!r} steps with {package}, which is not installed ({e}); "
            f"pip install 'ampkit[{EXTRA}]', or train with 'bf16-true-remainder', which needs no extra library."
        ) from e


def _refuse(method: LowbitMethod, opt: torch.optim.Optimizer, what: str, why: str, fix: str) -> ValueError:
    return ValueError(f"{_POLICY[method]} cannot step {type(opt).__name__}({what}): {why}. {fix}")


def _check_fresh(method: LowbitMethod, opt: torch.optim.Optimizer) -> None:
    # A twin starts with no state: moments built by the torch optimizer would be lost (optimi also keeps them
    # debiased, in another form), so the run would silently restart its moments.
    if any(len(s) for s in opt.state.values()):
        raise ValueError(
            f"{_POLICY[method]}: the {type(opt).__name__} passed to setup() has already stepped (it holds state), and its "
            "library twin starts fresh; pass setup() a new optimizer and load your checkpoint after setup()."
        )
    # torch's LRScheduler wraps optimizer.step and writes initial_lr into the groups: it would go on scheduling
    # the optimizer that setup() replaces, while the twin's learning rate never changes.
    if hasattr(opt.step, "_wrapped_by_lr_sched") or any("initial_lr" in g for g in opt.param_groups):
        raise ValueError(
            f"{_POLICY[method]}: an LR scheduler is attached to the {type(opt).__name__} passed to setup(), which setup() "
            "replaces by its library twin; build the scheduler on the optimizer setup() returns."
        )


def _float(value: Any) -> Any:
    # One read at setup: the libraries take Python numbers (torchao turns lr back into its own tensor).
    return float(value) if isinstance(value, torch.Tensor) else value


def _adam_groups(method: LowbitMethod, opt: torch.optim.Optimizer) -> tuple[list[dict[str, Any]], bool]:
    """The twin's groups of a torch Adam/AdamW, and whether its weight decay is decoupled (AdamW)."""
    groups, decoupled = [], set()
    for g in opt.param_groups:
        for flag in ("maximize", "differentiable") + (("amsgrad",) if method == "kahan" else ()):
            if g.get(flag):
                raise _refuse(method, opt, f"{flag}=True", f"{_LIBRARY[method][1]} has no exact equivalent", f"Drop {flag}=True, or train with 'bf16-true-remainder', which steps any torch optimizer.")
        # torch.optim.AdamW is Adam with decoupled_weight_decay=True: lr-coupled decay, p *= 1 - lr * wd. The
        # torch settings that choose a kernel (foreach, fused, capturable) do not change the arithmetic: not mapped.
        decouple = bool(g.get("decoupled_weight_decay", isinstance(opt, torch.optim.AdamW)))
        decoupled.add(decouple)
        beta1, beta2 = (_float(b) for b in g["betas"])
        mapped = {"params": g["params"], "lr": _float(g["lr"]), "eps": g["eps"], "weight_decay": g["weight_decay"]}
        if method == "kahan":
            # optimi keeps the betas apart, and decouple_wd is its lr-coupled decay (decouple_lr is another decay).
            mapped.update(beta1=beta1, beta2=beta2, decouple_wd=decouple, decouple_lr=False)
        else:
            mapped.update(betas=(beta1, beta2), amsgrad=bool(g.get("amsgrad")))
        groups.append(mapped)
    if method == "sr" and len(decoupled) > 1:
        raise _refuse(method, opt, "decoupled_weight_decay differing by group", "torchao decouples weight decay for a whole optimizer or for none", "Split it into two optimizers, one per kind of decay.")
    return groups, decoupled == {True}


def _sgd_groups(method: LowbitMethod, opt: torch.optim.Optimizer) -> list[dict[str, Any]]:
    if method == "sr":
        raise _refuse(method, opt, "...", "torchao has stochastic rounding for Adam and AdamW only", "Train SGD with 'bf16-true-kahan' or 'bf16-true-remainder'.")
    groups = []
    for g in opt.param_groups:
        for flag in ("nesterov", "maximize", "differentiable"):
            if g.get(flag):
                raise _refuse(method, opt, f"{flag}=True", "optimi has no exact equivalent", f"Drop {flag}=True, or train with 'bf16-true-remainder', which steps any torch optimizer.")
        # torch's dampening d scales the new gradient by 1 - d; optimi's dampening=True scales it by 1 - momentum
        # (and starts from zeros): the same arithmetic only for d = 0, where both start the buffer at the gradient.
        if g.get("dampening"):
            raise _refuse(method, opt, f"dampening={g['dampening']}", "optimi's dampening is not torch's", "Use dampening=0, or train with 'bf16-true-remainder'.")
        # torch's SGD weight decay is an L2 term added to the gradient: optimi's decouple_wd=False.
        groups.append({"params": g["params"], "lr": _float(g["lr"]), "momentum": g["momentum"], "weight_decay": g["weight_decay"], "dampening": False, "decouple_wd": False, "decouple_lr": False})
    return groups


def _optimi(cls: Callable[..., torch.optim.Optimizer], groups: list[dict[str, Any]], lib: ModuleType) -> torch.optim.Optimizer:
    speed = _optimi_kernels([p for g in groups for p in g["params"]], lib)
    with warnings.catch_warnings():
        # foreach=True (an accelerator without Triton) warns that Triton is preferred, which these weights cannot use.
        warnings.filterwarnings("ignore", message="Parameter `foreach` is deprecated", category=DeprecationWarning)
        twin = cls(groups, lr=groups[0]["lr"], kahan_sum=True, **speed)
    # optimi's Adam adds its step counter to each group on the first step; a checkpoint loaded before then would
    # bring a group setting the fresh optimizer lacks, which reads as another optimizer's checkpoint. Add it now,
    # as optimi would (its first step still starts it from zero, as setup is False).
    if cls is lib.Adam:
        for group in twin.param_groups:
            group.setdefault("step", torch.tensor(0, dtype=torch.int32))
    return twin


def _optimi_kernels(params: list[torch.Tensor], lib: ModuleType) -> dict[str, bool]:
    """Which of optimi's implementations steps ``params``: the fastest that computes optimi's arithmetic on their device.

    - CUDA with Triton: optimi's default, one fused Triton kernel per tensor (each value read and written once,
      the arithmetic in fp32 between loads and stores).
    - Another accelerator: ``foreach=True``, a dozen multi-tensor launches instead of a dozen launches per tensor.
    - The CPU: the for-loop (optimi's own CPU default, which ampkit used to override with foreach). A CPU foreach op
      is a loop of per-tensor ops anyway, and torch's CPU ``_foreach_mul_`` rounds its scalar to the tensors'
      dtype (torch 2.13): with bf16 weights, optimi's foreach path multiplied by a decay factor of 0.98828125 for
      0.99, and by beta2 rounded alike. The for-loop's per-tensor ``mul_`` keeps them in fp32; running one
      tensor's ops while it is in cache, it was level with foreach on gpt small and 1.2x faster on gpt large
      (benchmarks/lowbit_step.py).
    """
    if all(p.is_cuda for p in params) and lib.utils.HAS_TRITON:
        return {}
    if any(p.device.type == "cpu" for p in params):
        return {"foreach": False, "triton": False}
    return {"foreach": True}


def region_step(opt: torch.optim.Optimizer) -> Callable[[torch.optim.Optimizer], None] | None:
    """The function torch.compile traces as one region in place of ``opt.step()``, or None where ``opt``'s own step
    is already its library's fast path.

    torchao's ``_AdamW.step`` calls ``torch.compile(single_param_adam, fullgraph=True, dynamic=False)`` once per
    parameter, from a Python loop: every step builds a compile wrapper and checks its guards once per tensor (and
    it compiles once per distinct shape), so a 76-tensor GPT pays 76 dispatches of a compiled function per step.
    Its loop runs inside ``torch._dynamo.utils.disable_cache_limit()``, a context manager dynamo cannot trace, so
    the step itself cannot be compiled whole. The function returned is that loop without the two: torchao's own
    ``single_param_adam`` (its fp32 update and its stochastic rounding, ``_fp32_to_bf16_sr``) for every parameter,
    on torchao's state, so that a single compiled call updates them all. optimi's optimizers get None: their step
    runs optimi's fused Triton kernels on CUDA (see :func:`_optimi_kernels`).

    >>> region_step(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])) is None
    True
    """
    if not type(opt).__module__.startswith("torchao."):
        return None
    adam = importlib.import_module("torchao.optim.adam")
    # _AdamW only: the quantized Adams keep their moments in tensor subclasses, which torchao compiles as it must.
    if not isinstance(opt, adam._AdamW):
        return None
    return functools.partial(_torchao_adam_step, adam.single_param_adam)


def _torchao_adam_step(single_param_adam: Callable[..., None], opt: Any) -> None:
    """torchao's ``_AdamBase.step`` (0.17, 0.18) line for line, less its per-parameter ``torch.compile`` and
    ``disable_cache_limit``; run under no_grad. The caller checks what torchao checks first (a tensor ``lr``)."""
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            state = opt.state[p]
            if len(state) == 0:  # a parameter without state yet (its first gradient came late): torchao's own start
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = opt._new_buffer(p, True)
                state["exp_avg_sq"] = opt._new_buffer(p, False)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = opt._new_buffer(p, False)
            state["step"] += 1
            single_param_adam(
                p.detach(), p.grad, state["step"], state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq", None),
                group["lr"], group["betas"][0], group["betas"][1], group["weight_decay"], group["eps"],
                opt.is_adamw, opt.bf16_stochastic_round and p.dtype is torch.bfloat16,
            )


def _already(method: LowbitMethod, opt: torch.optim.Optimizer) -> bool | None:
    """True: a library optimizer with the feature on (kept); None: not a library optimizer. Refuses one with it off."""
    top = type(opt).__module__.split(".")[0]
    if method == "kahan" and top == "optimi":
        on = all(g.get("kahan_sum") is not False for g in opt.param_groups)
        fix = "build it with kahan_sum=True (or leave kahan_sum unset: optimi turns it on for bf16 weights)"
    elif method == "sr" and top == "torchao":
        on = bool(getattr(opt, "bf16_stochastic_round", False))
        fix = "build it with bf16_stochastic_round=True"
    else:
        return None
    if not on:
        feature = "Kahan summation" if method == "kahan" else "bf16 stochastic rounding"
        raise ValueError(f"{_POLICY[method]}: the {type(opt).__name__} passed to setup() has {feature} off; {fix}, or pass a torch optimizer for setup() to convert.")
    return True


def lowbit_twin(opt: torch.optim.Optimizer, method: LowbitMethod) -> torch.optim.Optimizer:
    """The library optimizer that steps ``opt``'s parameters as ``opt`` would, updates applied by ``method``.

    ``"kahan"``: optimi's Adam, AdamW or SGD with ``kahan_sum=True``; ``"sr"``: torchao's ``_AdamW`` with
    ``bf16_stochastic_round=True`` (for ``torch.optim.Adam`` too, with its L2 weight decay). Both act on bf16
    weights only; fp32 weights (``keep_fp32``) get the plain update. ``opt`` itself is returned when it already
    is such a library optimizer. Raises ``ValueError`` naming the fix for what has no exact equivalent, an
    optimizer that has stepped, or one an LR scheduler is attached to; ``ImportError`` without the library.

    >>> from torch import nn
    >>> lowbit_twin(torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1), "sr")
    Traceback (most recent call last):
    ...
    ValueError: bf16-true-sr cannot step SGD(...): torchao has stochastic rounding for Adam and AdamW only. Train SGD with 'bf16-true-kahan' or 'bf16-true-remainder'.
    """
    if _already(method, opt):
        return opt
    _check_fresh(method, opt)
    # Every refusal comes before the import: what cannot be converted is said whether or not the library is here.
    if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):  # AdamW is no Adam subclass before torch 2.8
        groups, decoupled = _adam_groups(method, opt)
        lib = _library(method)
        if method == "kahan":
            return _optimi(lib.Adam, groups, lib)
        twin = lib._AdamW(groups, lr=groups[0]["lr"], bf16_stochastic_round=True)
        twin.is_adamw = decoupled  # torchao's own switch between AdamW's decay and Adam's L2 term
        return cast(torch.optim.Optimizer, twin)  # torchao ships no types: its _AdamW is a torch Optimizer
    if type(opt) is torch.optim.SGD:
        groups = _sgd_groups(method, opt)
        lib = _library(method)
        return _optimi(lib.SGD, groups, lib)
    kinds = "torch.optim.Adam, AdamW" + (" or SGD" if method == "kahan" else "")
    raise TypeError(
        f"{_POLICY[method]} converts {kinds} into its library twin, got {type(opt).__name__}; "
        "build one of those, or train with 'bf16-true-remainder', which steps any torch optimizer."
    )
