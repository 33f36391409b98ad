"""Sharded data parallelism with torch's FSDP2 (``fully_shard``), its mixed precision derived from the ampkit policy.

FSDP2 shards every parameter over the ranks and all-gathers a block's parameters just before the block runs.
Its ``MixedPrecisionPolicy`` says in which dtype that gather happens (``param_dtype``) and in which dtype the
ranks' gradients are summed (``reduce_dtype``). Each ampkit policy maps onto it so that the sharded run
computes what the single-device run computes:

=====================  ==================================  ==========================================================
ampkit policy          stored shards                       ``MixedPrecisionPolicy``
=====================  ==================================  ==========================================================
``32-true``, ``tf32``  fp32                                default: gathered and reduced in fp32
``*-mixed``            fp32                                default; autocast picks each op's dtype, as on one device
                                                           (gathering in 16 bits would also turn embeddings, biases
                                                           and the residual stream 16-bit, which autocast does not)
``*-true``             16-bit                              ``reduce_dtype=float32``: gradients summed in fp32
``*-true-masters``     **fp32: the shards are the masters** ``param_dtype`` 16-bit, ``reduce_dtype=float32``; norm
                                                           layers and ``keep_fp32`` modules are units of their own
                                                           gathered in fp32; inputs cast to 16 bits, outputs to fp32
=====================  ==================================  ==========================================================

So ``*-true-masters`` needs no separate master copy under FSDP: the optimizer steps the fp32 shards, and each
step's gather produces the 16-bit weights, which saves a 16-bit copy of the model per rank.

    >>> import ampkit
    >>> mixed_precision_policy(ampkit.get_policy("O2"))
    MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32, output_dtype=None, cast_forward_inputs=True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .._compat import FSDPModule, MixedPrecisionPolicy, fully_shard
from .._util.blocks import repeated_blocks
from ..policy import Policy

__all__ = ["FSDPModule", "fsdp_models", "mixed_precision_policy", "set_gradient_sync", "shard_model"]

_FP32_UNIT = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)


def mixed_precision_policy(policy: Policy) -> MixedPrecisionPolicy:
    """FSDP2's mixed precision for ``policy``'s 16-bit part (see the table above): the policy's own
    :meth:`~ampkit.policy.Policy.fsdp_mixed_precision`; fp32 units use their own."""
    return policy.fsdp_mixed_precision()


def fsdp_models(models: Sequence[nn.Module]) -> list[nn.Module]:
    """The models among ``models`` that ``fully_shard`` has sharded."""
    return [m for m in models if isinstance(m, FSDPModule)]


def set_gradient_sync(models: Sequence[nn.Module], sync: bool) -> None:
    """Whether the coming backward reduce-scatters gradients (False: accumulate them unsharded, locally)."""
    for m in fsdp_models(models):
        m.set_requires_gradient_sync(sync)  # type: ignore[operator]


def shard_model(
    model: nn.Module,
    policy: Policy,
    device: torch.device,
    *,
    blocks: Sequence[str] | None = None,
    reshard_after_forward: bool = True,
    mesh: Any = None,
) -> list[str]:
    """Apply ``policy`` to ``model`` and shard it in place: fp32 islands, then each block, then the root.

    ``blocks`` are module names sharded as units of their own (default: the repeated blocks, a transformer's
    layers). Returns the names of the units below the root. Parameters are replaced by sharded ones, so an
    optimizer must be built (or rebuilt) afterwards.
    """
    policy = policy.sharded()  # fp8-tensorwise: weights all-gathered in fp8
    if mesh is None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # The policy's casts before sharding (16-bit storage for *-true, fp32 islands for keep_fp32; for master policies
    # only the buffers), and the units that stay fp32.
    islands = policy.prepare_for_sharding(model, device.type)
    mp = policy.fsdp_mixed_precision()
    units: list[str] = []
    island_names = [name for name, _ in islands]
    for name, island in islands:
        if island is model:
            continue
        fully_shard(island, mesh=mesh, mp_policy=_FP32_UNIT, reshard_after_forward=reshard_after_forward)
        units.append(name)
    for name in repeated_blocks(model) if blocks is None else blocks:
        if any(name == i or name.startswith(i + ".") for i in island_names):
            continue  # already sharded as (part of) an fp32 island
        fully_shard(model.get_submodule(name), mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
        units.append(name)
    root_mp = policy.fsdp_mixed_precision(root=True)  # master policies: fp32 out of the model, for the user's loss
    # The root's parameters are gathered again at once by backward, so resharding them after forward only costs.
    fully_shard(model, mesh=mesh, mp_policy=root_mp, reshard_after_forward=False)
    return units


def adopt_sharded_params(optimizers: Sequence[torch.optim.Optimizer], before: dict[int, str], after: dict[str, nn.Parameter]) -> None:
    """Point ``optimizers`` at the sharded parameters that replaced the ones they were built on.

    ``before`` maps ``id(original parameter)`` to its name, ``after`` the name to the sharded parameter. The
    optimizer objects stay (an LR scheduler built on them stays valid); they must not have stepped yet, since
    full-size optimizer state cannot follow a parameter into its shard.
    """
    for opt in optimizers:
        if any(len(s) for s in opt.state.values()):
            raise ValueError(
                f"{type(opt).__name__} has already stepped; under FSDP its state would have to be sharded. Build the "
                "optimizer and pass it to engine.setup() before the first step (or load a checkpoint after setup)."
            )
        for group in opt.param_groups:
            swapped = []
            for p in group["params"]:
                name = before.get(id(p))
                if name is None or name not in after:
                    raise ValueError("an optimizer holds a parameter that is not the model's; build it on model.parameters().")
                swapped.append(after[name])
            group["params"] = swapped
        opt.state.clear()
