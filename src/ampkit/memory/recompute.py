"""Activation recomputation (gradient checkpointing) of chosen blocks, with the memory it saves measured.

:func:`recompute` makes chosen submodules run their forward under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: the forward keeps only each block's inputs, and
backward runs the block again to get back what it needs. Dropout draws the same mask again (the RNG state is
stashed and restored), autocast is restored as it was, and BatchNorm's running statistics are not updated a
second time. ``modules`` names the blocks (types, names or module objects), or ``"auto"`` picks the repeated
blocks of the model's ``nn.ModuleList`` / ``nn.Sequential`` containers, the fewest that bring the activations
under ``budget``. With an ``example_batch`` the activations held for backward are measured before and after,
on fake tensors (:class:`~ampkit.memory.fake.FakeCopies`: nothing allocated) unless ``fake=False``.

    >>> import torch
    >>> from torch import nn
    >>> mlp = lambda: nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    >>> model = nn.Sequential(*[mlp() for _ in range(4)], nn.Linear(256, 10))
    >>> batch = (torch.randn(64, 256), torch.randint(0, 10, (64,)))
    >>> report = recompute(model, "auto", budget="1MiB", example_batch=batch)
    >>> report.modules                     # each block frees 512 KiB: three of the four are enough
    ('0', '1', '2')
    >>> report.activations_after <= 2**20 < report.activations_before
    True
    >>> report.undo(); recomputed_modules(model)
    ['0', '1', '2']
    []

The figures are the bytes live between forward and backward (the batch and the weights left out), counted by
:class:`~ampkit.memory.accounting.LiveBytes`, not by a saved-tensor hook such as
:class:`~ampkit.memory.accounting.SavedActivations`: checkpoint installs saved-tensor hooks of its own, and hooks
nest innermost-wins, so an outer hook only sees what checkpoint happens to save outside its own (its inputs, in
torch 2.13), never tensors held in a closure or on a module. Live bytes count whatever holds them. Left out: the
CPU RNG state each checkpoint stashes for dropout (about 5 KB of host memory per block, made outside dispatch).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.checkpoint import checkpoint

from .._util.model_io import batch_loss, default_loss
from .._util.units import fmt_bytes, parse_bytes
from ..blocks import repeated_blocks
from ..engine import Engine
from ..policy import Policy, get_policy
from .accounting import LiveBytes, storage_key, tensor_bytes
from .estimate import _model_device
from .fake import FakeCopies

__all__ = ["RecomputeReport", "recompute", "recomputed_modules", "unrecompute"]

ModuleSpec = str | type | nn.Module
"""A module name (as in ``model.named_modules()``), a module type (every instance), or a submodule itself."""


# ----------------------------------------------------------------------------------------------- wrapping


@contextlib.contextmanager
def _running_stats_kept(module: nn.Module) -> Iterator[None]:
    """Run the recomputation with throw-away copies of the running statistics of ``module``'s norm layers.

    The recomputed forward is a training forward, so BatchNorm would fold the batch into its running mean and
    variance (and count the batch) a second time. Swapping in clones, rather than restoring values afterwards,
    leaves the real buffers untouched: no in-place write bumps a version counter that autograd checks.
    """
    swapped: list[tuple[nn.Module, str, torch.Tensor]] = []
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.training and m.track_running_stats:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                buf = getattr(m, name, None)
                if isinstance(buf, torch.Tensor):
                    swapped.append((m, name, buf))
                    setattr(m, name, buf.clone())
    try:
        yield
    finally:
        for m, name, buf in swapped:
            setattr(m, name, buf)


def _recomputed_forward(module: nn.Module, original: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> Any:
    """``module``'s forward under non-reentrant checkpoint (installed as ``functools.partial(this, module, ...)``).

    ``original`` is the instance-level forward that was there before (an fp32 island's, say), or None for the
    class's. A partial bound to the module, not a closure, so ``copy.deepcopy`` (FakeCopies, estimate, the
    bench's per-policy copies) and pickling carry the wrapper to the copy and point it at the copy.
    """
    forward = original if original is not None else functools.partial(type(module).forward, module)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)  # eval / no_grad: nothing is saved, so there is nothing to recompute
    names = list(kwargs)
    first = True

    def run(*flat: Any) -> Any:
        nonlocal first
        a, kw = flat[: len(flat) - len(names)], dict(zip(names, flat[len(flat) - len(names):]))
        if first:  # the forward pass itself
            first = False
            return forward(*a, **kw)
        with _running_stats_kept(module):  # the recomputation, inside backward
            return forward(*a, **kw)

    # Keyword arguments travel positionally: checkpoint has keyword arguments of its own (debug, context_fn...)
    # that would swallow the module's, and positional tensors are saved as inputs rather than closure-held.
    return checkpoint(run, *args, *kwargs.values(), use_reentrant=False)


def _is_recomputed(module: nn.Module) -> bool:
    fwd = module.__dict__.get("forward")
    return isinstance(fwd, functools.partial) and fwd.func is _recomputed_forward


def _wrap(module: nn.Module) -> None:
    original = module.__dict__.get("forward")  # an instance-level forward someone installed before us, or None
    module.forward = functools.partial(_recomputed_forward, module, original)  # type: ignore[method-assign]


def _unwrap(module: nn.Module) -> None:
    original = module.__dict__["forward"].args[1]
    if original is None:
        del module.forward  # back to the class's forward
    else:
        module.forward = original  # type: ignore[method-assign]


def recomputed_modules(model: nn.Module) -> list[str]:
    """Names of the submodules of ``model`` whose forward :func:`recompute` checkpoints.

    >>> recomputed_modules(nn.Linear(2, 2))
    []
    """
    return [name for name, m in model.named_modules() if _is_recomputed(m)]


def unrecompute(model: nn.Module) -> list[str]:
    """Give every checkpointed submodule of ``model`` its own forward back; returns their names.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    >>> _ = recompute(m, [nn.Linear]); unrecompute(m), recomputed_modules(m)
    (['0', '1'], [])
    """
    names = []
    for name, m in model.named_modules():
        if _is_recomputed(m):
            _unwrap(m)
            names.append(name)
    return names


# ------------------------------------------------------------------------------------- choosing modules


def _resolve(model: nn.Module, modules: ModuleSpec | Sequence[ModuleSpec]) -> list[str]:
    """The names (model order, each module once) of what ``modules`` designates; clear errors otherwise."""
    specs = [modules] if isinstance(modules, (str, type, nn.Module)) else list(modules)
    if not specs:
        raise ValueError("modules is empty; pass block types (modules=(MyBlock,)), names (['blocks.0']) or 'auto'.")
    name_of = {}
    for name, m in model.named_modules():
        name_of.setdefault(id(m), name)
    chosen: set[str] = set()
    for spec in specs:
        if isinstance(spec, type):
            if not issubclass(spec, nn.Module):
                raise TypeError(f"modules takes nn.Module types, names or submodules; {spec.__name__} is not an nn.Module type.")
            hits = [name_of[id(m)] for m in model.modules() if isinstance(m, spec) and m is not model]
            if not hits:
                kinds = sorted({type(model.get_submodule(n)).__name__ for n in repeated_blocks(model)})
                hint = f" Its repeated blocks are of type {', '.join(kinds)}." if kinds else ""
                raise ValueError(f"the model has no {spec.__name__} submodule to recompute.{hint}")
            chosen.update(hits)
        elif isinstance(spec, str):
            try:
                m = model.get_submodule(spec)
            except AttributeError:
                close = difflib.get_close_matches(spec, [n for n in name_of.values() if n], n=3)
                hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
                raise ValueError(f"the model has no submodule {spec!r}{hint}; names are as in model.named_modules().") from None
            chosen.add(name_of[id(m)])
        elif isinstance(spec, nn.Module):
            if id(spec) not in name_of:
                raise ValueError(f"the {type(spec).__name__} passed in modules is not a submodule of this model.")
            chosen.add(name_of[id(spec)])
        else:
            raise TypeError(f"modules takes nn.Module types, names, submodules or 'auto', got {type(spec).__name__}.")
    if "" in chosen:
        raise ValueError(
            "recompute cannot checkpoint the model itself: the whole forward would run twice to save only the "
            "batch. Name its blocks instead (modules=(MyBlock,)), or let modules='auto' find them."
        )
    ordered = [n for n in name_of.values() if n in chosen]
    for outer in ordered:
        inner = next((n for n in ordered if n.startswith(outer + ".")), None)
        if inner is not None:
            raise ValueError(
                f"{outer!r} contains {inner!r}: checkpoint one or the other, not both (the outer one holds less "
                "for backward, the inner one recomputes less)."
            )
    return ordered


# ------------------------------------------------------------------------------------------ measuring


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

    def __enter__(self) -> "_Attribution":
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
            copies = stack.enter_context(FakeCopies(device))
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


# -------------------------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class RecomputeReport:
    """What :func:`recompute` checkpointed and the activations it measured before and after.

    Byte figures are None when no ``example_batch`` was given (nothing was measured).
    """

    modules: tuple[str, ...]
    """Names of the checkpointed submodules, in model order."""
    activations_before: int | None
    """Bytes held for backward between forward and backward without recomputation (batch and weights left out)."""
    activations_after: int | None
    """The same, measured with the chosen modules checkpointed."""
    peak_before: int | None
    """Most bytes live during forward and backward above the weights and batch (gradients included), before."""
    peak_after: int | None
    """The same with recomputation: backward rebuilds one block's activations at a time on top of what is held."""
    budget: int | None = None
    policy: str = "32-true"
    method: str | None = None
    """``fake`` (fake tensors, nothing allocated), ``real``, or None when nothing was measured."""
    savings: dict[str, int] = field(default_factory=dict)
    """``"auto"`` only: bytes each candidate block frees when checkpointed (from one attributed forward)."""
    _model: Any = field(default=None, repr=False, compare=False)

    @property
    def saved(self) -> int | None:
        """``activations_before - activations_after``."""
        if self.activations_before is None or self.activations_after is None:
            return None
        return self.activations_before - self.activations_after

    @property
    def ratio(self) -> float | None:
        """``activations_after / activations_before``."""
        if not self.activations_before or self.activations_after is None:
            return None
        return self.activations_after / self.activations_before

    @property
    def fits(self) -> bool | None:
        """Whether the measured activations are within ``budget`` (None without a budget or a measurement)."""
        if self.budget is None or self.activations_after is None:
            return None
        return self.activations_after <= self.budget

    def undo(self) -> list[str]:
        """Give the modules this call checkpointed their own forward back; returns their names."""
        model = self._model() if self._model is not None else None
        if model is None:
            return []
        undone = []
        for name in self.modules:
            m = model.get_submodule(name)
            if _is_recomputed(m):
                _unwrap(m)
                undone.append(name)
        return undone

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``saved`` and ``ratio`` included)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.startswith("_")}
        return {**d, "modules": list(self.modules), "saved": self.saved, "ratio": self.ratio}

    def __str__(self) -> str:
        shown = ", ".join(self.modules[:6]) + (f", ... ({len(self.modules)} in all)" if len(self.modules) > 6 else "")
        lines = [f"recompute: {len(self.modules)} module(s) checkpointed: {shown or 'none'}"]
        if self.activations_before is None:
            lines.append("  not measured: pass example_batch=(inputs, targets) to measure the activations")
        else:
            ratio = f" ({self.ratio:.2f}x)" if self.ratio is not None else ""
            budget = f", budget {fmt_bytes(self.budget)} ({'fits' if self.fits else 'does NOT fit'})" if self.budget is not None else ""
            lines.append(f"  activations held for backward: {fmt_bytes(self.activations_before)} -> {fmt_bytes(self.activations_after)}{ratio}{budget}")
            lines.append(f"  peak of forward + backward: {fmt_bytes(self.peak_before)} -> {fmt_bytes(self.peak_after)}")
            lines.append(f"  measured under {self.policy} on {self.method} tensors with the example batch")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------- recompute


