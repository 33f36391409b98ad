"""The activations a training step holds for backward, measured on a copy of the model, and what checkpointing
each candidate block would free (for :func:`~ampkit.memory.recompute`).
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._compat import TorchDispatchMode, tree_leaves, tree_map
from .._util.model_io import batch_loss
from ..policy import Policy
from ..training._engine import Engine
from ._accounting import LiveBytes, storage_key, tensor_bytes
from ._estimate import _model_device
from ._fake import FakeCopies

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

__all__: list[str] = []  # private helpers of ampkit.memory.recompute


class _Attribution(TorchDispatchMode):
    """Which candidate block allocated each storage, and which blocks saved it for backward, in one forward.

    Checkpointing block ``i`` frees the storages it allocated that only its own ops saved (its output, saved
    by the next block, stays); it adds the inputs nobody else saved, which the checkpoint now keeps. Storages
    are forgotten when freed, so an address reused by a later allocation starts afresh.
    """

    def __init__(self, blocks: dict[nn.Module, str]) -> None:
        super().__init__()
        self.blocks = blocks
        self.current: list[str] = []
        self.alloc: dict[int, tuple[str | None, int]] = {}
        self.saved_by: dict[int, set[str | None]] = defaultdict(set)
        self.inputs: dict[str, dict[int, int]] = defaultdict(dict)
        self._handles: list[Any] = []
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # A view or an in-place result shares an input's storage: only storages no input had are new. (Views
        # of the weights, such as the transpose a Linear saves, are the weights, not activations.)
        given = {storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = storage_key(t)
                if key not in self.alloc and key not in given:
                    self.alloc[key] = (self.current[-1] if self.current else None, t.untyped_storage().nbytes())
                    weakref.finalize(t.untyped_storage(), self._forget, key)
        return out

    def _forget(self, key: int) -> None:
        self.alloc.pop(key, None)
        self.saved_by.pop(key, None)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.saved_by[storage_key(t)].add(self.current[-1] if self.current else None)
        return t

    def _enter_block(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        name = self.blocks[module]
        self.current.append(name)
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and storage_key(t) in self.alloc:  # made in this forward: not the batch
                self.inputs[name][storage_key(t)] = t.untyped_storage().nbytes()

    def _leave_block(self, module: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        self.current.pop()

    def __enter__(self) -> Self:
        for m in self.blocks:
            self._handles.append(m.register_forward_pre_hook(self._enter_block, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._leave_block, with_kwargs=True, always_call=True))
        self._saved_hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._saved_hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()

    def savings(self) -> dict[str, int]:
        """Bytes checkpointing each block alone would free (negative: it would keep more than it frees)."""
        out = {name: 0 for name in self.blocks.values()}
        for key, (block, size) in self.alloc.items():
            if block is not None and self.saved_by.get(key) == {block}:
                out[block] += size
        for block, inputs in self.inputs.items():
            out[block] -= sum(size for key, size in inputs.items() if not self.saved_by.get(key))
        return out


@dataclass(frozen=True)
class _Measured:
    held: int
    peak: int
    savings: dict[str, int] = field(default_factory=dict)


def _measure(model: nn.Module, batch: Any, loss_fn: Callable[[Any, Any], torch.Tensor], policy: Policy, fake: bool,
             blocks: Sequence[str] = ()) -> _Measured:
    """One forward and backward of a copy of ``model`` under ``policy``: the bytes held between the two, the peak
    above the resting state, and (for ``blocks``) what checkpointing each block would free."""
    device = _model_device(model)
    if device.type == "cuda" and not torch.cuda.is_available():
        device = torch.device("cpu")  # fake CUDA tensors need CUDA's runtime for autograd; the CPU stands in
    with contextlib.ExitStack() as stack:
        if fake:
            copies = stack.enter_context(FakeCopies())
            twin, batch = copies.model(model, device), copies.batch(batch, device)
        else:
            if any(t.device.type == "meta" for t in model.parameters()):
                raise ValueError("fake=False measures on real tensors; this model is on the meta device. Use fake=True.")
            twin = copy.deepcopy(model).to(device)
            batch = tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, batch)
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2 or isinstance(batch, Mapping)):
            raise ValueError("example_batch must be (inputs, targets) or a dict of model keyword arguments, as for ampkit.memory.estimate.")
        engine = Engine(policy)
        twin = engine.setup(twin)  # the policy's conversion (16-bit weights, fp32 islands), on the copy
        twin.train()
        live = stack.enter_context(LiveBytes())
        live.track([*twin.parameters(), *twin.buffers(), *tree_leaves(batch)])
        base = live.current
        named = dict(twin.named_modules())
        attribution = _Attribution({named[n]: n for n in blocks}) if blocks else contextlib.nullcontext()
        with attribution, engine.autocast():
            loss = batch_loss(twin, batch, loss_fn)  # the output is dropped inside: only what backward needs stays
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise ValueError("loss_fn(output, target) must return a tensor that requires grad; pass loss_fn= for this model.")
        # Read after autocast has exited: its cache of 16-bit weight copies is dropped there, so what is left is
        # what the graph holds for backward.
        held = live.current - base - tensor_bytes([loss])
        savings = attribution.savings() if isinstance(attribution, _Attribution) else {}  # before backward frees them
        loss.backward()
        return _Measured(held=held, peak=live.peak - base, savings=savings)
