"""``apex.multi_tensor_apply`` as Apex shipped it without its CUDA extension: importable, unavailable.

Scripts import ``multi_tensor_applier`` at the top (Apex's ImageNet example, NVIDIA's BERT scripts) and most
only call it after testing ``multi_tensor_applier.available``. Real Apex built without ``amp_C`` answered
False there and raised only when called; so does this module. Its ops came from ``amp_C``, which ampkit does
not provide: torch's ``torch._foreach_*`` functions and fused optimizers do the same work.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MultiTensorApply", "multi_tensor_applier"]

_INSTEAD = (
    "ampkit provides no amp_C kernels. Use torch's multi-tensor ops instead: torch._foreach_mul_ / "
    "torch._foreach_add_ / torch._foreach_norm for scale, axpby and l2norm, a fused optimizer "
    "(torch.optim.AdamW(..., fused=True)) or apex.optimizers from ampkit.apex, and amp.scale_loss, which "
    "already unscales on torch's fused kernel."
)


class MultiTensorApply:
    """Apex's launcher for ``amp_C`` ops over lists of tensors; here ``available`` is always False.

    The attributes are Apex's (``available``, ``warned``, ``import_err``, ``chunk_size``), so code that picks
    a Python fallback when ``available`` is False takes it; calling raises, naming what to use instead.

    >>> multi_tensor_applier.available
    False
    >>> multi_tensor_applier(None, None, [[]])
    Traceback (most recent call last):
    ...
    RuntimeError: Attempted to call MultiTensorApply method, but MultiTensorApply is not available: ...
    """

    available = False
    warned = False
    # What Apex stored when `import amp_C` failed; scripts print it.
    import_err: ImportError = ModuleNotFoundError("No module named 'amp_C'", name="amp_C")

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size

    def check_avail(self) -> None:
        """Raise if the ``amp_C`` kernels are missing, which they always are here."""
        if not MultiTensorApply.available:
            raise RuntimeError(f"Attempted to call MultiTensorApply method, but MultiTensorApply is not available: {_INSTEAD}")

    def __call__(self, op: Any, noop_flag_buffer: Any, tensor_lists: Any, *args: Any) -> Any:
        self.check_avail()
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)  # pragma: no cover - never available


# Apex's module-level instance, with its chunk size (2048 * 32 elements).
multi_tensor_applier = MultiTensorApply(2048 * 32)
