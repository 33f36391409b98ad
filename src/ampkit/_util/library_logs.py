"""Optional libraries' import noise, dropped: the log lines torchao writes on import that concern nothing ampkit uses.

torchao logs each CUDA kernel library it cannot load ("Failed to load ..._C_cutlass_90a.abi3.so") on every import,
and torch warns about the Enums it registers as pytree constants. ampkit imports torchao only for the policies
that use it, but a user's model file may import it anyway (``transformers`` does), and those lines would then open
every command's output. :func:`quiet_library_logs` drops exactly those lines while a block runs; any other line
of the same loggers passes.

    >>> import logging
    >>> with quiet_library_logs(*TORCHAO_LOGGERS):
    ...     logging.getLogger("torchao").warning("Failed to load /x/_C_mxfp8.so: Could not load this library")
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["TORCHAO_LOGGERS", "quiet_library_logs"]

TORCHAO_LOGGERS = ("torchao", "torchao.kernel.intmm", "torch.utils._pytree")
"""The loggers torchao's import noise arrives on (torch's pytree module warns about torchao's registrations)."""


class _DropNoise(logging.Filter):
    """Drops the log lines of a torchao import that concern nothing ampkit uses."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # torchao loads its CUDA kernel libraries (cutlass sm90a, mxfp8) on import and logs each one a CPU-only or
        # other-Python install cannot load; its optimizers are torch.compile'd Python and need none of them.
        if record.name == "torchao" and message.startswith(("Failed to load", "Skipping import of cpp extensions")):
            return False
        # torchao's int8 matmul module announces on import that a CPU has no Triton; fp8 and the optimizers need none.
        if record.name == "torchao.kernel.intmm" and "Detected no triton" in message:
            return False
        # torch warns that torchao registers an Enum as a pytree constant: torchao's to change, not the user's.
        return not (record.name == "torch.utils._pytree" and "register_constant()" in message)


@contextlib.contextmanager
def quiet_library_logs(*loggers: str) -> Iterator[None]:
    """Drop, while importing or calling an optional library, its log lines that concern nothing ampkit uses."""
    noise = _DropNoise()
    for name in loggers:
        logging.getLogger(name).addFilter(noise)
    try:
        yield
    finally:
        for name in loggers:
            logging.getLogger(name).removeFilter(noise)
