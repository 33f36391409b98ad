"""How much memory one training step needs under a precision policy: predicted without the device, or measured.

:func:`estimate` runs one real training step (the engine's own code: policy conversion, master weights,
autocast, backward, clipping, the optimizer creating its state) on fake tensors, so it allocates nothing and
needs no GPU: a laptop answers for a GPU. :func:`measure` runs the very same step on real tensors on the
device. On the CPU the two agree to the byte; on CUDA :func:`measure` also reads the allocator's peak.

    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 10))
    >>> batch = (torch.randn(64, 512), torch.randint(0, 10, (64,)))
    >>> opt = torch.optim.AdamW(model.parameters())
    >>> fp32, bf16 = (estimate(model, batch, opt, policy=p) for p in ("32-true", "bf16-mixed"))
    >>> fp32.parameters == bf16.parameters, bf16.activations < fp32.activations
    (True, True)
    >>> fp32.optimizer_state - 2 * fp32.parameters   # AdamW: two moments per weight, plus 4 step counters
    16
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._compat import tree_leaves, tree_map
from .._errors import AmpkitError, one_line
from .._util.model_io import batch_loss, batch_parts, default_loss
from ..policy import Policy, get_policy
from ..policy._device import as_device
from ..policy._fp8 import FP8Policy
from ..training._engine import Engine
from ._accounting import SavedActivations, StepPeak, tensor_bytes, training_state_bytes
from ._cuda_attention import CudaAttention
from ._fake import FakeCopies, rebuild_optimizer

__all__ = ["EstimateError", "LossFn", "MemoryEstimate", "estimate", "measure"]

LossFn = Callable[[Any, Any], torch.Tensor]

BREAKDOWN = ("parameters", "gradients", "optimizer_state", "master_weights", "activations")
"""The parts of :attr:`MemoryEstimate.total`, in table order."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training step holds under ``precision``, part by part.

    ``total`` is the sum of the five parts: what the step keeps resident at the start of backward, when the
    saved activations, the weights, their optimizer state and master weights coexist, with room for every
    gradient. ``peak`` is the most bytes live at any moment of two steps (the batch and the temporaries of
    forward, backward and the optimizer included), the figure to set against ``torch.cuda.max_memory_allocated``.
    """

    precision: str
    device: str
    """The device the step was predicted (or measured) for."""
    parameters: int
    gradients: int
    optimizer_state: int
    master_weights: int
    activations: int
    """Bytes saved for backward (saved-tensor hooks, each storage once; 16-bit weight copies autocast saves included)."""
    peak: int
    batch: int
    """Bytes of the example batch on the device (part of ``peak``, not of ``total``)."""
    batch_size: int | None = None
    method: str = "estimate"
    """``estimate`` (fake tensors) or ``measure`` (real tensors)."""
    simulated_on: str | None = None
    """Set when a CUDA step was predicted on this machine's CPU (no CUDA here): autocast used the CPU's op lists."""
    allocator_peak: int | None = None
    """``torch.cuda.max_memory_allocated`` over the measured steps (measure on CUDA only)."""
    note: str | None = None
    """Why a row asked for as an estimate was measured instead (``ampkit memory``), else None."""
    attention: str | None = None
    """When simulated: the CUDA kernels ``F.scaled_dot_product_attention`` was modelled with (``flash``, ``efficient``,
    ``math``), since a GPU keeps far less for backward there than the CPU's kernels (see :mod:`~ampkit.memory._cuda_attention`)."""

    @property
    def total(self) -> int:
        """parameters + gradients + optimizer_state + master_weights + activations."""
        return sum(getattr(self, name) for name in BREAKDOWN)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict, ``total`` included."""
        return {**dataclasses.asdict(self), "total": self.total}


class EstimateError(RuntimeError):
    """The step could not run on fake tensors (a value-dependent shape, an op whose fake kernel refuses the inputs):
    :func:`measure` runs the same step on real tensors. ``reason`` is the failure in one line."""

    def __init__(self, policy: str, reason: str) -> None:
        self.policy, self.reason = policy, reason
        super().__init__(
            f"estimate() cannot run the {policy} step on fake tensors ({reason}): the model needs a value a fake tensor does "
            "not have, or an op whose fake kernel refuses these inputs. measure() runs the same step on real tensors."
        )


def _batch_size(batch: Any) -> int | None:
    leaves = [t for t in tree_leaves(batch) if isinstance(t, torch.Tensor) and t.dim() > 0]
    return int(leaves[0].shape[0]) if leaves else None


def _check_arguments(caller: str, model: Any, example_batch: Any, loss_fn: Any) -> None:
    """Refuse what the step would fail on deep inside, with a message that names the argument and its form."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"{caller}() takes the model (an nn.Module) first, got {type(model).__name__} {model!r:.40}; pass the module "
            "itself (build one too large for this machine under `with torch.device('meta'):`)."
        )
    if not (isinstance(example_batch, (tuple, list)) and len(example_batch) == 2 or isinstance(example_batch, Mapping)):
        raise TypeError(
            f"{caller}() needs example_batch=(inputs, targets) or a dict of model keyword arguments, one training batch "
            f"as ampkit bench takes it, got {type(example_batch).__name__}; e.g. (torch.randn(64, 512), torch.randint(0, 10, (64,)))."
        )
    inputs = batch_parts(example_batch)[0]
    if not any(isinstance(t, torch.Tensor) for t in tree_leaves(inputs)):
        raise TypeError(f"{caller}(): the inputs of example_batch hold no tensor (got {type(inputs).__name__}); pass a tensor or a tuple of tensors.")
    if not callable(loss_fn):
        raise TypeError(f"{caller}(): loss_fn must be a callable loss_fn(output, targets), got {type(loss_fn).__name__}.")


