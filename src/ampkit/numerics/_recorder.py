"""Hooks that collect, per module, how its activations, weights and gradients fit fp16/bf16.

:class:`ModuleRecorder` attaches a forward hook to every module (inputs and outputs) and, in that hook, a
tensor hook to each output that requires grad (the gradient flowing back into the output: the activation
gradient). The loss is no activation: the gradient reaching it is the backward's seed (1, or under fp16 the loss
scale, held in fp32), never a value the model computed, and at any scale above 65504 it would read as an fp16
overflow. So the gradient of the tensor named by :meth:`ModuleRecorder.backward_from` and of a one-element output
of the model itself (the ``loss`` a Hugging Face model returns given labels) are left out. Tensor hooks rather than ``register_full_backward_hook``: the latter wraps outputs in a view that an
in-place op downstream (``ReLU(inplace=True)``) refuses to modify. Weights and their gradients are read by
:meth:`ModuleRecorder.record_parameters` after each backward. Statistics stay on the device until
:meth:`ModuleRecorder.summaries`.

    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    >>> with ModuleRecorder(model) as rec:
    ...     model(torch.randn(4, 3)).sum().backward()
    ...     rec.record_parameters()
    >>> rec.order, sorted(rec.summaries()["0"])
    (['0', '1', ''], ['grads', 'inputs', 'output_grads', 'outputs', 'weights'])
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .._compat import tree_leaves
from ._stats import StatsAccumulator, TensorStats, read_summaries

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ModuleRecorder", "floating_tensors"]


def floating_tensors(value: Any) -> list[torch.Tensor]:
    """Every floating-point tensor inside ``value`` (tensors, lists, tuples, dicts), depth first.

    >>> [t.dtype for t in floating_tensors((torch.ones(1), {"m": torch.zeros(1, dtype=torch.long)}))]
    [torch.float32]
    """
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor) and t.is_floating_point()]


class ModuleRecorder:
    """Per-module statistics of one model's forward and backward passes while the recorder is entered.

    ``order`` lists module names in the order their forward finished (children before their parent), the
    order in which a problem first shows. ``backward_order`` lists the modules whose output gradients
    arrived, in the order they did. ``rounding=False`` skips the rounding-error casts; ``max_values`` reads large
    tensors through a subset (see :class:`~ampkit.numerics.StatsAccumulator`).
    """

    def __init__(self, model: nn.Module, *, rounding: bool = True, max_values: int | None = None) -> None:
        self.model = model
        self.rounding = rounding
        self.max_values = max_values
        self.names: dict[nn.Module, str] = {}
        for name, module in model.named_modules():
            self.names.setdefault(module, name)  # a shared module is reported under its first name
        self._acc: dict[str, dict[str, StatsAccumulator]] = {name: {} for name in self.names.values()}
        self.order: list[str] = []
        self.backward_order: list[str] = []
        self._handles: list[RemovableHandle] = []
        self._seed: weakref.ref[torch.Tensor] | None = None

    def _add(self, name: str, kind: str, tensor: torch.Tensor) -> None:
        acc = self._acc[name].get(kind)
        if acc is None:
            acc = self._acc[name][kind] = StatsAccumulator(rounding=self.rounding, max_values=self.max_values)
        acc.update(tensor)

    def __enter__(self) -> Self:
        for module, name in self.names.items():
            self._handles.append(module.register_forward_hook(self._forward_hook(name), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _forward_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if name not in self.order:
                self.order.append(name)
            for t in floating_tensors((args, kwargs)):
                self._add(name, "inputs", t)
            for t in floating_tensors(output):
                self._add(name, "outputs", t)
                if t.requires_grad and not (module is self.model and t.numel() == 1):  # the model's own loss
                    t.register_hook(self._grad_hook(name, weakref.ref(t)))

        return hook

    def backward_from(self, loss: torch.Tensor) -> None:
        """Name the tensor the next backward starts from: its gradient, the seed, is left out wherever it was
        recorded as a module's output (a loss module's, say). Call before ``loss.backward()``."""
        self._seed = weakref.ref(loss)

    def _grad_hook(self, name: str, tensor: weakref.ref[torch.Tensor]) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if self._seed is not None and tensor() is not None and tensor() is self._seed():
                return
            if name not in self.backward_order:
                self.backward_order.append(name)
            self._add(name, "output_grads", grad)

        return hook

    def record_parameters(self, *, weights: bool = True, grads: bool = True) -> None:
        """Add every module's own parameters (``weights``) and their ``.grad`` (``grads``); call after backward."""
        for module, name in self.names.items():
            for p in module.parameters(recurse=False):
                if weights:
                    self._add(name, "weights", p)
                if grads and p.grad is not None:
                    self._add(name, "grads", p.grad)

    def accumulators(self) -> dict[str, dict[str, StatsAccumulator]]:
        """``{module name: {kind: StatsAccumulator}}`` for every module that saw any values (still on the device)."""
        return {name: dict(kinds) for name, kinds in self._acc.items() if kinds}

    def summaries(self) -> dict[str, dict[str, TensorStats]]:
        """``{module name: {kind: TensorStats}}`` for every module that saw any values (one device-to-host transfer)."""
        slots = [(name, kind, acc) for name, kinds in self.accumulators().items() for kind, acc in kinds.items()]
        stats, _ = read_summaries([acc for _, _, acc in slots])
        out: dict[str, dict[str, TensorStats]] = {}
        for (name, kind, _), s in zip(slots, stats):
            out.setdefault(name, {})[kind] = s
        return out
