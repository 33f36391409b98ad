"""Which torch is running, and the oldest one ampkit supports.

    >>> TORCH_VERSION >= OLDEST_TORCH
    True
"""

from __future__ import annotations

import torch
from torch.torch_version import TorchVersion

__all__ = ["OLDEST_TORCH", "TORCH_VERSION"]

TORCH_VERSION = TorchVersion(torch.__version__)
"""The running torch's version; compares with strings and tuples (``TORCH_VERSION >= "2.8"``)."""

OLDEST_TORCH = "2.7"
"""The oldest torch ampkit supports (pyproject.toml's floor; CI runs the library's unit tests on it).

What 2.7 gives that older releases lack, each found by running the unit tests on them:
- FSDP2 (``fully_shard``), DTensor and nn.Module's state-dict hooks under public names (2.4 and 2.5 have them
  only under private ones);
- FSDP2 on the CPU at all (torch 2.6's ``fully_shard`` calls ``Stream.record_event``, which CPU streams lack),
  so the leg can test sharded checkpoints; training with it on the CPU still needs 2.9 (:func:`fsdp_problem`);
- ``Adam(decoupled_weight_decay=True)``, the AdamW update that ``ampkit.apex.FusedAdam`` runs by default;
- ``torch.load(weights_only=True, map_location="cpu")`` of a checkpoint saved on a GPU (2.4 refuses CUDA
  storages before applying ``map_location``).
"""