def _framework_inputs(caller: str, model: Any, example_batch: Any, optimizer: Any, loss_fn: LossFn) -> tuple[Any, Any, Any, LossFn]:
    """The plain module, batch, optimizer and loss of what the user passed: a model ``Accelerator.prepare()`` returned is
    unwrapped, a LightningModule's batch runs its ``training_step`` (whose loss is the loss), a ``datasets.Dataset``
    gives its first collated batch (see :func:`ampkit.workloads._framework_inputs.tool_inputs`)."""
    from ..workloads._framework_inputs import tool_inputs
    from ..workloads._frameworks import is_hf_dataset, is_hf_dataset_dict
    from ..workloads._prepared import unwrap_optimizer

    dataset = is_hf_dataset(example_batch) or is_hf_dataset_dict(example_batch)
    model, batches, loss_fn = tool_inputs(model, example_batch if dataset else [example_batch], loss_fn, count=1, what=f"{caller}()")
    return model, batches[0], unwrap_optimizer(optimizer), loss_fn


def _model_device(model: nn.Module) -> torch.device:
    for t in [*model.parameters(), *model.buffers()]:
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")






def _step(model: nn.Module, engine: Engine, batch: Any, loss_fn: LossFn, has_optimizer: bool) -> None:
    with engine.autocast():
        loss = batch_loss(model, batch, loss_fn)
    if has_optimizer:
        engine.backward(loss)
        engine.step()
    else:
        loss.backward()
        model.zero_grad(set_to_none=True)


