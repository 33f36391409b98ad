"""``apex.fp16_utils``: the manual fp16 helpers (half models with fp32 batch norm, fp32 master copies).

Where Apex copied gradients and weights between model and master tensors one tensor at a time, these run one
``torch._foreach_copy_`` over the whole list (flat masters are filled through views, without the temporary
concatenation Apex made). Apex's old ``FP16_Optimizer`` and its loss scalers are not provided: amp replaced
them in Apex itself, and ``amp.initialize(model, optimizer, opt_level="O2")`` is their drop-in; the names
exist so that old imports fail with that advice rather than an ImportError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from ..policy._islands import cast_floating

__all__ = [
    "to_python_float",
    "tofp16",
    "BN_convert_float",
    "network_to_half",
    "convert_module",
    "convert_network",
    "FP16Model",
    "prep_param_lists",
    "model_grads_to_master_grads",
    "master_params_to_model_params",
    "clip_grad_norm",
    "FP16_Optimizer",
    "LossScaler",
    "DynamicLossScaler",
]

#: torch's gradient-norm clipping, which Apex re-exported under this name.
clip_grad_norm = torch.nn.utils.clip_grad_norm_

_BatchNorm = nn.modules.batchnorm._BatchNorm


def to_python_float(t: Any) -> float:
    """The value of a one-element tensor (or number, or sequence's first element) as a Python float.

    >>> to_python_float(torch.tensor([2.5]))
    2.5
    """
    if hasattr(t, "item"):
        return float(t.item())
    if isinstance(t, (int, float)):
        return float(t)
    return float(t[0])


class tofp16(nn.Module):  # Apex's name
    """A module that casts its input to fp16 (the first stage of :func:`network_to_half`).

    >>> tofp16()(torch.ones(1)).dtype
    torch.float16
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input.half()


def BN_convert_float(module: nn.Module) -> nn.Module:  # Apex's name
    """Put every affine batch-norm layer of ``module`` back in fp32 (its statistics need the range); returns it.

    >>> net = BN_convert_float(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).half())
    >>> net[0].weight.dtype, net[1].weight.dtype
    (torch.float16, torch.float32)
    """
    for m in module.modules():
        if isinstance(m, _BatchNorm) and m.affine:
            m.float()
    return module


def network_to_half(network: nn.Module) -> nn.Sequential:
    """``network`` in fp16 with fp32 batch norm, behind a :class:`tofp16` input cast (Apex's legacy helper).

    >>> network_to_half(nn.Linear(2, 2))[1].weight.dtype
    torch.float16
    """
    return nn.Sequential(tofp16(), BN_convert_float(network.half()))


def convert_module(module: nn.Module, dtype: torch.dtype) -> None:
    """Cast ``module``'s own floating parameters, their gradients and its buffers to ``dtype`` (not its children's).

    Parameter objects are kept (their data is replaced), so optimizers built on them stay valid.

    >>> lin = nn.Linear(2, 2); convert_module(lin, torch.float16); lin.bias.dtype
    torch.float16
    """
    for p in module.parameters(recurse=False):
        if p.is_floating_point():
            p.data = p.data.to(dtype)
            if p.grad is not None and p.grad.is_floating_point():
                p.grad.data = p.grad.data.to(dtype)
    for b in module.buffers(recurse=False):
        if b.is_floating_point():
            b.data = b.data.to(dtype)


def convert_network(network: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast every module of ``network`` to ``dtype`` except affine batch norm, which stays as it is; returns it.

    >>> net = convert_network(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), torch.float16)
    >>> net[0].weight.dtype, net[1].weight.dtype
    (torch.float16, torch.float32)
    """
    for m in network.modules():
        if isinstance(m, _BatchNorm) and m.affine:
            continue
        convert_module(m, dtype)
        if isinstance(m, nn.RNNBase):
            m.flatten_parameters()  # cuDNN wants the cast weights in one contiguous block again
    return network


class FP16Model(nn.Module):
    """``network`` in fp16 (affine batch norm kept in fp32) with its floating inputs cast to fp16.

    Only floating-point inputs are cast (Apex cast every input, which broke integer token ids); nested lists,
    tuples and dicts, and keyword arguments, are handled too.

    >>> m = FP16Model(nn.Linear(2, 2))
    >>> m.network.weight.dtype, m(torch.ones(1, 2)).dtype
    (torch.float16, torch.float16)
    """

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = convert_network(network, dtype=torch.half)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.network(*cast_floating(inputs, torch.half), **cast_floating(kwargs, torch.half))


def _views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped as each tensor of ``like``, in order (the layout of a flat master)."""
    return [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in like]), like)]


def prep_param_lists(model: nn.Module, flat_master: bool = False) -> tuple[list[nn.Parameter], list[torch.Tensor]]:
    """The model's trainable parameters and fp32 master copies of them (one flat Parameter if ``flat_master``).

    Non-flat masters are leaf tensors with ``requires_grad=True``; the flat master is an ``nn.Parameter``
    with a zero gradient ready for :func:`model_grads_to_master_grads`. Parameters of different dtypes can
    share a flat master (they are all fp32 there); they must be on one device.

    >>> model_params, masters = prep_param_lists(nn.Linear(2, 2).half())
    >>> [m.dtype for m in masters], masters[0].requires_grad
    ([torch.float32, torch.float32], True)
    """
    model_params = [p for p in model.parameters() if p.requires_grad]
    sources = [p.detach() for p in model_params]
    if flat_master:
        devices = {p.device for p in model_params}
        if len(devices) > 1:
            raise ValueError(f"flat_master=True needs every parameter on one device, got {sorted(map(str, devices))}; use flat_master=False.")
        flat = torch.empty(sum(p.numel() for p in model_params), dtype=torch.float32, device=devices.pop() if devices else None)
        if sources:
            torch._foreach_copy_(_views(flat, sources), sources)
        master = nn.Parameter(flat)
        master.grad = torch.zeros_like(flat)
        return model_params, [master]
    masters = [torch.empty_like(p, dtype=torch.float32) for p in sources]
    if sources:
        torch._foreach_copy_(masters, sources)
    for m in masters:
        m.requires_grad_(True)
    return model_params, masters


