"""Every private torch API ampkit uses, and every difference between the torch releases it supports.

Nothing else in ampkit imports a private torch module or attribute, or tests torch's version for a feature: it
imports the name from here. When torch renames or removes one, this file is the one to change, and each entry
says which release added or moved what. ``torch._foreach_*`` ops are documented and stay direct at their call
sites; so do ``torch.ops.aten.*`` operator names (an operator's schema, not a Python API).

The distributed names (DTensor, FSDP2, DCP helpers) load on first access, as their import costs time that a
single-process run never needs.

    >>> from ampkit._compat import TORCH_VERSION, tree_leaves
    >>> TORCH_VERSION >= "2.4"
    True
    >>> tree_leaves({"a": 1, "b": (2, 3)})
    [1, 2, 3]
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.torch_version import TorchVersion

# Private modules that torch itself imports at start-up (no import cost here), with no public equivalent in
# any torch up to 2.13.
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import _get_current_function_mode_stack as current_function_modes
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_map_only, tree_unflatten

__all__ = [
    "TORCH_VERSION",
    "FSDP2_PUBLIC",
    "DTENSOR_PUBLIC",
    "ADAM_DECOUPLED_WEIGHT_DECAY",
    "MODULE_STATE_DICT_HOOKS_PUBLIC",
    "register_state_dict_post_hook",
    "register_load_state_dict_pre_hook",
    "FakeTensor",
    "FakeTensorMode",
    "TorchDispatchMode",
    "disable_current_modes",
    "current_function_modes",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_map_only",
    "tree_unflatten",
    "amp_update_scale_",
    "amp_non_finite_check_and_unscale_",
    "serialization_get_layout",
    "capturable_supported_devices",
    "autograd_sequence_nr",
    "node_sequence_nr",
    "cpu_isa_probe",
    "per_backend_fp32_precision",
    "step_supports_amp_scaling",
    "set_step_supports_amp_scaling",
    "clear_dtensor_caches",
    "clear_mesh_process_groups",
    "DTensor",  # noqa: F822 - resolved by __getattr__ on first use
    "FSDPModule",  # noqa: F822 - resolved by __getattr__ on first use
    "MixedPrecisionPolicy",  # noqa: F822 - resolved by __getattr__ on first use
    "fully_shard",  # noqa: F822 - resolved by __getattr__ on first use
    "set_element",  # noqa: F822 - resolved by __getattr__ on first use
    "flatten_state_dict",  # noqa: F822 - resolved by __getattr__ on first use
]

log = logging.getLogger("ampkit")

TORCH_VERSION = TorchVersion(torch.__version__)
"""The running torch's version; compares with strings and tuples (``TORCH_VERSION >= "2.6"``)."""

# torch 2.5 made DTensor public as torch.distributed.tensor; 2.4 has it only as torch.distributed._tensor.
DTENSOR_PUBLIC = TORCH_VERSION >= "2.5"
# torch 2.6 exports FSDP2 (fully_shard, FSDPModule, MixedPrecisionPolicy) from torch.distributed.fsdp; 2.4 and
# 2.5 have it only under torch.distributed._composable.fsdp.
FSDP2_PUBLIC = TORCH_VERSION >= "2.6"
# torch 2.5 made nn.Module's state-dict post-hook and load pre-hook public; 2.4 has them only under private names.
MODULE_STATE_DICT_HOOKS_PUBLIC = TORCH_VERSION >= "2.5"
# torch 2.7 gave Adam a decoupled_weight_decay argument (AdamW's update); earlier, only AdamW computes it.
ADAM_DECOUPLED_WEIGHT_DECAY = "decoupled_weight_decay" in inspect.signature(torch.optim.Adam.__init__).parameters

# The fused AMP kernels torch.amp.GradScaler itself launches (private ops, present since torch 1.x): aliases, not
# wrappers, so the per-step path pays no extra call.
amp_update_scale_ = torch._amp_update_scale_
amp_non_finite_check_and_unscale_ = torch._amp_foreach_non_finite_check_and_unscale_

# A global that torch.save's pickles of sparse and quantized tensors name; safe loaders must allow it by this name.
serialization_get_layout = torch.serialization._get_layout


def register_state_dict_post_hook(module: torch.nn.Module, hook: Callable[..., Any]) -> Any:
    """``module.register_state_dict_post_hook(hook)``: ``hook(module, state_dict, prefix, local_metadata)``.

    >>> handle = register_state_dict_post_hook(torch.nn.Linear(1, 1), lambda *args: None); handle.remove()
    """
    if MODULE_STATE_DICT_HOOKS_PUBLIC:
        return module.register_state_dict_post_hook(hook)
    return module._register_state_dict_hook(hook)  # same call, same arguments