def recompute(
    model: nn.Module,
    modules: ModuleSpec | Sequence[ModuleSpec] = "auto",
    *,
    budget: int | str | None = None,
    example_batch: Any = None,
    loss_fn: Callable[[Any, Any], torch.Tensor] = default_loss,
    policy: str | Policy = "32-true",
    fake: bool = True,
) -> RecomputeReport:
    """Checkpoint ``modules`` of ``model`` in place (non-reentrant ``torch.utils.checkpoint``) and report the saving.

    ``modules``: module types (every instance), names as in ``model.named_modules()``, submodules, or
    ``"auto"``: the repeated blocks of the model's ``nn.ModuleList`` / ``nn.Sequential`` containers, largest
    saving first, the fewest whose checkpointing brings the activations held for backward to at most
    ``budget`` (bytes, or a size such as ``"2GiB"``); every block that saves memory when ``budget`` is None.
    The forward of each module is replaced on the instance, so parameter names and ``state_dict`` keys do not
    change; :func:`unrecompute` or :meth:`RecomputeReport.undo` restores it.

    ``example_batch`` is ``(inputs, targets)`` or a dict of keyword arguments, as for
    :func:`ampkit.memory.estimate` (``model(*inputs)`` when inputs is a tuple, ``model(**batch)`` for a dict);
    ``"auto"`` and ``budget`` need it. With it, the activations are measured before and after under ``policy``
    with ``loss_fn(output, targets)`` (default: the output's ``.loss``, else cross-entropy), on fake tensors
    (nothing allocated; a meta model works), or on real tensors with ``fake=False`` (for ops without fake
    kernels). If the modules cannot
    bring the activations under ``budget``, ValueError says by how much and the model is left as it was.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"recompute() takes an nn.Module first, got {type(model).__name__}.")
    limit = parse_bytes(budget) if isinstance(budget, str) else budget
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"budget must be a positive number of bytes or a size like '2GiB', got {budget!r}.")
    resolved = get_policy(policy)  # an unknown name fails here, before any work
    auto = isinstance(modules, str) and modules == "auto"
    if example_batch is None and (auto or limit is not None):
        what = "modules='auto'" if auto else "budget=..."
        raise ValueError(
            f"recompute({what}) measures the activations, so it needs "
            "example_batch=(inputs, targets): one training batch (meta tensors are fine)."
        )
    already = recomputed_modules(model)
    if auto and already:
        raise ValueError(f"modules {already} are already recomputed; call ampkit.unrecompute(model) (or report.undo()) first.")

    def measure(blocks: Sequence[str] = ()) -> _Measured:
        return _measure(model, example_batch, loss_fn, resolved, fake, blocks)

    savings: dict[str, int] = {}
    if auto:
        candidates = repeated_blocks(model)
        if not candidates:
            raise ValueError(
                "modules='auto' found no repeated blocks (a module type with children, twice or more in an "
                "nn.ModuleList or nn.Sequential); name what to checkpoint: modules=(MyBlock,) or ['encoder.layer1', ...]."
            )
        before = measure(candidates)
        savings = before.savings
        order = sorted((n for n in candidates if savings[n] > 0), key=lambda n: -savings[n])  # stable: model order on ties
        if not order:
            raise ValueError(f"none of the blocks {candidates} frees memory when checkpointed; name other modules to recompute.")
        if limit is None:
            count = len(order)
        elif before.held <= limit:
            count = 0  # already within the budget: nothing to recompute
        else:
            count, predicted = 0, before.held
            while count < len(order) and predicted > limit:
                predicted -= savings[order[count]]
                count += 1
        chosen = order[:count]
    else:
        chosen = _resolve(model, modules)
        clash = [n for n in chosen if any(a == n or a.startswith(n + ".") or n.startswith(a + ".") for a in already)]
        if clash:
            raise ValueError(
                f"{clash} already recomputed, or inside / around modules that are ({already}); call "
                "ampkit.unrecompute(model) (or report.undo()) first."
            )
        before = measure() if example_batch is not None else None

    done: list[str] = []
    try:
        while True:
            for name in chosen:
                if name not in done:
                    _wrap(model.get_submodule(name))
                    done.append(name)
            after = measure() if example_batch is not None else None
            # The per-block savings come from one attributed forward; the measurement is what decides.
            if not auto or limit is None or after is None or after.held <= limit or len(chosen) == len(order):
                break
            chosen = order[: len(chosen) + 1]
        if limit is not None and after is not None and before is not None and after.held > limit:
            what = f"checkpointing all {len(chosen)} blocks" if auto else f"checkpointing {len(chosen)} module(s)"
            raise ValueError(
                f"activations of {fmt_bytes(after.held)} even with {what} (from {fmt_bytes(before.held)}) exceed the budget of "
                f"{fmt_bytes(limit)} by {fmt_bytes(after.held - limit)}; use a smaller batch, a 16-bit policy (policy='bf16-mixed' "
                "stores most activations in half the bytes) or more/larger modules. The model is unchanged."
            )
    except BaseException:
        for name in done:
            _unwrap(model.get_submodule(name))
        raise

    order_in_model = [n for n, _ in model.named_modules() if n in set(done)]
    return RecomputeReport(
        modules=tuple(order_in_model),
        activations_before=before.held if before is not None else None,
        activations_after=after.held if after is not None else None,
        peak_before=before.peak if before is not None else None,
        peak_after=after.peak if after is not None else None,
        budget=limit,
        policy=resolved.name,
        method=("fake" if fake else "real") if example_batch is not None else None,
        savings=savings,
        _model=weakref.ref(model),
    )
