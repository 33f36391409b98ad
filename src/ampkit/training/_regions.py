"""The regions ``compile="regional"`` compiles: the repeated blocks, grouped by shape, one compile per group.

Dynamo specializes a compiled call on what it reads: the shapes and dtypes of the block's weights and inputs, the
settings of its layers (a conv's stride, a dropout's p), its structure. Blocks that agree on all of it run one
compiled graph; a block that differs fails the graph's guards and is compiled again. Compiled through one shared
code object, as torch's ``block.compile()`` on each block does, blocks of different shapes (a ResNet's stages)
recompile that code once per shape: each call then checks every earlier graph's guards first, and past
``torch._dynamo.config.recompile_limit`` (8) graphs the code runs eagerly for good, silently. So each group of
blocks of one shape gets a code object of its own (see :func:`ampkit._compat.compile_template`): it compiles
once and never recompiles for a block of another shape.

    >>> from torch import nn
    >>> net = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
    ...                     nn.Sequential(nn.Linear(4, 8), nn.ReLU()))
    >>> shape_groups(net, ["0", "1", "2"])
    [['0', '1'], ['2']]
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

import torch
from torch import nn

__all__ = ["block_shape", "lone_blocks_reason", "shape_groups"]

_SETTING_TYPES = (bool, int, float, str, type(None), tuple, torch.dtype, torch.device)


def _settings(module: nn.Module) -> tuple[tuple[str, str], ...]:
    # A torch layer's settings are plain attributes (Conv2d's stride and padding, Dropout's p, LayerNorm's eps)
    # that its forward reads: dynamo guards on their values. A user's module may hold attributes its forward never
    # reads in training (transformers' layer_idx, read only with a KV cache): dynamo does not guard on those, and
    # counting them would split identical layers into a compile each. Underscored attributes are torch's
    # bookkeeping (parameters, buffers, hooks), compared through the tensors below.
    if not type(module).__module__.startswith("torch.nn."):
        return ()
    return tuple(sorted((k, repr(v)) for k, v in vars(module).items() if not k.startswith("_") and isinstance(v, _SETTING_TYPES)))


def block_shape(block: nn.Module) -> Hashable:
    """What a block's compiled graph is specialized on, as far as the module shows before it runs: its layers
    (name, class, and torch layers' settings) and its weights and buffers (name, class, shape, dtype, device,
    requires_grad).

    Blocks of equal shape run one compiled graph given inputs of one shape. The inputs are known only when the
    block runs, and what a user's forward reads only when it is traced: blocks of equal shape still recompile
    their group's code when called on inputs of different shapes (once: dynamo then compiles the dimension that
    changed as dynamic, unless ``dynamic=False``) or when their forward branches on an attribute of theirs that
    differs (once per value).

    >>> block_shape(nn.Linear(4, 4)) == block_shape(nn.Linear(4, 4)), block_shape(nn.Linear(4, 4)) == block_shape(nn.Linear(4, 8))
    (True, False)
    """
    layers = tuple((name, type(m), _settings(m)) for name, m in block.named_modules())
    tensors = tuple(
        (name, type(t), tuple(t.shape), t.dtype, t.device, t.requires_grad)
        for name, t in itertools.chain(block.named_parameters(), block.named_buffers())
    )
    return layers, tensors


def shape_groups(model: nn.Module, names: Sequence[str]) -> list[list[str]]:
    """The blocks ``names`` of ``model`` grouped by :func:`block_shape`, each group in model order, the groups in
    the order of their first block (see the module's example)."""
    groups: dict[Hashable, list[str]] = {}
    for name in names:
        groups.setdefault(block_shape(model.get_submodule(name)), []).append(name)
    return list(groups.values())


def lone_blocks_reason(model_name: str, groups: Sequence[Sequence[str]]) -> str | None:
    """Why regional compilation saves ``model_name`` little compile time, naming the blocks that share a shape
    with no other block (each compiles on its own); None when every block shares its shape with another.

    >>> print(lone_blocks_reason("Net", [["0", "1"], ["2"]]))  # doctest: +NORMALIZE_WHITESPACE
    compile='regional': block 2 of Net has a shape no other block has (layers, settings, weight shapes), so it
    compiles on its own: 2 compiles for 3 blocks (compile=True: one, of the whole model). Only blocks of one
    shape share a compile (0 with 1).
    """
    lone = [g[0] for g in groups if len(g) == 1]
    if not lone:
        return None
    blocks = sum(len(g) for g in groups)
    shared = [g for g in groups if len(g) > 1]
    which = f"block {lone[0]}" if len(lone) == 1 else "blocks " + ", ".join(lone)
    verb = "has" if len(lone) == 1 else "each have"
    pronoun = "it compiles" if len(lone) == 1 else "each compiles"
    sharing = (
        "Only blocks of one shape share a compile (" + "; ".join(f"{g[0]} with {', '.join(g[1:])}" for g in shared) + ")."
        if shared else "No two blocks share a compile."
    )
    return (
        f"compile='regional': {which} of {model_name} {verb} a shape no other block has (layers, settings, weight "
        f"shapes), so {pronoun} on its own: {len(groups)} compiles for {blocks} blocks (compile=True: one, of the "
        f"whole model). {sharing}"
    )
