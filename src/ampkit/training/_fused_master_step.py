"""The master-weight step as one compiled region: unscale, inf check, clip, fp32 update and 16-bit copy-back.

Unfused, a ``*-true-masters`` step walks the gradients and weights many times: the 16-bit gradients are copied
to fp32, unscaled and checked (a pass each), their norm is taken and they are scaled (two more), the optimizer
reads them with the fp32 weights and its state, and the weights are copied back to 16 bits. Each pass is a
foreach launch over every tensor, and on an accelerator each is bound by memory traffic. Here torch.compile
traces the whole step - ampkit's part and the optimizer's own ``step`` (torch's code, not a re-implementation)
- and inductor fuses it: C++ loops on the CPU, Triton kernels on a GPU.

Three things make the traced step correct and stable:

- **Skipping without a branch.** An overflowed step must leave weights and optimizer state untouched, and
  asking the host would cost a sync. The region keeps the values from before the update and selects them
  back where ``found_inf`` is set (``torch.where``); inductor fuses that select into the update kernel, so it
  costs no extra pass. The first step of an optimizer (no state yet) runs unfused: a state that does not exist
  yet cannot be put back.
- **No recompilation when the learning rate changes.** A float ``lr`` is a constant to the compiler, so a
  scheduler would recompile every step. During the call each group's ``lr`` is a 0-d tensor (filled from the
  float) with ``capturable=True``, torch's documented form for a compiled optimizer; the float comes back after,
  so schedulers, checkpoints and the user see what they always see.
- **The optimizer's own code.** Supported: :data:`SUPPORTED` (the optimizers torch compiles with tensor
  learning rates). Step hooks registered on an optimizer would be bypassed, so such an optimizer is refused.

A region that fails to compile does not end the run: that step and every later one are taken unfused, after one
warning (:mod:`~ampkit.training._fused_step_compile`, which also holds the torch.compile arguments it gets).

    >>> from torch import nn
    >>> from ampkit import Engine
    >>> model = nn.Linear(8, 8); opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    >>> engine = Engine("bf16-true-masters", fused_step={"backend": "aot_eager"})  # inductor by default
    >>> model, opt = engine.setup(model, opt)
    >>> for _ in range(3):
    ...     engine.backward(model(torch.randn(4, 8, dtype=torch.bfloat16)).float().square().mean()); _ = engine.step()
    >>> engine.fused_step.calls  # the first step builds the optimizer's state unfused
    2
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .._compat import compiler_error, optimizer_has_step_hooks, own_code
from ..policy._masters import MasterWeights
from ._fused_step_compile import (
    FusedStepFailed,
    region_compile_kwargs,
    steps_to_host,
    warn_fallback,
)
from ._fused_step_region import step_region

__all__ = ["SUPPORTED", "FusedMasterStep", "build_fused_step", "check_fused_step", "check_fused_step_spec", "fused_step_problem"]

log = logging.getLogger("ampkit")

SUPPORTED: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
"""Optimizers whose step the fused region traces (subclasses included); others step unfused."""


def fused_step_problem(
    optimizers: Sequence[torch.optim.Optimizer], has_masters: bool, distributed: str | None = None, *, untraceable: str | None = None
) -> str | None:
    """Why the fused master step cannot run here, in words that name the fix; None when it can. ``untraceable``: why
    the policy's masters cannot be traced (:attr:`~ampkit.policy._masters.MasterWeights.untraceable`).

    >>> from torch import nn
    >>> print(fused_step_problem([torch.optim.Adagrad(nn.Linear(1, 1).parameters())], has_masters=True))
    it traces SGD, Adam and AdamW, not Adagrad; use one of those or fused_step=False
    """
    if not has_masters:
        return "only the master-weight policies ('bf16-true-masters', '16-true-masters') have a master step to fuse"
    if distributed is not None:
        return f"{distributed}; use fused_step=False"
    if untraceable is not None:
        return untraceable
    names = ", ".join(c.__name__ for c in SUPPORTED[:-1]) + f" and {SUPPORTED[-1].__name__}"
    for opt in optimizers:
        if not isinstance(opt, SUPPORTED):
            return f"it traces {names}, not {type(opt).__name__}; use one of those or fused_step=False"
        if optimizer_has_step_hooks(opt):
            return f"{type(opt).__name__} has step hooks, which the traced step would bypass; remove them or use fused_step=False"
        if any(g.get("differentiable") for g in opt.param_groups):
            return "a differentiable optimizer cannot be traced under no_grad; use fused_step=False"
    return None


def check_fused_step_spec(spec: Any) -> None:
    """Refuse a ``fused_step=`` that is not None, a bool or a dict of torch.compile options.

    >>> check_fused_step_spec("yes")
    Traceback (most recent call last):
    ...
    ValueError: fused_step='yes' is not understood; pass True, False, a dict of torch.compile options, or leave it off (on with compile=).
    """
    if not (spec is None or isinstance(spec, bool) or (isinstance(spec, dict) and all(isinstance(k, str) for k in spec))):
        raise ValueError(f"fused_step={spec!r} is not understood; pass True, False, a dict of torch.compile options, or leave it off (on with compile=).")


def check_fused_step(
    spec: bool | dict[str, Any] | None, optimizers: Sequence[torch.optim.Optimizer], has_masters: bool, *, untraceable: str | None = None
) -> None:
    """Refuse, before setup changes anything, a fused step that is insisted on (``True``, a dict) and cannot run.

    >>> from torch import nn
    >>> check_fused_step(True, [torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)], has_masters=False)
    Traceback (most recent call last):
    ...
    ValueError: fused_step: only the master-weight policies ('bf16-true-masters', '16-true-masters') have a master step to fuse.
    """
    if spec is True or isinstance(spec, dict):
        problem = fused_step_problem(optimizers, has_masters, untraceable=untraceable)
        if problem is not None:
            raise ValueError(f"fused_step: {problem}.")


def build_fused_step(
    spec: bool | dict[str, Any] | None,
    compile_options: dict[str, Any] | None,
    optimizers: Sequence[torch.optim.Optimizer],
    masters: MasterWeights | None,
    distributed: str | None,
) -> FusedMasterStep | None:
    """The fused step ``Engine(fused_step=spec)`` asks for, at setup; None for the unfused one.

    ``spec=None`` follows ``compile=`` (``compile_options`` is its torch.compile options, None when off): on where
    it can run, else logged and unfused. ``True`` or a dict insists, and a reason it cannot run is an error.
    """
    if spec is False or (spec is None and compile_options is None):
        return None
    problem = fused_step_problem(optimizers, masters is not None, distributed, untraceable=masters.untraceable if masters is not None else None)
    if problem is not None:
        if spec is None:
            if masters is not None:
                log.info("compile: the master-weight step stays unfused: %s", problem)
            return None
        raise ValueError(f"fused_step: {problem}.")
    assert masters is not None  # fused_step_problem refuses the rest
    options = spec if isinstance(spec, dict) else compile_options or {}
    return FusedMasterStep(masters, options)


class FusedMasterStep:
    """Steps master-weight optimizers through one compiled region (see the module docstring).

    ``options`` go to ``torch.compile`` (default: inductor; see :func:`region_compile_kwargs`). :attr:`calls`
    counts the fused steps taken; :attr:`failure` says why the region was turned off, if it was.
    """

    def __init__(self, masters: MasterWeights, options: dict[str, Any] | None = None) -> None:
        self.masters = masters
        self.options = dict(options or {})
        self.calls = 0
        self.failure: str | None = None
        """Why the region failed to compile (the error's type and first line): every step since is unfused. None while it runs."""
        self._index = {id(m): i for i, m in enumerate(masters.masters)}
        self._lr: dict[int, torch.Tensor] = {}  # one persistent 0-d tensor per param group: same object, new value
        self._compiled: Callable[..., tuple[list[torch.Tensor], torch.Tensor | None]] = torch.compile(own_code(step_region), **region_compile_kwargs(self.options))

    def ready(self, opts: Sequence[torch.optim.Optimizer]) -> bool:
        """Whether the region is on and every parameter about to step has optimizer state and a dense gradient
        (else: the unfused step)."""
        if self.failure is not None:
            return False
        if len(self._index) != len(self.masters.masters):  # masters added after setup (add_param_group)
            self._index = {id(m): i for i, m in enumerate(self.masters.masters)}
        for opt in opts:
            for g in opt.param_groups:
                for p in g["params"]:
                    i = self._index.get(id(p))
                    grad = self.masters.model_params[i].grad if i is not None else p.grad
                    if grad is not None and (grad.is_sparse or not opt.state.get(p)):
                        return False
        return True

    def step(
        self,
        opts: Sequence[torch.optim.Optimizer],
        inv_scale: torch.Tensor | None,
        clip_grad_norm: float | None,
        clip_grad_value: float | None,
        skip_nonfinite: bool,
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """One fused step of ``opts``; returns each optimizer's found-inf flag as a float32 0-d tensor (none
        without ``skip_nonfinite``) and the total norm before clipping (None without ``clip_grad_norm``).

        Raises :class:`FusedStepFailed` when the region fails to compile, having taken nothing of the step and put
        back what it changed for the call: the learning rates (floats again) and flags, the step counts' device.
        (It also points each master's ``.grad`` at the master's buffer, as the unfused step does.)
        """
        # Per optimizer: where each gradient comes from (the 16-bit model parameter, or an fp32 parameter kept
        # out of the cast, which is its own source) and the parameter the optimizer steps.
        sources: list[list[torch.Tensor]] = []
        stepped: list[list[torch.Tensor]] = []
        copy_back: list[tuple[torch.Tensor, torch.Tensor]] = []  # (16-bit parameter, its master) for what steps
        for opt in opts:
            src, dst = [], []
            for g in opt.param_groups:
                for p in g["params"]:
                    i = self._index.get(id(p))
                    source = self.masters.model_params[i] if i is not None else p
                    if source.grad is None:
                        p.grad = None  # torch's step skips a parameter without a gradient
                        continue
                    if i is not None:
                        p.grad = self.masters._grad_buffers[i]
                        copy_back.append((source, p))
                    src.append(source)
                    dst.append(p)
            sources.append(src)
            stepped.append(dst)
        stepping = [i for i, ms in enumerate(stepped) if ms]  # an optimizer without gradients has nothing to do
        if not stepping:
            device = self.masters.masters[0].device if self.masters.masters else torch.device("cpu")
            return [torch.zeros((), device=device) for _ in opts] if skip_nonfinite else [], None
        for i in stepping:
            _steps_on_device(opts[i], stepped[i][0])
        try:
            with self._tensor_hyperparameters(opts):  # put back on the way out, whatever happens
                found, norm = self._compiled(
                    [sources[i] for i in stepping], [stepped[i] for i in stepping], [opts[i] for i in stepping],
                    [p for p, _ in copy_back], [m for _, m in copy_back], inv_scale, clip_grad_norm, clip_grad_value, skip_nonfinite,
                )
        except Exception as error:
            if not compiler_error(error):
                raise  # the compiled step ran and failed (out of memory, say): the training's own error
            steps_to_host(opts)  # moved to the device for the region (and by dynamo while tracing)
            raise FusedStepFailed(error) from error
        self.calls += 1
        if found and len(stepping) < len(opts):
            flags = dict(zip(stepping, found))
            found = [flags.get(i, torch.zeros_like(found[0])) for i in range(len(opts))]
        return found, norm

    def turn_off(self, failed: FusedStepFailed) -> None:
        """Stop using the region for the rest of the run (after ``failed``'s step was taken unfused); warn once."""
        if self.failure is None:
            self.failure = failed.reason
            warn_fallback(failed.reason)

    @contextlib.contextmanager
    def _tensor_hyperparameters(self, opts: Sequence[torch.optim.Optimizer]) -> Iterator[None]:
        saved = []
        for opt in opts:
            for g in opt.param_groups:
                lr = self._lr.get(id(g))
                if lr is None:
                    lr = self._lr[id(g)] = torch.tensor(float(g["lr"]), dtype=torch.float32, device=g["params"][0].device)
                else:
                    lr.fill_(float(g["lr"]))  # a launch, not a sync
                saved.append((g, g["lr"], g.get("capturable"), g.get("fused"), g.get("foreach")))
                g["lr"], g["fused"], g["foreach"] = lr, False, True
                if "capturable" in g:
                    g["capturable"] = True
        try:
            yield
        finally:
            for g, lr, capturable, fused, foreach in saved:
                g["lr"], g["fused"], g["foreach"] = lr, fused, foreach
                if capturable is not None:
                    g["capturable"] = capturable


def _steps_on_device(opt: torch.optim.Optimizer, first: torch.Tensor) -> None:
    """Put the optimizer's step counts on its parameters' device, where a capturable update expects them.

    An unfused Adam keeps them on the host (a CPU tensor each); its fused kernel and the traced, capturable update
    keep them on the device. Checked on the first parameter (one lookup per step); moved once, and again only after
    a load puts them back.
    """
    step = opt.state[first].get("step")
    if not isinstance(step, torch.Tensor) or step.device == first.device:
        return
    for p in (q for g in opt.param_groups for q in g["params"]):
        state = opt.state.get(p)
        if state and isinstance(state.get("step"), torch.Tensor):
            state["step"] = state["step"].to(p.device)
