"""The repeated blocks of a model: the unit that activation recompute checkpoints and FSDP shards.

A transformer's layers, a ResNet's residual blocks: children of an ``nn.ModuleList`` / ``nn.Sequential``
whose type occurs there twice or more. Both features want the same granularity, one block at a time, so
they find blocks the same way.

    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    >>> repeated_blocks(net)
    ['1', '2']
"""

from __future__ import annotations

from collections import Counter

from torch import nn

__all__ = ["repeated_blocks"]


def repeated_blocks(model: nn.Module) -> list[str]:
    """Names of the repeated blocks of ``model``, in model order.

    A block is a child of an ``nn.ModuleList`` / ``nn.Sequential`` whose type occurs there twice or more and
    that has children of its own (a lone Linear is no block). Only the innermost level is kept when such blocks
    nest: that is the unit users mean by a block (a transformer layer, a residual block).
    """
    found: list[str] = []
    seen: set[int] = set()
    for prefix, container in model.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(container.named_children())
        counts = Counter(type(c) for _, c in children)
        for name, child in children:
            if counts[type(child)] >= 2 and next(child.children(), None) is not None and id(child) not in seen:
                seen.add(id(child))  # one module listed twice (shared weights) is one block
                found.append(f"{prefix}.{name}" if prefix else name)
    return [n for n in found if not any(o.startswith(n + ".") for o in found)]