def _check_lengths(model_params: Sequence[torch.Tensor], master_params: Sequence[torch.Tensor], flat_master: bool) -> None:
    if flat_master:
        if len(master_params) != 1 or master_params[0].numel() != sum(p.numel() for p in model_params):
            raise ValueError(
                "flat_master=True expects the one flat master from prep_param_lists(model, flat_master=True) for these "
                "model parameters; pass the same flat_master value to every helper."
            )
    elif len(model_params) != len(master_params):
        raise ValueError(
            f"{len(model_params)} model parameters but {len(master_params)} master parameters: pass the two lists "
            "prep_param_lists returned (and flat_master=True if it was called with it)."
        )


def model_grads_to_master_grads(model_params: Sequence[torch.Tensor], master_params: Sequence[torch.Tensor], flat_master: bool = False) -> None:
    """Copy the model's gradients into the fp32 masters' (allocating them as needed), in one foreach copy.

    A model parameter without a gradient leaves its master's gradient None (non-flat) or its slice of the
    flat gradient zero (flat).

    >>> model_params, masters = prep_param_lists(nn.Linear(2, 1).half())
    >>> for p in model_params: p.grad = torch.ones_like(p)
    >>> model_grads_to_master_grads(model_params, masters); masters[0].grad
    tensor([[1., 1.]])
    """
    _check_lengths(model_params, master_params, flat_master)
    with torch.no_grad():
        if flat_master:
            master = master_params[0]
            if master.grad is None:
                master.grad = torch.zeros_like(master)
            views = _views(master.grad, model_params)
            have = [(v, p.grad) for v, p in zip(views, model_params) if p.grad is not None]
            missing = [v for v, p in zip(views, model_params) if p.grad is None]
            if have:
                torch._foreach_copy_([v for v, _ in have], [g for _, g in have])
            if missing:
                torch._foreach_zero_(missing)
            return
        dst: list[torch.Tensor] = []
        src: list[torch.Tensor] = []
        for model, master in zip(model_params, master_params):
            if model.grad is None:
                master.grad = None
                continue
            if master.grad is None:
                master.grad = torch.empty_like(master)
            dst.append(master.grad)
            src.append(model.grad)
        if dst:
            torch._foreach_copy_(dst, src)


def master_params_to_model_params(model_params: Sequence[torch.Tensor], master_params: Sequence[torch.Tensor], flat_master: bool = False) -> None:
    """Copy the fp32 masters' values into the model's parameters (rounding to their dtype), in one foreach copy.

    >>> model_params, masters = prep_param_lists(nn.Linear(2, 1).half())
    >>> with torch.no_grad(): masters[1].fill_(0.5)
    tensor([0.5000], requires_grad=True)
    >>> master_params_to_model_params(model_params, masters); model_params[1]
    Parameter containing:
    tensor([0.5000], dtype=torch.float16, requires_grad=True)
    """
    _check_lengths(model_params, master_params, flat_master)
    if not model_params:
        return
    with torch.no_grad():
        sources = _views(master_params[0].detach(), model_params) if flat_master else [m.detach() for m in master_params]
        torch._foreach_copy_([p.detach() for p in model_params], sources)


class _Removed:
    """An ``apex.fp16_utils`` class that amp replaced: constructing it raises with the amp spelling."""

    _instead: ClassVar[str] = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"apex.fp16_utils.{type(self).__name__} is not provided by ampkit.apex: Apex replaced it with amp, which is. "
            f"{self._instead}"
        )


class FP16_Optimizer(_Removed):  # Apex's name
    """Not provided; raises with its amp drop-in, ``amp.initialize(model, optimizer, opt_level="O2")``.

    >>> FP16_Optimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    NotImplementedError: apex.fp16_utils.FP16_Optimizer is not provided by ampkit.apex: ... opt_level="O2")...
    """

    _instead = (
        'Use: from ampkit.apex import amp; model, optimizer = amp.initialize(model, optimizer, opt_level="O2") '
        "(fp16 model, fp32 master weights, dynamic loss scaling), then `with amp.scale_loss(loss, optimizer) as "
        "scaled_loss: scaled_loss.backward()` in place of optimizer.backward(loss)."
    )


class LossScaler(_Removed):
    """Not provided; raises: amp scales the loss (``amp.initialize(..., opt_level="O2", loss_scale=128.0)``).

    >>> LossScaler(128.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    NotImplementedError: apex.fp16_utils.LossScaler is not provided by ampkit.apex: ... loss_scale=128.0)...
    """

    _instead = (
        'Use: model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale=128.0) (a static scale) '
        "and `with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()`."
    )


class DynamicLossScaler(_Removed):
    """Not provided; raises: amp scales the loss dynamically (``amp.initialize(..., opt_level="O2")``).

    >>> DynamicLossScaler()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    NotImplementedError: apex.fp16_utils.DynamicLossScaler is not provided by ampkit.apex: ... opt_level="O2")...
    """

    _instead = (
        'Use: model, optimizer = amp.initialize(model, optimizer, opt_level="O2") (dynamic loss scaling is its '
        "default) and `with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()`."
    )
