"""Activation recomputation (gradient checkpointing) of chosen blocks, with the memory it saves measured.

:func:`recompute` makes chosen submodules run their forward under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: the forward keeps only each block's inputs, and
backward runs the block again to get back what it needs. Dropout draws the same mask again (the RNG state is
stashed and restored), autocast is restored as it was, and BatchNorm's running statistics are not updated a
second time. ``modules`` names the blocks (types, names or module objects), or ``"auto"`` picks the repeated
blocks of the model's ``nn.ModuleList`` / ``nn.Sequential`` containers, the fewest that bring the activations
under ``budget``. With an ``example_batch`` the activations held for backward are measured before and after,
on fake tensors (:class:`~ampkit.memory._fake.FakeCopies`: nothing allocated) unless ``fake=False``.

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
:class:`~ampkit.memory.LiveBytes`, not by a saved-tensor hook such as
:class:`~ampkit.memory.SavedActivations`: checkpoint installs saved-tensor hooks of its own, and hooks
nest innermost-wins, so an outer hook only sees what checkpoint happens to save outside its own (its inputs, in
torch 2.13), never tensors held in a closure or on a module. Live bytes count whatever holds them. Left out: the
CPU RNG state each checkpoint stashes for dropout (about 5 KB of host memory per block, made outside dispatch).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .._util.blocks import repeated_blocks
from .._util.model_io import default_loss
from .._util.units import fmt_bytes, parse_bytes
from ..policy import Policy, get_policy
from ._recompute_measure import _measure, _Measured
from ._recompute_report import RecomputeReport
from ._recompute_select import ModuleSpec, _resolve

# _recomputed_forward stays importable here: models pickled while wrapped name it by this module's path.
from ._recompute_wrap import _is_recomputed, _recomputed_forward, _unwrap, _wrap  # noqa: F401

__all__ = ["RecomputeReport", "recompute", "recomputed_modules", "unrecompute"]


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