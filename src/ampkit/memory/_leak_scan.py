"""The holder search's walk over the garbage collector's objects: old autograd graphs and growing containers.

One pass finds the tensors whose autograd graph reaches back before the previous step, and the lists, deques
and dicts whose newest item holds a tensor; against a :class:`Snapshot` of the latter taken at an earlier step,
it also finds those that grew. The walk costs tens of milliseconds to a second: it runs only once growth has
been seen.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch

from ._leak_graphs import _GRAPH_NODES_BUDGET, _GRAPH_NODES_CAP, StepBoundaries, _Graph, _top_sequence, _walk
from ._leak_names import _CONTAINERS

__all__ = ["Snapshot"]


@dataclass
class Snapshot:
    """Taken when growth is first seen; the next look compares against it to see what grew."""

    step: int
    containers: dict[int, tuple[type, int]]
    locals: dict[str, int]


def _scan(
    boundaries: StepBoundaries, before: Snapshot | None
) -> tuple[list[tuple[torch.Tensor, _Graph]], dict[int, tuple[type, int]], list[tuple[Any, int]]]:
    """One pass over the garbage collector's objects: tensors whose graph reaches back before the previous
    step; the lists, deques and dicts whose newest item holds a tensor (id -> (type, length)); and, given a
    snapshot, those of them that grew since it, with by how much."""
    # This step's `loss` (and a `prev_loss` kept for one step) hold graphs too, but not a leak: only nodes
    # created before the step before this one were kept across steps. And a graph none of whose nodes were
    # made while tracking is an old leftover, not what grows now.
    threshold = boundaries.seqs[-3] if len(boundaries.seqs) >= 3 else None
    gc.collect()  # garbage awaiting collection (cycles) is not what holds memory
    graphs: list[torch.Tensor] = []
    containers: dict[int, tuple[type, int]] = {}
    grown: list[tuple[Any, int]] = []
    objs = gc.get_objects()
    try:
        for o in objs:
            kind = type(o)
            try:
                if issubclass(kind, torch.Tensor):
                    if o.grad_fn is not None:
                        graphs.append(o)
                elif issubclass(kind, _CONTAINERS) and len(o) and _holds_tensor(_newest(o)):
                    containers[id(o)] = (kind, len(o))
                    was = before.containers.get(id(o)) if before is not None else None
                    if was is not None and was[0] is kind and len(o) > was[1]:
                        grown.append((o, len(o) - was[1]))
            except Exception:  # noqa: BLE001, S112 - an exotic object that will not say what it is: not ours to judge
                continue
    finally:
        del objs
    old: list[tuple[torch.Tensor, _Graph]] = []
    if threshold is None:
        return old, containers, grown
    graphs.sort(key=_top_sequence)  # oldest tops first: the bounded walk reaches the likeliest culprits
    budget = _GRAPH_NODES_BUDGET
    for t in graphs:
        if budget <= 0:
            break
        graph = _walk(t.grad_fn, min(_GRAPH_NODES_CAP, budget))
        budget -= graph.nodes
        if graph.oldest is not None and graph.newest is not None and graph.oldest < threshold and graph.newest >= boundaries.seqs[0]:
            old.append((t, graph))
    return old, containers, grown


def _newest(container: Any) -> Any:
    """The item added last to a list, deque or dict (its value): where a growing container grows."""
    try:
        return container[-1] if not isinstance(container, dict) else next(reversed(container.values()))
    except (IndexError, StopIteration, TypeError, KeyError):
        return None


def _holds_tensor(item: Any) -> bool:
    if isinstance(item, torch.Tensor):
        return True
    if isinstance(item, (tuple, list)):
        return any(isinstance(v, torch.Tensor) for v in item[:8])
    if isinstance(item, dict):
        return any(isinstance(v, torch.Tensor) for v in list(item.values())[:8])
    return False

