"""fp32 master weights for a model stored in 16 bits (Apex O2's recipe).

The masters are cloned from the fp32 parameters *before* the model is cast down, so no precision is lost,
and they replace the 16-bit parameters inside the optimizers' param groups: the optimizer steps fp32 values
and keeps fp32 state, and the 16-bit model is refreshed from them after each step. Gradients travel
16-bit -> fp32 through one ``torch._foreach_copy_`` launch, weights fp32 -> 16-bit through another; master
gradients live in persistent buffers that are overwritten, not reallocated, at every optimizer step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

import torch
from torch import nn

from ..scaling._kernels import unscale_grads_

__all__ = ["MasterWeights"]


class MasterWeights:
    """Pairs each 16-bit model parameter with the fp32 master the optimizer steps.

    >>> model = nn.Linear(2, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> masters = MasterWeights.clone(model.named_parameters(), [opt])
    >>> _ = model.to(torch.bfloat16)  # the policy casts the model after cloning
    >>> opt.param_groups[0]["params"][0].dtype
    torch.float32
    """

    mergeable: ClassVar[bool] = True
    """Whether :meth:`merged` can join another store's masters to these (one optimizer's, then another's)."""
    untraceable: ClassVar[str | None] = None
    """Why the fused master step (one compiled region) cannot trace a step of these masters; None: it can."""

    def __init__(self, pairs: Sequence[tuple[str, nn.Parameter, nn.Parameter]]) -> None:
        self.names = [name for name, _, _ in pairs]
        # Parameters, held as list[Tensor]: torch's _foreach_* take a list of Tensors, and a list is invariant.
        self.model_params: list[torch.Tensor] = [p for _, p, _ in pairs]
        self.masters: list[torch.Tensor] = [m for _, _, m in pairs]
        self._grad_buffers = [torch.empty_like(m) for m in self.masters]
        # Second set of fp32 buffers, made on first need: only accumulation over several backward passes
        # (unscale_grads_to_masters with gradients already present) uses them.
        self._staging: list[torch.Tensor] | None = None

    @classmethod
    def clone(
        cls, named_params: Iterable[tuple[str, nn.Parameter]], optimizers: Sequence[torch.optim.Optimizer],
        values: Mapping[int, torch.Tensor] | None = None,
    ) -> MasterWeights:
        """Clone fp32 masters of ``named_params`` that the optimizers hold, and put them in the optimizers.

        ``values``: the fp32 values to clone by parameter ``id``, where the parameter no longer holds them (a model
        cast before its optimizer was built, :func:`ampkit.policy.fp32_values`); each master lands on its parameter's
        device.

        >>> model = nn.Linear(2, 2); kept = {id(p): p.detach().clone() for p in model.parameters()}
        >>> _ = model.half(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> masters = MasterWeights.clone(model.named_parameters(), [opt], values=kept)
        >>> torch.equal(masters.masters[0], kept[id(model.weight)]), opt.param_groups[0]["params"][0].dtype
        (True, torch.float32)
        """
        optimized = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
        pairs: list[tuple[str, nn.Parameter, nn.Parameter]] = []
        swap: dict[int, nn.Parameter] = {}
        for name, p in named_params:
            if id(p) in swap or id(p) not in optimized or not p.is_floating_point():
                continue
            value = values.get(id(p), p) if values is not None else p
            master = nn.Parameter(value.detach().to(device=p.device, dtype=torch.float32, copy=True), requires_grad=p.requires_grad)
            swap[id(p)] = master
            pairs.append((name, p, master))
        for opt in optimizers:
            for group in opt.param_groups:
                group["params"] = [swap.get(id(p), p) for p in group["params"]]
            # State created before setup (rare) follows its parameter to the master.
            for old_id, master in swap.items():
                for key in [k for k in opt.state if id(k) == old_id]:
                    opt.state[master] = opt.state.pop(key)
        return cls(pairs)

    def merged(self, other: MasterWeights) -> MasterWeights:
        """These masters and ``other``'s in one store (the same tensors: the optimizers holding them stay valid).

        >>> a, b = nn.Linear(1, 1), nn.Linear(1, 1)
        >>> ma = MasterWeights.clone(a.named_parameters(), [torch.optim.SGD(a.parameters(), lr=0.1)])
        >>> mb = MasterWeights.clone(b.named_parameters(), [torch.optim.SGD(b.parameters(), lr=0.1)])
        >>> len(ma.merged(mb)), ma.merged(mb).masters[2] is mb.masters[0]
        (4, True)
        """
        if not (self.mergeable and other.mergeable):
            raise ValueError(f"{type(self).__name__} keeps its masters in one flat store: build it with every optimizer at once.")
        pairs = [*zip(self.names, self.model_params, self.masters), *zip(other.names, other.model_params, other.masters)]
        return type(self)(pairs)  # type: ignore[arg-type]  # model_params/masters are Parameters, held as Tensors

    @torch.no_grad()
    def follow_model(self) -> int:
        """Take the 16-bit weight as the master wherever the master's cast is no longer that weight (the model's
        weights were loaded after setup); returns how many masters changed. At load time, not per step.

        >>> model = nn.Linear(1, 1); masters = MasterWeights.clone(model.named_parameters(), [torch.optim.SGD(model.parameters(), lr=0.1)])
        >>> _ = model.half(); _ = model.weight.data.fill_(2.0); masters.follow_model(), masters.masters[0].item()  # the bias is as it was
        (1, 2.0)
        """
        changed = 0
        for p, m in zip(self.model_params, self.masters):
            if not torch.equal(m.to(p.dtype), p):
                m.copy_(p)
                changed += 1
        return changed

    def __len__(self) -> int:
        return len(self.masters)

    def tensors(self) -> list[torch.Tensor]:
        """Every fp32 tensor this object holds: masters, gradient and staging buffers (for memory accounting)."""
        return [*self.masters, *self._grad_buffers, *(self._staging or [])]

    def copy_grads_to_masters(self) -> None:
        """Give each master the fp32 copy of its model parameter's gradient (None where that is None)."""
        src: list[torch.Tensor] = []
        dst: list[torch.Tensor] = []
        for p, m, buf in zip(self.model_params, self.masters, self._grad_buffers):
            g = p.grad
            if g is None:
                m.grad = None
            elif g.is_sparse:
                m.grad = g.to(torch.float32)  # rare: sparse grads cannot share a dense buffer
            else:
                if m.grad is not buf:
                    m.grad = buf
                src.append(g)
                dst.append(buf)
        if src:
            torch._foreach_copy_(dst, src)

    def add(self, name: str, param: nn.Parameter) -> nn.Parameter:
        """Pair one more 16-bit ``param`` with a new fp32 master cloned from it and return the master.

        For parameters that join after setup (``optimizer.add_param_group`` mid-training): the master starts
        from the 16-bit values, the best that is left of them.

        >>> masters = MasterWeights([])
        >>> masters.add("w", nn.Parameter(torch.ones(2, dtype=torch.bfloat16))).dtype
        torch.float32
        """
        master = nn.Parameter(param.detach().to(torch.float32, copy=True), requires_grad=param.requires_grad)
        self.names.append(name)
        self.model_params.append(param)
        self.masters.append(master)
        self._grad_buffers.append(torch.empty_like(master))
        if self._staging is not None:
            self._staging.append(torch.empty_like(master))
        return master

    def unscale_grads_to_masters(self, inv_scale: torch.Tensor, found_inf: torch.Tensor) -> None:
        """Add each 16-bit gradient, unscaled in fp32, to its master's gradient, then drop the 16-bit one.

        A master without a gradient receives a copy; one that already holds a gradient (accumulation over
        several backward passes) receives the sum. Unscaling happens after the cast to fp32, so small
        gradients that fp16 could hold only while scaled are not flushed to zero. Non-finite values are
        recorded in ``found_inf``. Four foreach launches at most; no sync.

        >>> model = nn.Linear(1, 1, bias=False); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> masters = MasterWeights.clone(model.named_parameters(), [opt]); _ = model.half()
        >>> model.weight.grad = torch.full((1, 1), 8.0, dtype=torch.float16)
        >>> masters.unscale_grads_to_masters(torch.tensor(0.25), torch.zeros(()))
        >>> masters.masters[0].grad, model.weight.grad
        (tensor([[2.]]), None)
        """
        if self._staging is None and any(m.grad is not None for m in self.masters):
            self._staging = [torch.empty_like(m) for m in self.masters]
        staging = self._staging or []  # empty only where no master holds a gradient: then nothing accumulates
        fresh_src: list[torch.Tensor] = []
        fresh_dst: list[torch.Tensor] = []
        acc_src: list[torch.Tensor] = []
        acc_stage: list[torch.Tensor] = []
        acc_dst: list[torch.Tensor] = []
        for i, (p, m) in enumerate(zip(self.model_params, self.masters)):
            g = p.grad
            if g is None:
                continue
            if g.is_sparse:
                g = g.to_dense()  # rare; a sparse 16-bit gradient cannot share a dense fp32 buffer
            if m.grad is None:
                m.grad = self._grad_buffers[i]
                fresh_src.append(g)
                fresh_dst.append(m.grad)
            else:
                acc_src.append(g)
                acc_stage.append(staging[i])
                acc_dst.append(m.grad)
            p.grad = None
        if fresh_src:
            torch._foreach_copy_(fresh_dst, fresh_src)
        if acc_src:
            torch._foreach_copy_(acc_stage, acc_src)
        unscale_grads_([*fresh_dst, *acc_stage], inv_scale, found_inf)
        if acc_src:
            torch._foreach_add_(acc_dst, acc_stage)

    def zero_model_grads(self, master_ids: set[int]) -> None:
        """Drop the 16-bit model gradients of the masters whose ``id`` is in ``master_ids`` (after their step)."""
        for p, m in zip(self.model_params, self.masters):
            if id(m) in master_ids:
                p.grad = None

    @torch.no_grad()
    def copy_masters_to_model(self) -> None:
        """Refresh the 16-bit model from the masters (harmless after a skipped step: masters are unchanged)."""
        if self.masters:
            torch._foreach_copy_(self.model_params, self.masters)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """fp32 master values by model parameter name (Apex lost these, so O2 resumes spiked)."""
        return {name: m.detach().clone() for name, m in zip(self.names, self.masters)}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore masters by name and refresh the model from them; raises KeyError/ValueError on mismatch."""
        missing = [n for n in self.names if n not in state]
        unexpected = [n for n in state if n not in set(self.names)]
        if missing or unexpected:
            raise ValueError(f"master weights do not match this model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for name, m in zip(self.names, self.masters):
            if state[name].shape != m.shape:
                raise ValueError(f"master weight {name!r} has shape {tuple(state[name].shape)}, model has {tuple(m.shape)}")
        torch._foreach_copy_(self.masters, [state[n].to(m.device) for n, m in zip(self.names, self.masters)])
        self.copy_masters_to_model()
