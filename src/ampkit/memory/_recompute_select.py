"""Which submodules :func:`~ampkit.memory.recompute` checkpoints, from the types, names or modules given.

Each way of naming a module that cannot be checkpointed fails here, with an error that names what to pass.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from torch import nn

from .._util.blocks import repeated_blocks

__all__: list[str] = []  # private helpers of ampkit.memory.recompute

ModuleSpec = str | type | nn.Module
"""A module name (as in ``model.named_modules()``), a module type (every instance), or a submodule itself."""


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
