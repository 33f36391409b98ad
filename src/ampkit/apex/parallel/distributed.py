"""Apex's ``DistributedDataParallel`` as a subclass of torch's, which does everything Apex's did and more.

torch's DDP buckets gradients and all-reduces each bucket as soon as it is ready, overlapping communication
with the rest of the backward pass: Apex's tuning knobs for the same thing (streams, communicators, trigger
parameters, delayed reduction) are accepted and logged at debug level. ``message_size`` (elements) becomes
``bucket_cap_mb``. Options that change the gradients themselves and that torch's DDP has no argument for
(summing instead of averaging, fp32 reduction of 16-bit gradients, pre-division) raise with the fix, since
training on silently different gradients is worse than stopping.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

__all__ = ["DistributedDataParallel", "bucket_cap_mb", "infer_device_ids"]

log = logging.getLogger("ampkit")

_NOT_INITIALISED = (
    "apex.parallel.DistributedDataParallel needs torch.distributed initialised: launch with torchrun "
    "(torchrun --nproc-per-node N train.py) and call torch.distributed.init_process_group(backend='nccl') "
    "('gloo' on CPU) before wrapping the model."
)


def bucket_cap_mb(module: nn.Module, message_size: int) -> float:
    """Apex's ``message_size`` (gradient elements per all-reduce) as torch's ``bucket_cap_mb`` (MiB).

    Elements are counted at the size of the dtype that holds most of the trainable parameters.

    >>> bucket_cap_mb(nn.Linear(4, 4), 2**20)  # a million fp32 elements
    4.0
    """
    sizes: dict[int, int] = {}
    for p in module.parameters():
        if p.requires_grad:
            sizes[p.element_size()] = sizes.get(p.element_size(), 0) + p.numel()
    element_size = max(sizes, key=lambda s: sizes[s]) if sizes else 4
    return message_size * element_size / 2**20


def infer_device_ids(module: nn.Module) -> list[int] | None:
    """``device_ids`` for torch's DDP: ``[index]`` for a module on one CUDA device, else None (CPU, several devices).

    Apex's DDP required the module on the current CUDA device and took no ``device_ids``; torch's wants it
    for single-device CUDA modules.

    >>> infer_device_ids(nn.Linear(2, 2)) is None
    True
    """
    devices = {t.device for t in [*module.parameters(), *module.buffers()]}
    if len(devices) != 1:
        return None
    (device,) = devices
    if device.type != "cuda":
        return None
    return [device.index if device.index is not None else torch.cuda.current_device()]


def _refuse_numerics(
    shared_param: Any,
    allreduce_always_fp32: bool,
    gradient_average: bool,
    gradient_predivide_factor: float,
    gradient_average_split_factor: float | None,
) -> None:
    if shared_param is not None:
        raise ValueError(
            "shared_param is not supported (Apex dropped it too): torch's DDP handles shared parameters on its own. "
            "Remove the shared_param argument."
        )
    if not gradient_average:
        raise NotImplementedError(
            "gradient_average=False (sum gradients over ranks) has no torch DDP argument: torch's DDP always averages. "
            "Multiply the loss by torch.distributed.get_world_size() to get the sum, or register a communication hook "
            "that all-reduces without dividing (model.register_comm_hook(state, hook))."
        )
    if allreduce_always_fp32:
        raise NotImplementedError(
            "allreduce_always_fp32=True has no torch DDP argument: torch all-reduces gradients in their own dtype. "
            "Keep the parameters in fp32 (amp opt_level 'O1', or ampkit's '*-mixed' policies) so gradients are fp32, "
            "or register a communication hook that casts each bucket to fp32 (model.register_comm_hook(state, hook))."
        )
    factor = gradient_average_split_factor if gradient_average_split_factor is not None else gradient_predivide_factor
    if factor != 1.0:
        name = "gradient_average_split_factor" if gradient_average_split_factor is not None else "gradient_predivide_factor"
        raise NotImplementedError(
            f"{name}={factor} has no torch DDP argument: torch divides the summed gradients by the world size once. "
            f"Drop {name} (the average is the same; only its 16-bit rounding differs), or register a communication "
            "hook that divides before the all-reduce (model.register_comm_hook(state, hook))."
        )


def _refuse_cpu_sync_batchnorm(module: nn.Module) -> None:
    # torch's DDP refuses this too, but with "only work with GPU modules" and no way out; name the fix here.
    if any(t.device.type == "cuda" for t in module.parameters()):
        return
    names = [name for name, m in module.named_modules() if isinstance(m, nn.SyncBatchNorm)]
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise ValueError(
            f"SyncBatchNorm layers ({shown}) in a CPU module: torch synchronises batch statistics with CUDA kernels "
            "only, and its DistributedDataParallel refuses SyncBatchNorm on CPU. On CPU keep plain BatchNorm (skip "
            "apex.parallel.convert_syncbn_model, e.g. drop --sync_bn): each process then normalises over its own "
            "batch. Or move the model to CUDA first."
        )


class DistributedDataParallel(nn.parallel.DistributedDataParallel):
    """Apex's ``apex.parallel.DistributedDataParallel(module, ...)`` on torch's DDP.

    ``message_size`` sets the bucket size; ``device_ids`` is inferred from the module; Apex's
    ``enable_allreduce()``/``disable_allreduce()`` toggle gradient synchronisation as ``no_sync()`` does. Needs
    ``torch.distributed.init_process_group`` first.

    >>> DistributedDataParallel(nn.Linear(2, 1))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    RuntimeError: apex.parallel.DistributedDataParallel needs torch.distributed initialised: launch with torchrun...
    """

    def __init__(
        self,
        module: nn.Module,
        message_size: int = 10_000_000,
        delay_allreduce: bool = False,
        shared_param: Any = None,
        allreduce_trigger_params: Any = None,
        retain_allreduce_buffers: bool = False,
        allreduce_always_fp32: bool = False,
        num_allreduce_streams: int = 1,
        allreduce_communicators: Any = None,
        gradient_average: bool = True,
        gradient_predivide_factor: float = 1.0,
        gradient_average_split_factor: float | None = None,
        prof: bool = False,
    ) -> None:
        _refuse_numerics(shared_param, allreduce_always_fp32, gradient_average, gradient_predivide_factor, gradient_average_split_factor)
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(_NOT_INITIALISED)
        ignored = {
            "delay_allreduce": (delay_allreduce, "torch's DDP overlaps each bucket's all-reduce with the backward pass"),
            "allreduce_trigger_params": (allreduce_trigger_params is not None, "torch's DDP decides when a bucket is ready"),
            "retain_allreduce_buffers": (retain_allreduce_buffers, "torch's DDP keeps its own buckets"),
            "num_allreduce_streams": (num_allreduce_streams != 1, "the process group manages its streams"),
            "allreduce_communicators": (allreduce_communicators is not None, "the process group manages its communicators"),
            "prof": (prof, "use torch.profiler for communication timing"),
        }
        for name, (given, why) in ignored.items():
            if given:
                log.debug("ampkit.apex DistributedDataParallel: %s is performance-only and ignored: %s.", name, why)
        _refuse_cpu_sync_batchnorm(module)
        cap = bucket_cap_mb(module, message_size)
        device_ids = infer_device_ids(module)
        log.debug("ampkit.apex DistributedDataParallel: message_size=%d elements -> bucket_cap_mb=%.3g, device_ids=%s.", message_size, cap, device_ids)
        super().__init__(module, device_ids=device_ids, bucket_cap_mb=cap)
        self.message_size = message_size
        self.gradient_average = gradient_average
        self.gradient_predivide_factor = gradient_predivide_factor

    def enable_allreduce(self) -> None:
        """Synchronise gradients in the following backward passes again (Apex's name; torch: leave ``no_sync()``)."""
        self.require_backward_grad_sync = True

    def disable_allreduce(self) -> None:
        """Skip gradient synchronisation in the following backward passes, e.g. while accumulating (``no_sync()``)."""
        self.require_backward_grad_sync = False
