"""Every private torch API ampkit uses, and every difference between the torch releases it supports.

Nothing else in ampkit imports a private torch module or attribute, or tests torch's version for a feature: it
imports the name from here. When torch renames or removes one, this package is the one to change, and each entry
says which release added or moved what. ``torch._foreach_*`` ops are documented and stay direct at their call
sites; so do ``torch.ops.aten.*`` operator names (an operator's schema, not a Python API).

This module is the face: import every name from ``ampkit._compat``. Behind it, one module per part of torch:
:mod:`~ampkit._compat._version` (the running and the oldest supported torch), :mod:`~ampkit._compat._compile`
(torch.compile and inductor), :mod:`~ampkit._compat._distributed` (gloo, DCP, DTensor's caches),
:mod:`~ampkit._compat._autograd` (autograd's graph, dispatch modes, fake tensors), :mod:`~ampkit._compat._optim`
(the fused AMP kernels and the optimizers' private flags) and :mod:`~ampkit._compat._backends` (CPU instructions,
TF32 settings). A test that pretends to be another torch patches a flag where it is read, in its module
(``monkeypatch.setattr(_compat._distributed, "GLOO_REDUCE_SCATTER_AVERAGES", False)``): setting it here changes
nothing the functions see.

The distributed names (DTensor, FSDP2, DCP helpers) load on first access, as their import costs time that a
single-process run never needs.

    >>> from ampkit._compat import TORCH_VERSION, tree_leaves
    >>> TORCH_VERSION >= "2.7"
    True
    >>> tree_leaves({"a": 1, "b": (2, 3)})
    [1, 2, 3]
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

# Private modules that torch itself imports at start-up (no import cost here), with no public equivalent in
# any torch up to 2.13.
from torch.utils._pytree import (
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_map_only,
    tree_unflatten,
)

from ._autograd import (
    FakeTensor,
    FakeTensorMode,
    TorchDispatchMode,
    autograd_sequence_nr,
    current_function_modes,
    disable_current_modes,
    in_backward_node,
    node_sequence_nr,
    resize_storages,
)
from ._backends import cpu_isa_probe, cuda_allows_tf32, per_backend_fp32_precision
from ._compile import (
    INDUCTOR_FOREACH_REORDER_ASSERTS,
    compile_in_place,
    compile_template,
    compiled_original,
    compiler_error,
    foreach_region_inductor_config,
    graphs_compiled,
    module_instances_share_compiled_code,
    own_code,
    with_inductor_config,
)
from ._distributed import (
    GLOO_REDUCE_SCATTER_AVERAGES,
    clear_dtensor_caches,
    clear_mesh_process_groups,
    dcp_metadata_path,
    fsdp_problem,
)
from ._optim import (
    amp_non_finite_check_and_unscale_,
    amp_update_scale_,
    capturable_supported_devices,
    optimizer_has_step_hooks,
    set_step_supports_amp_scaling,
    step_supports_amp_scaling,
)
from ._version import OLDEST_TORCH, TORCH_VERSION

__all__ = [
    "GLOO_REDUCE_SCATTER_AVERAGES",
    "INDUCTOR_FOREACH_REORDER_ASSERTS",
    "OLDEST_TORCH",
    "TORCH_VERSION",
    "DTensor",  # resolved by __getattr__ on first use
    "FSDPModule",  # resolved by __getattr__ on first use
    "FakeTensor",
    "FakeTensorMode",
    "MixedPrecisionPolicy",  # resolved by __getattr__ on first use
    "TorchDispatchMode",
    "amp_non_finite_check_and_unscale_",
    "amp_update_scale_",
    "autograd_sequence_nr",
    "capturable_supported_devices",
    "clear_dtensor_caches",
    "clear_mesh_process_groups",
    "compile_in_place",
    "compile_template",
    "compiled_original",
    "compiler_error",
    "cpu_isa_probe",
    "cuda_allows_tf32",
    "current_function_modes",
    "dcp_metadata_path",
    "disable_current_modes",
    "flatten_state_dict",  # resolved by __getattr__ on first use
    "foreach_region_inductor_config",
    "fsdp_problem",
    "fully_shard",  # resolved by __getattr__ on first use
    "graphs_compiled",
    "in_backward_node",
    "module_instances_share_compiled_code",
    "node_sequence_nr",
    "optimizer_has_step_hooks",
    "own_code",
    "per_backend_fp32_precision",
    "resize_storages",
    "serialization_get_layout",
    "set_element",  # resolved by __getattr__ on first use
    "set_step_supports_amp_scaling",
    "step_supports_amp_scaling",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_map_only",
    "tree_unflatten",
    "with_inductor_config",
]

# A global that torch.save's pickles of sparse and quantized tensors name; safe loaders must allow it by this name.
serialization_get_layout = torch.serialization._get_layout

# Names whose modules load on first access: attribute -> module, chosen by the running torch's version.
_LAZY: dict[str, str] = {
    "DTensor": "torch.distributed.tensor",
    **dict.fromkeys(("FSDPModule", "MixedPrecisionPolicy", "fully_shard"), "torch.distributed.fsdp"),
    # What torch's own DefaultLoadPlanner uses to rebuild a nested state dict (private since torch 2.0).
    "set_element": "torch.distributed.checkpoint._traverse",
    "flatten_state_dict": "torch.distributed.checkpoint._nested_dict",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
