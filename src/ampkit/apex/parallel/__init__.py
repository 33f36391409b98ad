"""``apex.parallel`` on torch: DistributedDataParallel, SyncBatchNorm, convert_syncbn_model, LARC and more.

The submodules keep Apex's names (``apex.parallel.LARC``, ``.distributed``, ``.sync_batchnorm``) so imports
of either form work: ``from apex.parallel import LARC`` (the class) and ``from apex.parallel.LARC import LARC``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from .distributed import DistributedDataParallel
from .LARC import LARC
from .sync_batchnorm import SyncBatchNorm, convert_syncbn_model, create_syncbn_process_group

__all__ = ["DistributedDataParallel", "SyncBatchNorm", "convert_syncbn_model", "create_syncbn_process_group", "LARC", "ReduceOp"]

# Apex re-exported torch's reduce ops here.
ReduceOp = torch.distributed.ReduceOp if torch.distributed.is_available() else None


class _ParallelPackage(types.ModuleType):
    """Keeps ``parallel.LARC`` the class when the submodule of the same name is imported under another name.

    The import system binds a freshly loaded submodule as an attribute of its parent. Apex's package had the
    same name clash but loaded ``LARC.py`` only once, from its ``__init__``; through ``ampkit.apex.install()``
    the first ``import apex.parallel.LARC`` loads it again under the ``apex`` name, and that binding would
    replace the class with the module, breaking a later ``from apex.parallel import LARC``.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "LARC" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ParallelPackage
