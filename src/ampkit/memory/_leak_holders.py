"""What keeps memory alive when a training loop's memory grows: found in the garbage collector, and named.

Given the growth a :class:`~ampkit.memory.MemoryTracker` saw, :class:`HolderSearch` looks for the usual
holders and names them the way the user knows them (a variable of the loop, a module global, ``Trainer.total``,
``metrics['loss']``):

- a tensor that keeps the autograd graph of past steps alive (``total += loss``, or outputs appended to a list),
  dated by autograd's sequence numbers against the step boundaries the tracker recorded;
- a list, deque or dict that gains a tensor each step;
- a tensor grown by ``torch.cat`` each step.

Graphs kept across steps show in one look (:meth:`HolderSearch.first_look`). What else grows needs two: the first
takes a :class:`Snapshot` and the second (:meth:`HolderSearch.diagnose`, at a later step that grows) compares
against it. Each look walks every object the garbage collector tracks, and autograd graphs up to a node budget:
tens of milliseconds to a second. That is why the tracker runs a search only once growth has been seen, and
never in the per-step path.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

from .._util.units import fmt_bytes
from ._accounting import tensor_bytes
from ._leak_graphs import StepBoundaries, _describe, _Graph
from ._leak_names import _Namer
from ._leak_scan import Snapshot, _scan

__all__ = ["Growth", "HolderSearch", "Snapshot", "StepBoundaries"]


@dataclass(slots=True)
class Growth:
    """Growth the tracker saw: what the search sets out to explain."""

    kind: str  # "tensors", "heap" or "graph"
    step: int
    detail: str
    """The finding in words; the search's message starts with it."""



