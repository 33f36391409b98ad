"""Autograd graphs found alive by the holder search: dated by step, walked and described.

Autograd numbers the nodes it creates; :class:`StepBoundaries` records the number at each step boundary, so
that a node found alive later says since which step its graph has been kept. :func:`_walk` sizes one graph
within a node budget, so that a search costs a bounded time however much leaked.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch

from .._compat import autograd_sequence_nr, node_sequence_nr

__all__ = ["StepBoundaries"]

_GRAPH_NODES_CAP = 20_000
"""Nodes walked per graph when sizing it; a graph past this is reported as "at least" this many."""

_GRAPH_NODES_BUDGET = 200_000
"""Nodes walked over all graphs in one search, so that a search costs a bounded time however much leaked."""

_NO_SEQUENCE = 2**63
"""Sequence numbers at or above this mean none (AccumulateGrad nodes carry UINT64_MAX)."""


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


def _describe(t: torch.Tensor) -> str:
    shape = "0-dim" if t.dim() == 0 else "x".join(str(s) for s in t.shape)
    grad_fn = f", grad_fn={t.grad_fn.name()}" if t.grad_fn is not None else ""
    return f"{shape} {str(t.dtype).removeprefix('torch.')} tensor{grad_fn}"


def _top_sequence(t: torch.Tensor) -> int:
    seq = node_sequence_nr(t.grad_fn)
    return _NO_SEQUENCE if seq is None else seq
