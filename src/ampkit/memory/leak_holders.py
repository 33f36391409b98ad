"""What keeps memory alive when a training loop's memory grows: found in the garbage collector, and named.

Given the growth a :class:`~ampkit.memory.tracker.MemoryTracker` saw, :class:`HolderSearch` looks for the usual
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

import bisect
import gc
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

from .._compat import autograd_sequence_nr, node_sequence_nr
from .._util.units import fmt_bytes
from .accounting import tensor_bytes

__all__ = ["Growth", "HolderSearch", "Snapshot", "StepBoundaries"]

_GRAPH_NODES_CAP = 20_000
"""Nodes walked per graph when sizing it; a graph past this is reported as "at least" this many."""

_GRAPH_NODES_BUDGET = 200_000
"""Nodes walked over all graphs in one search, so that a search costs a bounded time however much leaked."""

_NO_SEQUENCE = 2**63
"""Sequence numbers at or above this mean none (AccumulateGrad nodes carry UINT64_MAX)."""

_CONTAINERS = (list, dict, deque)


@dataclass(slots=True)
class Growth:
    """Growth the tracker saw: what the search sets out to explain."""

    kind: str  # "tensors", "heap" or "graph"
    step: int
    detail: str
    """The finding in words; the search's message starts with it."""


@dataclass
class Snapshot:
    """Taken when growth is first seen; the next look compares against it to see what grew."""

    step: int
    containers: dict[int, tuple[type, int]]
    locals: dict[str, int]


# Autograd numbers the nodes it creates, per thread, in creation order. The number at each step boundary
# dates any node found alive later: a graph reaching back past the previous step was kept across steps,
# whereas the current loss's graph (still referenced by the loop's `loss` variable) is this step's own.
_sequence_nr = autograd_sequence_nr


class StepBoundaries:
    """Autograd's sequence number after each step, from the start of tracking: what dates the graph nodes a search
    finds alive. Empty where this torch does not expose the numbers (no graph is then dated)."""

    def __init__(self, keep: int) -> None:
        self.seqs: list[int] = []
        self.steps: list[int] = []
        self._keep = keep

    def start(self, step: int) -> None:
        """Tracking begins after ``step`` (0 unless steps were taken before)."""
        seq = _sequence_nr()
        if seq is not None:
            self.seqs, self.steps = [seq], [step]

    def record(self, step: int) -> None:
        """``step`` has just ended; ignored before :meth:`start`."""
        seq = _sequence_nr()
        if seq is not None and self.seqs:
            self.seqs.append(seq)
            self.steps.append(step)
            if len(self.seqs) > 2 * self._keep:  # bounded, like the samples
                del self.seqs[: self._keep], self.steps[: self._keep]

    def since(self, seq: int | None) -> str:
        """When the node numbered ``seq`` was created, as "since step k"."""
        i = bisect.bisect_right(self.seqs, seq) if seq is not None else 0
        if i > 0:
            return f"since step {self.steps[i - 1] + 1}"
        first = self.steps[0] if self.steps else 0
        return f"since before step {first + 1}" if first > 0 else "since before tracking began"


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
            old, containers, _ = self._scan(None)
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
            old, _, grown = self._scan(before)
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

    def _scan(
        self, before: Snapshot | None
    ) -> tuple[list[tuple[torch.Tensor, _Graph]], dict[int, tuple[type, int]], list[tuple[Any, int]]]:
        """One pass over the garbage collector's objects: tensors whose graph reaches back before the previous
        step; the lists, deques and dicts whose newest item holds a tensor (id -> (type, length)); and, given a
        snapshot, those of them that grew since it, with by how much."""
        # This step's `loss` (and a `prev_loss` kept for one step) hold graphs too, but not a leak: only nodes
        # created before the step before this one were kept across steps. And a graph none of whose nodes were
        # made while tracking is an old leftover, not what grows now.
        threshold = self.boundaries.seqs[-3] if len(self.boundaries.seqs) >= 3 else None
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
            if graph.oldest is not None and graph.newest is not None and graph.oldest < threshold and graph.newest >= self.boundaries.seqs[0]:
                old.append((t, graph))
        return old, containers, grown

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


# ---------------------------------------------------------------------------------------------- graphs and names
@dataclass(slots=True)
class _Graph:
    nodes: int
    oldest: int | None
    """Smallest sequence number among the nodes walked (when the node was created); None if unknown."""
    newest: int | None
    capped: bool


def _walk(fn: Any, cap: int) -> _Graph:
    """Count the nodes of the autograd graph under ``fn`` (up to ``cap``) and find its oldest and newest nodes."""
    seen = {id(fn): fn}  # the node objects are kept in here, so that their ids stay theirs during the walk
    stack, oldest, newest = [fn], None, None
    while stack and len(seen) < cap:
        node = stack.pop()
        seq = node_sequence_nr(node)
        if seq is not None and seq < _NO_SEQUENCE:
            oldest = seq if oldest is None else min(oldest, seq)
            newest = seq if newest is None else max(newest, seq)
        for nxt, _ in node.next_functions:
            if nxt is not None and id(nxt) not in seen:
                seen[id(nxt)] = nxt
                stack.append(nxt)
    return _Graph(len(seen), oldest, newest, bool(stack))


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



def _describe(t: torch.Tensor) -> str:
    shape = "0-dim" if t.dim() == 0 else "x".join(str(s) for s in t.shape)
    grad_fn = f", grad_fn={t.grad_fn.name()}" if t.grad_fn is not None else ""
    return f"{shape} {str(t.dtype).removeprefix('torch.')} tensor{grad_fn}"