def _account(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    batch: Any,
    precision: str,
    loss_fn: LossFn,
    engine_options: dict[str, Any],
) -> dict[str, int]:
    """Two training steps of ``model`` under ``precision``; the first one's saved activations are counted.

    ``peak`` is :class:`~ampkit.memory._accounting.StepPeak`'s, from the setup on, with ``batch`` held throughout.
    """
    with StepPeak(model, batch) as live:
        engine = Engine(precision, **engine_options)
        if optimizer is not None:
            model, optimizer = engine.setup(model, optimizer)
        else:
            model = engine.setup(model)
        model.train()
        # The step is counted op by op under a dispatch mode, which torch.compile refuses to trace; an optimizer that
        # compiles its own step (torchao's, under bf16-true-sr) runs it eagerly here: the same state, more temporaries.
        with torch.compiler.set_stance("force_eager"):
            with SavedActivations(model) as saved:
                _step(model, engine, batch, loss_fn, optimizer is not None)
            _step(model, engine, batch, loss_fn, optimizer is not None)  # optimizer state exists from the first step on
    parts = training_state_bytes(model, [optimizer] if optimizer is not None else [], engine.masters)
    return {**parts, "activations": saved.bytes, "peak": live.peak, "batch": tensor_bytes(tree_leaves(batch))}


def _simulated_precision(policy: Policy) -> Policy:
    # TF32 only changes how fp32 matmuls round, not what is stored: the CPU simulates it as 32-true.
    if policy.name == "tf32":
        return get_policy("32-true", keep_fp32=policy.keep_fp32)
    # fp8 on the CPU is torchao's emulation: the same modules, casts and saved tensors as on the GPU.
    return dataclasses.replace(policy, emulate=True) if isinstance(policy, FP8Policy) else policy


def estimate(
    model: nn.Module,
    example_batch: Any,
    optimizer: Any = None,
    policy: str | Policy = "32-true",
    device: torch.device | str | None = None,
    *,
    loss_fn: LossFn = default_loss,
    **engine_options: Any,
) -> MemoryEstimate:
    """Predict the memory of one training step of ``model`` on ``example_batch`` under ``policy``, allocating nothing.

    ``model`` may live anywhere, on the ``meta`` device too (build a model too large for this machine under
    ``with torch.device("meta"):``); a LightningModule (the batch runs its ``training_step``) and a model
    ``accelerate.Accelerator.prepare()`` returned (its plain fp32 module is estimated) are taken too.
    ``example_batch`` is ``(inputs, targets)`` or a dict of keyword arguments, as in ``ampkit bench`` (or a
    ``datasets.Dataset``, whose first 8 rows are collated); tensors may be meta. ``loss_fn(output, targets)``:
    default, the output's ``.loss`` or cross-entropy (:func:`ampkit.bench._model_io.default_loss`). ``optimizer``
    is an optimizer of ``model`` (rebuilt with the same settings over the copy) or a factory ``params ->
    optimizer``; None counts no optimizer state. ``device`` is the target (default: the
    model's device, or the CPU). ``engine_options`` go to :class:`ampkit.Engine` (e.g. ``clip_grad_norm=1.0``).
    Raises :class:`EstimateError` when the step cannot run on fake tensors (a shape that depends on values, an op
    whose fake kernel refuses its inputs): :func:`measure` runs it on real ones. On the CPU the estimate equals the
    measure, except that transformers' decoders build their attention mask on fake tensors where an unpadded real
    batch runs unmasked: at most a B x T x T mask and k, v repeated to the query's heads per attention layer more
    (docs/guides/memory.md).

    >>> from torch import nn
    >>> with torch.device("meta"):
    ...     big = nn.Sequential(*[nn.Linear(8192, 8192) for _ in range(16)])   # 4.3 GB of fp32 weights
    >>> e = estimate(big, (torch.empty(4, 8192, device="meta"), torch.empty(4, dtype=torch.long, device="meta")),
    ...              lambda p: torch.optim.AdamW(p, foreach=True), policy="bf16-true-masters", device="cpu")
    >>> round(e.parameters / 2**30, 2), round(e.master_weights / 2**30, 2), round(e.total / 2**30, 1)
    (2.0, 8.0, 20.0)
    """
    model, example_batch, optimizer, loss_fn = _framework_inputs("estimate", model, example_batch, optimizer, loss_fn)
    _check_arguments("estimate", model, example_batch, loss_fn)
    resolved = get_policy(policy)  # an unknown name fails here, in one line, before any work
    requested = resolved.name
    target = as_device(device) if device is not None else _model_device(model)
    run_on, simulated, run_policy = target, None, resolved
    if target.type == "cuda" and not torch.cuda.is_available():
        # Fake CUDA tensors need CUDA's runtime for autograd; without it the step runs on fake CPU tensors.
        run_on, simulated, run_policy = torch.device("cpu"), "cpu", _simulated_precision(resolved)
    # Simulated on the CPU, attention takes the kernels a GPU would (the CPU's keep T x T scores for backward).
    attention = CudaAttention() if simulated else None
    with FakeCopies() as fake:
        fake_model = fake.model(model, run_on)
        fake_opt = rebuild_optimizer(optimizer, model, fake_model)
        fake_batch = fake.batch(example_batch, run_on)
        try:
            with attention or contextlib.nullcontext():
                parts = _account(fake_model, fake_opt, fake_batch, run_policy, loss_fn, engine_options)
        except AmpkitError:
            raise  # ampkit's own errors (a misuse, a collapsed scale) say what to fix as they are
        except (RuntimeError, NotImplementedError) as exc:  # a step that fails on real tensors too fails again in measure()
            raise EstimateError(requested, one_line(exc, with_type=True)) from exc
    return MemoryEstimate(
        precision=requested, device=str(target), batch_size=_batch_size(example_batch), simulated_on=simulated, method="estimate",
        attention=attention.describe() if attention else None, **parts,
    )


