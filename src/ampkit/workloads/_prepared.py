"""A model (and optimizer) that ``accelerate.Accelerator.prepare()`` returned, back to the plain fp32 module the tools take.

``prepare()`` wraps a model in DDP (several processes) and, under mixed precision, patches its ``forward`` to run
under autocast and return fp32 outputs. The tools apply each precision policy themselves, so they need the module
inside: a forward that autocasts on its own would run every policy, 32-true included, in the Accelerator's precision.

The unwrapping is Accelerate's own (``extract_model_from_parallel``, ``keep_fp32_wrapper=False``), done on a shallow
copy of the module: the copy shares the weights (an optimizer of the model still maps onto it) but has its own
attribute dict, so the user's prepared model keeps its autocast forward for the training it was prepared for.
One INFO line says it happened. Accelerate is not imported unless the model shows a sign of it.

    >>> from torch import nn
    >>> plain = nn.Linear(2, 2)
    >>> unwrap_prepared(plain) is plain, unwrap_optimizer(None) is None
    (True, True)
"""

from __future__ import annotations

import copy
import logging
import sys
import types
from typing import Any

from torch import nn

from .._util.framework_versions import require

__all__ = ["unwrap_optimizer", "unwrap_prepared"]

log = logging.getLogger("ampkit")

_CONTAINERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


def _is_prepared(model: nn.Module) -> bool:
    inner = model
    while isinstance(inner, _CONTAINERS):
        inner = inner.module
    # Accelerate keeps the forward it replaced as `_original_forward`, in the instance's own dict.
    return inner is not model or "_original_forward" in vars(inner)


def unwrap_prepared(model: Any, what: str = "the tool") -> Any:
    """``model`` without what ``Accelerator.prepare()`` put around it (DDP, an autocast forward), or ``model`` itself.

    Anything that is not an ``nn.Module``, or a module with no sign of preparation, comes back as it was.
    """
    if not isinstance(model, nn.Module) or not _is_prepared(model):
        return model
    if "accelerate" in sys.modules:
        require("accelerate", what)
        from accelerate.utils import extract_model_from_parallel

        # keep_fp32_wrapper=True first: it only peels the containers, so nothing of the user's changes.
        inner = extract_model_from_parallel(model, keep_fp32_wrapper=True, keep_torch_compile=False)
    else:  # a DDP model from a plain torch script: the container is all there is
        inner = model
        while isinstance(inner, _CONTAINERS):
            inner = inner.module
    wrapped = [type(model).__name__] if inner is not model else []
    if "_original_forward" in vars(inner) and "accelerate" in sys.modules:
        clone = copy.copy(inner)  # its own __dict__: the user's module keeps its patched forward
        clone = extract_model_from_parallel(clone, keep_fp32_wrapper=False, keep_torch_compile=False)
        forward = vars(clone).get("forward")
        if isinstance(forward, types.MethodType) and forward.__self__ is not clone:
            # A forward bound to the original object would run the user's module, not the copy each policy trains.
            clone.forward = types.MethodType(forward.__func__, clone)
        if getattr(clone.forward, "__func__", None) is type(clone).forward:
            del clone.forward  # the class's own forward, as an unprepared module has it
        inner = clone
        wrapped.append("its autocast forward")
    log.info(
        "%s: unwrapped the model Accelerator.prepare() returned (%s) to the plain %s it wraps; each precision policy is "
        "applied by ampkit, from fp32", what, " and ".join(wrapped), type(inner).__name__,
    )
    return inner


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside an ``AcceleratedOptimizer`` (``prepare()``'s wrapper); anything else as it is."""
    if type(optimizer).__name__ == "AcceleratedOptimizer" and type(optimizer).__module__.startswith("accelerate."):
        return optimizer.optimizer
    return optimizer
