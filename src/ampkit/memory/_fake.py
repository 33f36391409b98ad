"""Copies of a model, its optimizer and a batch made of fake tensors: shapes, dtypes and devices, no memory.

A fake tensor (``torch._subclasses.FakeTensorMode``) carries everything an op needs to compute the *shape*
of its result and nothing else, so a training step on fake copies runs the model's real Python code, autocast's
real casting rules and the optimizer's real state creation while allocating nothing on the target device.

    >>> from torch import nn
    >>> with FakeCopies() as fake:
    ...     model = fake.model(nn.Linear(4096, 4096), torch.device("cpu"))   # 64 MiB of weights, none allocated
    ...     out = model(fake.tensor(torch.empty(8, 4096, device="meta"), torch.device("cpu")))
    >>> out.shape, out.device.type
    (torch.Size([8, 4096]), 'cpu')
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from .._compat import FakeTensor, FakeTensorMode, TorchDispatchMode, disable_current_modes, tree_leaves, tree_map
from ._accounting import storage_key

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

__all__ = ["FakeCopies", "AssumeCleanReads", "GroupedMatmulAnyDtype", "RealOutputDtypes", "rebuild_optimizer"]


class AssumeCleanReads(TorchDispatchMode):
    """Answers host reads of fake tensors (``.item()``, ``bool(t)``), which have no values, as a clean step would.

    Reads of the overflow flag that torch's unscale kernels write, and of anything computed from it, answer 0:
    no overflow, nothing skipped. Every other read answers 1, a value that keeps ordinary code on its ordinary
    path (an optimizer's step counter, a bias correction, a norm).
    """

    _FLAG_ARG: ClassVar[dict[str, int]] = {"_amp_foreach_non_finite_check_and_unscale_": 1, "_amp_update_scale_": 2}

    def __init__(self) -> None:
        super().__init__()
        self._flags: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        flagged = any(storage_key(t) in self._flags for t in inputs)
        if func is torch.ops.aten._local_scalar_dense.default:
            t = args[0]
            value = 0 if flagged else 1
            return bool(value) if t.dtype == torch.bool else float(value) if t.is_floating_point() else value
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in self._FLAG_ARG:
            self._flags.add(storage_key(args[self._FLAG_ARG[name]]))
        elif flagged:
            self._flags.update(storage_key(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


class RealOutputDtypes(TorchDispatchMode):
    """Gives fake normalisation ops the output dtypes the device's real kernels produce.

    Some meta kernels guess the dtype of saved statistics wrong: for a bf16 input the CPU's layer_norm saves
    fp32 mean and rstd where the meta kernel says bf16. Those statistics are saved for backward, so an
    estimate that trusted the meta kernel would miss bytes. The first time an op meets a dtype combination,
    this mode runs the real op once on a one-sample input on the CPU and remembers its output dtypes.

    The CPU answers for every target: these kernels take their output dtypes from one rule on every device (the
    statistics in the accumulation type, fp32 for 16-bit inputs). Asking the target instead would allocate on
    it, and a prediction for a GPU must not touch the GPU (not even to create its CUDA context). Where the CPU
    has no kernel for a dtype, the meta kernel's dtypes are kept.
    """

    OPS = frozenset({"native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
                     "_native_batch_norm_legit_no_training", "_batch_norm_with_update", "_fused_rms_norm"})

    def __init__(self) -> None:
        super().__init__()
        self._dtypes: dict[tuple[Any, ...], list[torch.dtype] | None] = {}

    @staticmethod
    def _real_dtypes(func: Any, args: Any, kwargs: Any) -> list[torch.dtype] | None:
        first = [True]

        def real(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            shape = list(x.shape)
            if first[0] and shape:
                shape[0], first[0] = 1, False  # one sample is enough to learn the dtypes
            return torch.zeros(shape, dtype=x.dtype, device="cpu")

        try:
            with disable_current_modes():
                out = func(*tree_map(real, args), **tree_map(real, kwargs))
        except (RuntimeError, NotImplementedError):  # no CPU kernel for this dtype: trust the meta kernel
            return None
        return [t.dtype for t in tree_leaves(out) if isinstance(t, torch.Tensor)]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket.__name__ not in self.OPS:
            return out
        key = (func, *(t.dtype for t in tree_leaves(args) if isinstance(t, torch.Tensor)))
        if key not in self._dtypes:
            self._dtypes[key] = self._real_dtypes(func, args, kwargs)
        if self._dtypes[key] is None:
            return out
        wanted = iter(self._dtypes[key])
        return tree_map(lambda t: t.to(next(wanted)) if isinstance(t, torch.Tensor) else t, out)


class GroupedMatmulAnyDtype(TorchDispatchMode):
    """Runs ``aten._grouped_mm`` (the experts of Hugging Face's MoE layers) on fake tensors of any dtype the CPU runs.

    torch's meta kernel for ``_grouped_mm`` takes bf16 inputs only (the GPU kernel's rule), while the CPU's real
    kernel multiplies fp32 and fp16 too: an fp32 Mixtral's step runs on the CPU and would fail on fake tensors.
    The output's shape does not depend on the dtype, so the meta kernel is asked in bf16 and its answer given the
    dtype the real kernel returns (the inputs', or ``out_dtype``). The casts run below the byte counters (this mode
    sits under :class:`~ampkit.memory._accounting.LiveBytes`): only the output is counted, as on the device.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ != "_grouped_mm":
            return func(*args, **kwargs)
        mats = [t for t in args[:2] if isinstance(t, torch.Tensor)]
        if not mats or all(t.dtype == torch.bfloat16 for t in mats) or not all(t.is_floating_point() for t in mats):
            return func(*args, **kwargs)
        dtype = kwargs.get("out_dtype") or mats[0].dtype
        as_bf16 = [t.to(torch.bfloat16) if i < 2 and isinstance(t, torch.Tensor) else t for i, t in enumerate(args)]
        return func(*as_bf16, **{**kwargs, "out_dtype": None}).to(dtype)


class FakeCopies:
    """A FakeTensorMode plus helpers that turn real or meta modules, tensors and batches into fake ones.

    Use as a context manager: inside, every new tensor is fake. The originals are never modified.
    """

    def __init__(self) -> None:
        self.mode = FakeTensorMode(allow_non_fake_inputs=False)
        self._dtypes = RealOutputDtypes()
        self._reads = AssumeCleanReads()
        self._grouped = GroupedMatmulAnyDtype()

    def __enter__(self) -> Self:
        self.mode.__enter__()
        self._dtypes.__enter__()
        self._reads.__enter__()
        self._grouped.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._grouped.__exit__(*exc)
        self._reads.__exit__(*exc)
        self._dtypes.__exit__(*exc)
        self.mode.__exit__(*exc)

    def tensor(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A fake tensor with ``t``'s shape, dtype and strides on ``device`` (``t`` may be real, meta or fake)."""
        fake = t if isinstance(t, FakeTensor) else self.mode.from_tensor(t)
        with self.mode:  # detach() and to() of a fake tensor are fake ops, whether or not the caller entered
            fake = fake.detach()
            return fake.to(device) if fake.device != device else fake

    def batch(self, batch: Any, device: torch.device) -> Any:
        """``batch`` (tensors nested in tuples, lists and dicts) with every tensor fake on ``device``."""
        return tree_map(lambda x: self.tensor(x, device) if isinstance(x, torch.Tensor) else x, batch)

    def model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """A deep copy of ``model`` whose parameters and buffers are fake on ``device`` (tied weights stay tied)."""
        memo: dict[int, Any] = {}
        for p in model.parameters():
            memo[id(p)] = nn.Parameter(self.tensor(p, device), requires_grad=p.requires_grad)
        for b in model.buffers():
            memo[id(b)] = self.tensor(b, device)
        # Plain tensor attributes (neither parameter nor buffer, e.g. a cached mask) must be fake too: a real
        # one cannot be deep-copied under FakeTensorMode.
        for m in model.modules():
            for value in vars(m).values():
                if isinstance(value, torch.Tensor) and id(value) not in memo:
                    memo[id(value)] = self.tensor(value, device)
        return copy.deepcopy(model, memo)


def rebuild_optimizer(
    optimizer: torch.optim.Optimizer | Callable[[Any], torch.optim.Optimizer] | None,
    original: nn.Module,
    copied: nn.Module,
) -> torch.optim.Optimizer | None:
    """The same kind of optimizer, with the same groups and settings, over ``copied``'s parameters.

    ``optimizer`` is an optimizer of ``original`` (its state is not copied: a fresh run's state is what the
    step creates) or a factory ``params -> optimizer``.

    >>> m = nn.Linear(2, 2); opt = torch.optim.SGD([{"params": [m.weight], "lr": 0.5}, {"params": [m.bias]}], lr=0.1)
    >>> twin = copy.deepcopy(m)
    >>> [g["lr"] for g in rebuild_optimizer(opt, m, twin).param_groups]
    [0.5, 0.1]
    """
    if optimizer is None:
        return None
    if not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer or a factory params -> optimizer, got {type(optimizer).__name__}.")
        return optimizer(copied.parameters())
    twin = {id(a): b for a, b in zip(original.parameters(), copied.parameters(), strict=True)}
    missing = [i for g in optimizer.param_groups for i, p in enumerate(g["params"]) if id(p) not in twin]
    if missing:
        raise ValueError(
            "the optimizer holds parameters that are not the model's; build it on this model's parameters, or pass "
            "optimizer=lambda params: YourOptimizer(params, ...) to let the copy build its own."
        )
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [twin[id(p)] for p in g["params"]]} for g in optimizer.param_groups]
    # Every group carries every setting; the defaults fill required arguments (lr) the constructor still wants,
    # filtered to what it accepts (AdamW inherits defaults its own __init__ does not take).
    accepted = inspect.signature(type(optimizer).__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    try:
        return type(optimizer)(groups, **defaults)
    except TypeError as exc:
        raise ValueError(
            f"cannot rebuild {type(optimizer).__name__} from its defaults ({exc}); pass optimizer=lambda params: "
            f"{type(optimizer).__name__}(params, ...) instead."
        ) from exc
