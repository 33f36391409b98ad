"""fp32 master weights stored as the bf16 model weight plus an int16 remainder and a tie bit: 2.125 bytes per
parameter, not 8.

:class:`~ampkit.policy._masters.MasterWeights` keeps an fp32 master and an fp32 gradient buffer per parameter
for the whole run (8 bytes per parameter beside the 16-bit model). This store keeps only an int16 remainder
and one tie bit per parameter between steps: with the bf16 weight the model already holds, they are the master,
bit for bit (see :mod:`ampkit.policy._remainder_bits` for why 16 bits alone cannot be exact).

The optimizer still holds, and steps, fp32 ``Parameter`` objects, so any torch optimizer works and its state
stays fp32. Their storage exists only during the step: :meth:`copy_grads_to_masters` allocates it, rebuilds the
masters from (weight, remainder) and frees the remainders; :meth:`copy_masters_to_model` rounds the stepped
masters into the model, keeps what rounding lost as the new remainders and frees the fp32 storage again
(one ``untyped_storage().resize_()`` per device: the masters, their gradient buffers and the remainders are views
of one flat buffer each, as FSDP frees its unsharded parameters). Memory, per parameter beside the
bf16 model and its gradient:

- between steps (forward and backward included, where activations peak): 2.125 bytes (remainder, tie bit);
- during the optimizer step: 8 bytes (fp32 master + fp32 gradient; the remainders are freed meanwhile),
  the same as ``MasterWeights`` holds all the time. Every master is whole at once, because one
  ``optimizer.step()`` steps them all and an optimizer may read them together.

Between steps the fp32 masters have their shapes but no data: read them through :meth:`state_dict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from .._compat import resize_storages
from ._masters import MasterWeights
from ._remainder_bits import add_ties_, merge_, narrow_, split_, tie_bytes

__all__ = ["RemainderMasters"]


def _flat_views(tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One flat buffer per device holding ``tensors``' values, and a view of it for each tensor (same shape and
    memory layout: a channels_last weight keeps its strides, so reductions over it, such as a clipping norm, sum
    in the same order as over the tensor it replaces).

    Freeing or giving back all of them is then one storage resize per device, not one per parameter.
    """
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    flats: list[torch.Tensor] = []
    views: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
    for device, idx in by_device.items():
        flat = torch.empty(sum(tensors[i].numel() for i in idx), dtype=dtype, device=device)
        offset = 0
        for i in idx:
            t = tensors[i]
            # The strides empty_like would give: t's own where it is dense (channels_last too), else contiguous.
            views[i] = flat.as_strided(t.shape, torch.empty_like(t, device="meta").stride(), offset)
            offset += t.numel()
        torch._foreach_copy_([views[i] for i in idx], [tensors[i] for i in idx])
        flats.append(flat)
    return flats, views


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements as a 1-D view, in the order they lie in memory (for a flat buffer: itself)."""
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


def _nbytes(tensors: Sequence[torch.Tensor]) -> list[int]:
    return [t.numel() * t.element_size() for t in tensors]


class RemainderMasters(MasterWeights):
    """Master weights as (bf16 model weight, int16 remainder); whole fp32 masters only inside the step.

    >>> model = nn.Linear(2, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> w0 = model.weight.detach().clone()
    >>> masters = RemainderMasters.clone(model.named_parameters(), [opt]); _ = model.to(torch.bfloat16)
    >>> masters.remainders[0].dtype, masters.masters[0].untyped_storage().nbytes()
    (torch.int16, 0)
    >>> torch.equal(masters.state_dict()["weight"], w0)  # the fp32 master, rebuilt exactly
    True
    """

    mergeable: ClassVar[bool] = False  # one flat buffer per device, built at once
    untraceable: ClassVar[str | None] = (
        "the remainder masters rebuild fp32 masters around the step, which the region does not trace; use fused_step=False or 'bf16-true-masters'"
    )

    def __init__(self, pairs: Sequence[tuple[str, nn.Parameter, nn.Parameter]]) -> None:
        super().__init__(pairs)
        # The masters, their gradient buffers and the remainders each live in one flat buffer per device (the
        # masters as views, so the optimizer keeps its Parameters): a step frees and allocates a few storages.
        self._master_flats, views = _flat_views(self.masters, torch.float32)
        for master, view in zip(self.masters, views):
            master.data = view
        self._grad_flats, self._grad_buffers = _flat_views(self._grad_buffers, torch.float32)
        self._remainder_flats, self.remainders = _flat_views(
            [torch.zeros_like(m, dtype=torch.int16) for m in self.masters], torch.int16
        )
        # One tie bit per value, packed, per flat buffer: the one remainder int16 cannot hold (remainder_bits).
        self._ties = [torch.zeros(tie_bytes(f.numel()), dtype=torch.uint8, device=f.device) for f in self._master_flats]
        self._live = True  # the fp32 masters hold the values now; the split below moves them
        weights = [torch.empty(m.shape, dtype=torch.bfloat16, device=m.device) for m in self.masters]
        self._split(weights)  # the same rounding as the policy's cast of the model, which follows

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor this object holds; freed fp32 storages count 0 bytes (for memory accounting)."""
        return [*self.remainders, *self._ties, *super().tensors()]

    def _materialize(self) -> None:
        """Rebuild the fp32 masters from the model and the remainders, then free the remainders."""
        if self._live:
            return
        resize_storages(self._master_flats, _nbytes(self._master_flats))
        merge_(self.masters, self.model_params, self.remainders)
        for flat, ties in zip(self._master_flats, self._ties):
            add_ties_(_memory_order(flat).view(torch.int32), ties)
        resize_storages(self._remainder_flats, None)
        resize_storages(self._grad_flats, _nbytes(self._grad_flats))
        self._live = True

    def _split(self, weights: list[torch.Tensor]) -> None:
        """Round the fp32 masters into ``weights``, keep the remainders, free the fp32 storage."""
        if not self._live:
            return
        split_(self.masters, weights, self._grad_buffers)  # the gradient buffers are dead after the step: scratch
        resize_storages(self._grad_flats, None)
        resize_storages(self._remainder_flats, _nbytes(self._remainder_flats))
        for flat, remainders, ties in zip(self._master_flats, self._remainder_flats, self._ties):
            narrow_(_memory_order(flat).view(torch.int32), _memory_order(remainders), ties)
        resize_storages(self._master_flats, None)
        self._live = False

    def copy_grads_to_masters(self) -> None:
        """Rebuild the fp32 masters for the step, then give them fp32 copies of the model's gradients."""
        self._materialize()
        super().copy_grads_to_masters()

    def unscale_grads_to_masters(self, inv_scale: torch.Tensor, found_inf: torch.Tensor) -> None:
        """Rebuild the fp32 masters, then add the unscaled gradients to theirs (see ``MasterWeights``)."""
        self._materialize()
        super().unscale_grads_to_masters(inv_scale, found_inf)

    @torch.no_grad()
    def copy_masters_to_model(self) -> None:
        """Round the stepped masters into the model and keep the remainders (nothing to do between steps)."""
        self._split(self.model_params)

    def add(self, name: str, param: nn.Parameter) -> nn.Parameter:
        """Pair one more bf16 ``param`` with a master (its own value: remainder 0) and return the master.

        >>> masters = RemainderMasters([])
        >>> masters.add("w", nn.Parameter(torch.ones(2, dtype=torch.bfloat16))).dtype, masters.remainders[0].tolist()
        (torch.float32, [0, 0])
        """
        if param.dtype != torch.bfloat16:
            raise ValueError(f"remainder masters pair bf16 parameters only; {name!r} is {param.dtype}: use 'bf16-true-masters' for other dtypes")
        master = super().add(name, param)
        # A late parameter keeps storages of its own, freed and given back with the flat ones.
        self._master_flats.append(master)
        self._grad_flats.append(self._grad_buffers[-1])
        self.remainders.append(torch.zeros_like(master, dtype=torch.int16))
        self._remainder_flats.append(self.remainders[-1])
        self._ties.append(torch.zeros(tie_bytes(param.numel()), dtype=torch.uint8, device=param.device))
        if not self._live:
            resize_storages([master, self._grad_buffers[-1]], None)
        return master

    @torch.no_grad()
    def follow_model(self) -> int:
        """Take the loaded bf16 weights as the masters: their remainders belonged to the weights they were split from,
        which the load replaced (which ones cannot be told, so all are cleared). Returns how many masters there are."""
        if self._live:
            return super().follow_model()
        for store in (*self._remainder_flats, *self._ties):
            store.zero_()
        return len(self.masters)

    @torch.no_grad()
    def state_dict(self) -> dict[str, torch.Tensor]:
        """fp32 master values by model parameter name, rebuilt (the same format as ``MasterWeights``).

        Between steps the masters are rebuilt for the copy and split again after it: for that moment the memory is
        the step's (8 B/param), and the model and the stored remainders come back exactly as they were.
        """
        if self._live:
            return super().state_dict()
        self._materialize()
        try:
            return super().state_dict()
        finally:
            self._split(self.model_params)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore fp32 masters by name (from either store) and refresh the model and the remainders from them."""
        self._materialize()  # the masters stay consistent if the checks below refuse ``state``
        super().load_state_dict(state)