class HolderSearch:
    """Looks for what holds the memory that grew, dating the graphs it finds by the tracker's step ``boundaries``.

    ``frame`` (in both looks): the training loop's frame, where naming starts; its callers are searched too.
    """

    def __init__(self, boundaries: StepBoundaries) -> None:
        self.boundaries = boundaries

    def first_look(self, frame: FrameType, growth: Growth, step: int) -> Snapshot | str:
        """Tensors keeping graphs of past steps are found in one look (the message naming them is returned);
        what else grows needs a second, against the :class:`Snapshot` returned instead."""
        namer = _Namer(frame)
        try:
            old, containers, _ = _scan(self.boundaries, None)
            lines, named = self._graph_holders(old, namer, growth)
            if named:
                return f"{growth.detail}. Likely cause: " + "; ".join(lines)
            return Snapshot(step, containers, namer.local_tensors())
        finally:
            namer.close()

    def diagnose(self, frame: FrameType, growth: Growth, before: Snapshot, *, tensors_measured: bool) -> str:
        """The second look: what grew since the snapshot ``before``, or else the numbers alone.

        ``tensors_measured``: whether live tensor bytes were measured (for the message when only the heap grew).
        """
        namer = _Namer(frame)
        try:
            old, _, grown = _scan(self.boundaries, before)
            lines, named = self._graph_holders(old, namer, growth)
            names = namer.names([o for o, _ in grown]) if grown else {}
            if not named and any(id(o) in names for o, _ in grown):
                lines = []  # a named list that grows says more than a tensor no variable holds
            for o, more in sorted(grown, key=lambda g: -g[1]):
                if id(o) in names and len(lines) < 3:
                    items = o.values() if isinstance(o, dict) else o
                    held = tensor_bytes(v for item in items for v in (item if isinstance(item, (tuple, list)) else [item]))
                    lines.append(
                        f"{names[id(o)]} ({type(o).__name__}) gained {more} tensor item(s) since step {before.step} and holds "
                        f"{len(o)} ({fmt_bytes(held)} of tensors): keep `.item()` values, or bound it (collections.deque(maxlen=...))"
                    )
            if not lines:
                now = namer.local_tensors()
                for name, size in now.items():
                    if size > before.locals.get(name, size):
                        lines.append(
                            f"{name} grew from {fmt_bytes(before.locals[name])} to {fmt_bytes(size)} since step {before.step} "
                            "(torch.cat onto it each step?): append to a list and concatenate once, or keep running sums"
                        )
        finally:
            namer.close()
        if lines:
            return f"{growth.detail}. Likely cause: " + "; ".join(lines)
        if growth.kind == "heap" and tensors_measured:
            return (
                f"{growth.detail}. Tensor memory is flat, so the growth is outside tensor storages (Python objects, "
                "autograd graph nodes, caches, a data pipeline's buffers); no tensor keeping the graph of past steps and "
                "no growing list or dict of tensors was found."
            )
        return (
            f"{growth.detail}. No tensor keeping the autograd graph of past steps and no growing list or dict of "
            "tensors was found among variables and attributes: look for tensors cached across steps."
        )

    def _graph_holders(self, old: list[tuple[torch.Tensor, _Graph]], namer: _Namer, growth: Growth) -> tuple[list[str], bool]:
        """One line per holder of old graphs (at most three): a variable or attribute, or the list they are in;
        and whether any was named."""
        if not old:
            return [], False
        names = namer.names([t for t, _ in old])
        holders = namer.containers_of([t for t, _ in old if id(t) not in names], ours=[old, *old])
        holder_names = namer.names(list({id(c): c for c in holders.values()}.values())) if holders else {}
        groups: dict[int, tuple[str | None, Any, list[tuple[torch.Tensor, _Graph]]]] = {}
        for t, graph in old:
            container = holders.get(id(t))
            if id(t) in names:
                key, label, container = id(t), names[id(t)], None
            elif container is not None and id(container) in holder_names:
                key, label = id(container), holder_names[id(container)]
            else:
                key, label, container = id(t), None, None
            groups.setdefault(key, (label, container, []))[2].append((t, graph))
        named = [g for g in groups.values() if g[0] is not None]
        # Tensors no variable names are mostly the inputs a named graph saved for backward (autograd keeps their
        # Python objects alive): they repeat the named finding. Alone, the largest of them is the finding.
        ranked = sorted(named, key=lambda g: -sum(gr.nodes for _, gr in g[2]))[:3] or [
            max(groups.values(), key=lambda g: g[2][0][1].nodes)
        ]
        lines = []
        for label, container, members in ranked:
            t, graph = max(members, key=lambda m: m[1].nodes)
            since = self.boundaries.since(min((g.oldest for _, g in members if g.oldest is not None), default=None))
            nodes = f"{'at least ' if graph.capped else ''}{graph.nodes:,} nodes"
            if label is None:
                lines.append(
                    f"a tensor ({_describe(t)}) held by no variable or attribute (from inside another graph, or from C++) keeps the "
                    f"autograd graph of past steps alive ({since}, {nodes})"
                )
            elif container is not None:
                lines.append(
                    f"{label} ({type(container).__name__} of {len(container)}) holds {len(members)} tensor(s) that keep their "
                    f"autograd graphs ({since}; {nodes} in the largest): store `out.detach()` (or `.item()` of a scalar) instead"
                )
            elif t.dim() == 0:
                lines.append(
                    f"{label} ({_describe(t)}) keeps the autograd graph of every step {since} alive ({nodes}): "
                    "accumulate `loss.item()` or `loss.detach()` instead"
                    # A scalar is 4 bytes: tensor memory growing beside it is what its graph saved for a backward
                    # that never ran, as in an evaluation loop with gradients on.
                    + ("; tensor memory grows too, so the graph also keeps its saved activations: if no backward runs "
                       "through it, compute it under `torch.no_grad()`" if growth.kind == "tensors" else "")
                )
            else:
                lines.append(
                    f"{label} ({_describe(t)}) keeps the autograd graph of past steps alive ({since}, {nodes}): keep "
                    "`.detach()` of it instead, or compute it under `torch.no_grad()` if no backward goes through it"
                )
        return lines, bool(named)