class _Namer:
    """Names by which the user knows an object: a variable of the calling frames, a module global, an attribute
    of an object (``Trainer.total``), or a key of a named dict (``metrics['loss']``)."""

    _FRAMES = 64

    def __init__(self, frame: FrameType | None) -> None:
        self.frames: list[FrameType] = []
        while frame is not None and len(self.frames) < self._FRAMES:
            self.frames.append(frame)
            frame = frame.f_back

    def close(self) -> None:
        self.frames.clear()  # frames refer to everything: drop them as soon as the search is over

    def _scopes(self) -> Iterator[tuple[Any, str]]:
        for f in self.frames:
            name = f.f_code.co_name
            yield f.f_locals, "" if name.startswith("<") else f" in {name}()"
            yield f.f_globals, ""

    def names(self, objs: Sequence[Any], depth: int = 1) -> dict[int, str]:
        ids = {id(o) for o in objs}
        found: dict[int, str] = {}
        # The loop's own frames first: that is where `total` and `outputs` usually live.
        scanned: set[int] = set()
        for scope, where in self._scopes():
            if id(scope) in scanned:
                continue
            scanned.add(id(scope))
            for name, value in list(scope.items()):
                if id(value) in ids and id(value) not in found and isinstance(name, str) and not name.startswith("__"):
                    found[id(value)] = f"`{name}`{where}"
        rest = [o for o in objs if id(o) not in found]
        if not rest:
            return found
        # Then the dicts that refer to them: module globals, instance attributes, items of a named dict.
        rest_ids = {id(o) for o in rest}
        modules = {id(vars(m)): name for name, m in list(sys.modules.items()) if m is not None and hasattr(m, "__dict__")}
        keyed: list[tuple[dict[Any, Any], Any, Any]] = []
        for r in gc.get_referrers(*rest):
            if not isinstance(r, dict):
                # Python 3.11+ keeps an object's attributes inline, without a __dict__ object until asked for one:
                # the referrer is then the object itself.
                attrs = _attributes(r)
                for key, value in attrs.items():
                    if id(value) in rest_ids and isinstance(key, str):
                        found.setdefault(id(value), f"`{type(r).__name__}.{key}`")
                continue
            if id(r) in scanned:
                continue
            for key, value in list(r.items()):
                if id(value) not in rest_ids:
                    continue
                if id(r) in modules:
                    found.setdefault(id(value), f"`{modules[id(r)]}.{key}`")
                else:
                    keyed.append((r, key, value))
        if not keyed:
            return found
        owners: dict[int, str | None] = {id(d): None for d, _, _ in keyed}
        for owner in gc.get_referrers(*[d for d, _, _ in keyed]):
            d = _attributes(owner)
            if id(d) in owners and owners[id(d)] is None:
                owners[id(d)] = type(owner).__name__
        plain = [d for d, _, _ in keyed if owners[id(d)] is None]
        dict_names = self.names(plain, depth - 1) if plain and depth > 0 else {}
        for d, key, value in keyed:
            if owners[id(d)] is not None and isinstance(key, str):
                found.setdefault(id(value), f"`{owners[id(d)]}.{key}`")
            elif id(d) in dict_names:
                name = dict_names[id(d)]
                tick = name.index("`", 1)  # metrics['loss'] in train(): the key goes inside the backticks
                found.setdefault(id(value), f"{name[:tick]}[{key!r}]{name[tick:]}")
        return found

    def containers_of(self, objs: list[Any], ours: Sequence[Any] = ()) -> dict[int, Any]:
        """The list, deque or dict holding each of ``objs`` (through a tuple, as in ``history.append((out, y))``).

        ``ours``: the caller's own lists and tuples that refer to ``objs``, not to be taken for the user's.
        """
        ids = {id(o) for o in objs}
        skip = {id(objs), *(id(o) for o in ours), *(id(scope) for scope, _ in self._scopes())}
        out: dict[int, Any] = {}
        tuples: list[tuple[Any, ...]] = []
        for r in gc.get_referrers(*objs):
            if id(r) in skip:
                continue
            if isinstance(r, tuple) and not (len(r) == len(objs) and all(a is b for a, b in zip(r, objs))):
                tuples.append(r)
            elif isinstance(r, _CONTAINERS):
                for v in r.values() if isinstance(r, dict) else r:
                    if id(v) in ids:
                        out.setdefault(id(v), r)
        if tuples:
            by_tuple = {id(t): t for t in tuples}
            for c in gc.get_referrers(*tuples):
                if isinstance(c, _CONTAINERS) and id(c) not in skip and c is not tuples:
                    for item in c.values() if isinstance(c, dict) else c:
                        if id(item) in by_tuple:
                            for v in by_tuple[id(item)]:
                                if id(v) in ids:
                                    out.setdefault(id(v), c)
        return out

    def local_tensors(self) -> dict[str, int]:
        """Bytes of the tensors the calling frames' variables hold, by name (to catch one grown by torch.cat)."""
        out: dict[str, int] = {}
        for f in self.frames[:8]:
            for name, value in list(f.f_locals.items()):
                if isinstance(value, torch.Tensor) and isinstance(name, str):
                    out.setdefault(f"`{name}` in {f.f_code.co_name}()", tensor_bytes([value]))
        return out


def _attributes(obj: Any) -> dict[str, Any]:
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - any object may turn up; one without a __dict__ has no attributes to name
        return {}
    return attrs if isinstance(attrs, dict) else {}



def _top_sequence(t: torch.Tensor) -> int:
    seq = node_sequence_nr(t.grad_fn)
    return _NO_SEQUENCE if seq is None else seq
