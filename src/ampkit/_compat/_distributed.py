"""torch.distributed across releases: what gloo computes, DCP's metadata path, and the private caches of DTensor and
DeviceMesh that keep destroyed process groups alive. (The distributed classes themselves load lazily through
:mod:`ampkit._compat`'s face.)
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import torch

from ._version import TORCH_VERSION

__all__ = [
    "GLOO_REDUCE_SCATTER_AVERAGES",
    "clear_dtensor_caches",
    "clear_mesh_process_groups",
    "dcp_metadata_path",
    "fsdp_problem",
]

log = logging.getLogger("ampkit")

# gloo's reduce_scatter_tensor accepted ReduceOp.AVG and returned the sum before torch 2.9 (2.7.1 and 2.8.0
# measured; 2.9.1 averages). FSDP2 reduce-scatters fp32 and bf16 gradients with AVG, so on the CPU its gradients
# came out world-size times too large.
GLOO_REDUCE_SCATTER_AVERAGES = TORCH_VERSION >= "2.9"


def fsdp_problem(device_type: str, world_size: int) -> str | None:
    """Why FSDP2 would train wrongly on ``device_type`` with ``world_size`` ranks under this torch; None where it is fine.

    >>> fsdp_problem("cuda", 8) is None
    True
    """
    if device_type == "cpu" and world_size > 1 and not GLOO_REDUCE_SCATTER_AVERAGES:
        return (
            f"FSDP on the CPU needs torch>=2.9: torch {torch.__version__}'s gloo reduce-scatter returns the sum where "
            f"FSDP asks for the average, so every gradient would come out {world_size} times too large. Upgrade torch, "
            "or use strategy='ddp' on the CPU (FSDP on CUDA is unaffected)."
        )
    return None


def dcp_metadata_path(reader: Any, rank: int | None = None) -> Any:
    """The metadata file a ``torch.distributed.checkpoint.FileSystemReader`` reads (``<dir>/.metadata``).

    >>> from torch.distributed.checkpoint import FileSystemReader
    >>> str(dcp_metadata_path(FileSystemReader("/ckpt")))
    '/ckpt/.metadata'
    """
    # Newer torch has the private FileSystemReader._get_metadata_path (2.13 reads per-rank metadata files through
    # it); torch 2.7 lacks it and reads only <dir>/.metadata.
    method = getattr(reader, "_get_metadata_path", None)
    if method is not None:
        return method(rank)
    return reader.fs.concat_path(reader.path, ".metadata")


# DTensor's caches whose keys or values hold a DeviceMesh (and through it the process group), as
# (module, attribute path, clearing method); torch 2.13 names. Ones a torch release lacks are skipped.
_DTENSOR_CACHES = (
    ("torch.distributed.tensor.debug", "_clear_sharding_prop_cache", None),
    ("torch.distributed.tensor._redistribute", "clear_redistribute_planner_cache", None),
    ("torch.distributed.tensor._redistribute", "_gen_transform_infos", "cache_clear"),
    ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh", "cache_clear"),
    ("torch.distributed.tensor", "DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached", "cache_clear"),
)


def clear_dtensor_caches() -> None:
    """Empty DTensor's private caches that keep a DeviceMesh, and so its process groups, alive.

    >>> clear_dtensor_caches()  # nothing to do where DTensor never ran
    """
    if "torch.distributed.tensor" not in sys.modules:
        return  # DTensor never ran (DDP): nothing cached, and no import cost
    for module, path, method in _DTENSOR_CACHES:
        try:
            target: object = importlib.import_module(module)
            for name in path.split("."):
                target = getattr(target, name)
            (getattr(target, method) if method else target)()  # type: ignore[operator]
        except (ImportError, AttributeError):
            log.debug("no DTensor cache %s.%s in this torch", module, path)


def clear_mesh_process_groups(mesh: object) -> bool:
    """Empty a DeviceMesh's private registry of process groups (used only by torch.compile tracing).

    Returns whether it held any. torch 2.11's C++ DTensor path keeps meshes alive past shutdown; their registry
    would keep the destroyed groups, and their gloo threads, alive too.

    >>> clear_mesh_process_groups(object())
    False
    """
    registry = getattr(mesh, "_pg_registry", None)
    if not registry:
        return False
    registry.clear()
    return True
