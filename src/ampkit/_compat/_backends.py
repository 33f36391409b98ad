"""What the machine's backends can do and are set to: the CPU's bf16 instructions, and whether CUDA may run fp32
in TF32 (read through the per-backend settings where torch has them).
"""

from __future__ import annotations

import torch

__all__ = ["cpu_isa_probe", "cuda_allows_tf32", "per_backend_fp32_precision"]


def cpu_isa_probe(flag: str) -> bool | None:
    """Whether torch says this CPU has ``flag`` ("amx_bf16" or "avx512_bf16"); None where torch cannot say.

    >>> cpu_isa_probe("amx_bf16") in (True, False, None)
    True
    """
    # torch.cpu._is_avx512_bf16_supported and _is_amx_tile_supported are private; a torch without them is a None.
    probe = {"amx_bf16": "_is_amx_tile_supported", "avx512_bf16": "_is_avx512_bf16_supported"}[flag]
    fn = getattr(torch.cpu, probe, None)
    return bool(fn()) if fn is not None else None


def per_backend_fp32_precision() -> bool:
    """Whether torch keeps one fp32 precision per backend (``torch.backends.cuda.matmul.fp32_precision``, 2.9+).

    >>> from ampkit._compat import TORCH_VERSION
    >>> per_backend_fp32_precision() == (TORCH_VERSION >= "2.9")
    True
    """
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(
        getattr(torch.backends.cudnn, "conv", None), "fp32_precision"
    )


def cuda_allows_tf32(op: str) -> bool:
    """Whether torch's settings let CUDA run an fp32 ``op`` (``"matmul"`` or ``"conv"``) in TF32 at this moment.

    Read from the per-backend settings where torch has them (2.9+, where ``"none"`` defers to the parent:
    ``cudnn.conv``, then ``cudnn``, then the global one; ``cuda.matmul``, then the global one), else from the
    legacy flags. The legacy getters are not read on 2.9+: they raise once both APIs have been used.

    >>> cuda_allows_tf32("matmul") == (torch.backends.cuda.matmul.fp32_precision == "tf32" if per_backend_fp32_precision()
    ...                                 else torch.backends.cuda.matmul.allow_tf32)
    True
    """
    if op not in ("matmul", "conv"):
        raise ValueError(f"op must be 'matmul' or 'conv', got {op!r}.")
    if per_backend_fp32_precision():
        chain = [torch.backends.cuda.matmul] if op == "matmul" else [torch.backends.cudnn.conv, torch.backends.cudnn]
        for settings in [*chain, torch.backends]:
            value = getattr(settings, "fp32_precision", "none")
            if value != "none":
                return value == "tf32"
        return False
    return bool(torch.backends.cuda.matmul.allow_tf32 if op == "matmul" else torch.backends.cudnn.allow_tf32)