@contextlib.contextmanager
def _cuda_peak(device: torch.device) -> Iterator[dict[str, int]]:
    out: dict[str, int] = {}
    if device.type != "cuda":
        yield out
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    yield out
    torch.cuda.synchronize(device)
    out["allocator_peak"] = torch.cuda.max_memory_allocated(device) - base


def measure(
    model: nn.Module,
    example_batch: Any,
    optimizer: Any = None,
    policy: str | Policy = "32-true",
    device: torch.device | str | None = None,
    *,
    loss_fn: LossFn = default_loss,
    **engine_options: Any,
) -> MemoryEstimate:
    """The same two steps as :func:`estimate`, on real tensors on ``device``: what the prediction is checked against.

    Trains a copy (``model`` and ``optimizer`` are left untouched). On CUDA, ``allocator_peak`` is
    ``torch.cuda.max_memory_allocated`` over the copy's lifetime, measured from what was allocated before.

    >>> from torch import nn
    >>> model, batch = nn.Linear(32, 4), (torch.randn(16, 32), torch.randint(0, 4, (16,)))
    >>> m, e = measure(model, batch, policy="bf16-mixed"), estimate(model, batch, policy="bf16-mixed")
    >>> (m.total, m.peak, m.method) == (e.total, e.peak, "measure")
    True
    """
    model, example_batch, optimizer, loss_fn = _framework_inputs("measure", model, example_batch, optimizer, loss_fn)
    _check_arguments("measure", model, example_batch, loss_fn)
    target = as_device(device) if device is not None else _model_device(model)
    if any(t.device.type == "meta" for t in model.parameters()):
        raise ValueError("measure() needs real weights; this model is on the meta device. Use estimate() for it.")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("measure() on cuda needs a visible GPU and a CUDA build of torch; use estimate(..., device='cuda') here.")
    gc.collect()
    with _cuda_peak(target) as cuda:
        real_model = copy.deepcopy(model).to(target)
        real_opt = rebuild_optimizer(optimizer, model, real_model)
        real_batch = tree_map(lambda t: t.to(target) if isinstance(t, torch.Tensor) else t, example_batch)
        parts = _account(real_model, real_opt, real_batch, policy, loss_fn, engine_options)
        del real_model, real_opt, real_batch
    return MemoryEstimate(
        precision=get_policy(policy).name, device=str(target), batch_size=_batch_size(example_batch), method="measure",
        allocator_peak=cuda.get("allocator_peak"), **parts,
    )