def register_load_state_dict_pre_hook(module: torch.nn.Module, hook: Callable[..., Any]) -> Any:
    """``module.register_load_state_dict_pre_hook(hook)``: ``hook(module, state_dict, prefix, ...)``.

    >>> handle = register_load_state_dict_pre_hook(torch.nn.Linear(1, 1), lambda *args: None); handle.remove()
    """
    if MODULE_STATE_DICT_HOOKS_PUBLIC:
        return module.register_load_state_dict_pre_hook(hook)
    return module._register_load_state_dict_pre_hook(hook, with_module=True)  # the module first, as the public one


def capturable_supported_devices() -> list[str]:
    """The device types on which torch's optimizers accept ``capturable=True`` (CUDA-graph capture).

    >>> "cpu" in capturable_supported_devices()
    False
    """
    from torch.optim.optimizer import _get_capturable_supported_devices  # private, torch >= 2.3

    return list(_get_capturable_supported_devices())


def autograd_sequence_nr() -> int | None:
    """Autograd's per-thread count of the graph nodes created so far; None where torch lacks the counter.

    >>> isinstance(autograd_sequence_nr(), int)
    True
    """
    # torch.autograd._get_sequence_nr is private; looked up on each call so that a torch without it is a None.
    fn = getattr(torch.autograd, "_get_sequence_nr", None)
    return int(fn()) if fn is not None else None


def node_sequence_nr(node: object) -> int | None:
    """The creation number autograd gave graph node ``node`` (a ``grad_fn``); None for anything else.

    >>> x = torch.ones(1, requires_grad=True)
    >>> node_sequence_nr((x * 2).grad_fn) < node_sequence_nr((x * 3).grad_fn), node_sequence_nr(None)
    (True, None)
    """
    try:
        return int(node._sequence_nr())  # type: ignore[attr-defined]  # private method of autograd's Node
    except (AttributeError, RuntimeError):
        return None


def cpu_isa_probe(flag: str) -> bool | None:
    """Whether torch says this CPU has ``flag`` ("amx_bf16" or "avx512_bf16"); None where torch cannot say.

    >>> cpu_isa_probe("amx_bf16") in (True, False, None)
    True
    """
    # torch.cpu._is_avx512_bf16_supported and _is_amx_tile_supported are private; torch 2.4 has neither of them.
    probe = {"amx_bf16": "_is_amx_tile_supported", "avx512_bf16": "_is_avx512_bf16_supported"}[flag]
    fn = getattr(torch.cpu, probe, None)
    return bool(fn()) if fn is not None else None


def per_backend_fp32_precision() -> bool:
    """Whether torch keeps one fp32 precision per backend (``torch.backends.cuda.matmul.fp32_precision``, 2.9+).

    >>> per_backend_fp32_precision() == (TORCH_VERSION >= "2.9")
    True
    """
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(
        getattr(torch.backends.cudnn, "conv", None), "fp32_precision"
    )


def step_supports_amp_scaling(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` unscales gradients itself (torch's fused optimizers; private flag since 1.13).

    >>> w = torch.nn.Parameter(torch.zeros(2))
    >>> step_supports_amp_scaling(torch.optim.SGD([w], lr=0.1)), step_supports_amp_scaling(torch.optim.SGD([w], lr=0.1, fused=True))
    (False, True)
    """
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def set_step_supports_amp_scaling(optimizer: torch.optim.Optimizer, value: bool) -> None:
    """Tell torch's GradScaler (and ampkit's engine) whether ``optimizer.step`` may unscale the gradients itself.

    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, fused=True)
    >>> set_step_supports_amp_scaling(opt, False); step_supports_amp_scaling(opt)
    False
    """
    optimizer._step_supports_amp_scaling = value  # type: ignore[attr-defined]


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


# Names whose modules load on first access: attribute -> module, chosen by the running torch's version.
_LAZY: dict[str, str] = {
    "DTensor": "torch.distributed.tensor" if DTENSOR_PUBLIC else "torch.distributed._tensor",
    **dict.fromkeys(
        ("FSDPModule", "MixedPrecisionPolicy", "fully_shard"),
        "torch.distributed.fsdp" if FSDP2_PUBLIC else "torch.distributed._composable.fsdp",
    ),
    # What torch's own DefaultLoadPlanner uses to rebuild a nested state dict (private since torch 2.0).
    "set_element": "torch.distributed.checkpoint._traverse",
    "flatten_state_dict": "torch.distributed.checkpoint._nested_dict",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
