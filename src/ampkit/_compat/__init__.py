"""Every private torch API ampkit uses, and every difference between the torch releases it supports.

Nothing else in ampkit imports a private torch module or attribute, or tests torch's version for a feature: it
imports the name from here. When torch renames or removes one, this file is the one to change, and each entry
says which release added or moved what. ``torch._foreach_*`` ops are documented and stay direct at their call
sites; so do ``torch.ops.aten.*`` operator names (an operator's schema, not a Python API).

The distributed names (DTensor, FSDP2, DCP helpers) load on first access, as their import costs time that a
single-process run never needs.

    >>> from ampkit._compat import TORCH_VERSION, tree_leaves
    >>> TORCH_VERSION >= "2.7"
    True
    >>> tree_leaves({"a": 1, "b": (2, 3)})
    [1, 2, 3]
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Private modules that torch itself imports at start-up (no import cost here), with no public equivalent in
# any torch up to 2.13.
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import _get_current_function_mode_stack as current_function_modes
from torch.torch_version import TorchVersion
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes as disable_current_modes,
    _get_current_dispatch_mode_stack,
)
from torch.utils._pytree import (
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_map_only,
    tree_unflatten,
)

__all__ = [
    "GLOO_REDUCE_SCATTER_AVERAGES",
    "INDUCTOR_FOREACH_REORDER_ASSERTS",
    "OLDEST_TORCH",
    "TORCH_VERSION",
    "DTensor",  # noqa: F822 - resolved by __getattr__ on first use
    "FSDPModule",  # noqa: F822 - resolved by __getattr__ on first use
    "FakeTensor",
    "FakeTensorMode",
    "MixedPrecisionPolicy",  # noqa: F822 - resolved by __getattr__ on first use
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
    "flatten_state_dict",  # noqa: F822 - resolved by __getattr__ on first use
    "foreach_region_inductor_config",
    "fsdp_problem",
    "fully_shard",  # noqa: F822 - resolved by __getattr__ on first use
    "graphs_compiled",
    "in_backward_node",
    "module_instances_share_compiled_code",
    "node_sequence_nr",
    "optimizer_has_step_hooks",
    "own_code",
    "per_backend_fp32_precision",
    "resize_storages",
    "serialization_get_layout",
    "set_element",  # noqa: F822 - resolved by __getattr__ on first use
    "set_step_supports_amp_scaling",
    "step_supports_amp_scaling",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_map_only",
    "tree_unflatten",
    "with_inductor_config",
]

log = logging.getLogger("ampkit")

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

# The fused AMP kernels torch.amp.GradScaler itself launches (private ops, present since torch 1.x): aliases, not
# wrappers, so the per-step path pays no extra call.
amp_update_scale_ = torch._amp_update_scale_
amp_non_finite_check_and_unscale_ = torch._amp_foreach_non_finite_check_and_unscale_

# A global that torch.save's pickles of sparse and quantized tensors name; safe loaders must allow it by this name.
serialization_get_layout = torch.serialization._get_layout


def capturable_supported_devices() -> list[str]:
    """The device types on which torch's optimizers accept ``capturable=True`` (CUDA-graph capture).

    >>> "cpu" in capturable_supported_devices()
    False
    """
    from torch.optim.optimizer import (
        _get_capturable_supported_devices,  # private, torch >= 2.3
    )

    return list(_get_capturable_supported_devices())


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


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of the plain function ``fn`` with a code object of its own.

    Dynamo keeps compiled graphs and their guards per code object, up to ``recompile_limit`` (8) entries, then
    runs that code eagerly for good, logging once. A function compiled anew for each model or optimizer (every
    engine of a process: bench builds one per policy, a test suite hundreds) would fill the shared entries and
    silently stop compiling; with its own code object each gets a cache of its own, freed with it.

    >>> def f(): return 1
    >>> g = own_code(f); g(), g.__code__ is f.__code__
    (1, False)
    """
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _call_template() -> Callable[..., Any]:
    call: Callable[..., Any] | None = None

    def call_through(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)  # type: ignore[misc]

    return call_through


def compile_in_place(module: torch.nn.Module, options: dict[str, Any], template: Callable[..., Any] | None = None) -> None:
    """``torch.compile`` ``module``'s whole call (its hooks and forward) in place: same object, same state-dict keys.

    Modules compiled with the same ``template`` (from :func:`compile_template`) share dynamo's cache, so the
    repeated blocks of one model reuse one compiled graph; without one, the module gets a cache of its own.

    >>> m = torch.nn.Linear(2, 2); compile_in_place(m, {"backend": "eager"}); m(torch.ones(1, 2)).shape
    torch.Size([1, 2])
    """
    # nn.Module.compile() stores torch.compile(self._call_impl) in the private _compiled_call_impl, which
    # __call__ runs. Handing torch.compile _call_impl itself starts tracing in a torch.nn frame, which dynamo skips:
    # for a module whose forward is torch's own (nn.Sequential, nn.TransformerEncoderLayer) nothing is captured and
    # the model silently runs eagerly (torch 2.13). A function of ours in between makes dynamo trace from here and
    # inline the call, hooks included.
    template = template or compile_template()
    # The template's code object, with this module's call as its closure.
    compiled_call = types.FunctionType(template.__code__, template.__globals__, template.__name__, None, (types.CellType(module._call_impl),))
    module._compiled_call_impl = torch.compile(compiled_call, **options)  # type: ignore[assignment]


def compile_template() -> Callable[..., Any]:
    """A code object for :func:`compile_in_place` to share among the modules of one compilation (see :func:`own_code`)."""
    return own_code(_call_template())


@functools.cache
def module_instances_share_compiled_code() -> bool:
    """Whether modules of one shape compiled through one :func:`compile_template` share one graph (probed once).

    torch 2.13's dynamo guards a block's call by what it computes, so same-shape blocks share a compile; torch 2.7's
    guards the identity of each block's bound ``_call_impl``, so every block recompiles the shared code (and past
    ``recompile_limit`` runs eagerly). Probed, not read from the version: the release between that changed it is
    not pinned down here. Two tiny Linear layers on the eager backend: a fraction of a second, once per process.

    >>> isinstance(module_instances_share_compiled_code(), bool)
    True
    """
    template = compile_template()
    pair = [torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)]
    for module in pair:
        compile_in_place(module, {"backend": "eager"}, template)
    before = graphs_compiled()
    with torch.no_grad():
        for module in pair:
            module(torch.ones(1, 1))
    return graphs_compiled() - before == 1


def compiled_original(model: object) -> torch.nn.Module | None:
    """The module inside a ``torch.compile(module)`` wrapper; None for anything else.

    >>> m = torch.nn.Linear(2, 2); compiled_original(torch.compile(m)) is m, compiled_original(m)
    (True, None)
    """
    # torch.compile(module) returns torch._dynamo.eval_frame.OptimizedModule (private), holding it as _orig_mod;
    # recognised by name so that a run which never compiles never imports dynamo.
    if type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
        return model._orig_mod  # type: ignore[no-any-return,attr-defined]
    return None


# Inductor's loop reordering after fusion (config.loop_ordering_after_fusion) asserts on a foreach kernel from
# torch 2.7 to 2.11: FusedSchedulerNode.reorder_loops_by_dep_pair asserts that each part of the node is a plain
# SchedulerNode, and a ForeachKernelSchedulerNode (a FusedSchedulerNode) holds FusedSchedulerNodes once its parts
# have fused with another foreach kernel's or with a consumer. A reduction that shares a buffer with such a kernel
# (a gradient's norm or inf check beside the optimizer's foreach update) asks it to reorder in the last fusion
# round: the fused master step crashed so on an H200 with torch 2.11 (issue 34). torch 2.12 returns False
# there instead (pytorch/pytorch#176849). The switch is off by default up to 2.9 and on from 2.10 (unless
# TORCHINDUCTOR_LOOP_ORDERING_AFTER_FUSION=0); only GPU kernels are affected: CPU kernels group no foreach ops
# and skip the reordering (Scheduler.shared_data_after_reordering_loop returns at once for a CPU node).
INDUCTOR_FOREACH_REORDER_ASSERTS = TORCH_VERSION < "2.12"


def foreach_region_inductor_config(asserts: bool | None = None) -> dict[str, Any]:
    """The inductor settings a compiled region of foreach ops needs on this torch (``asserts``: whether the loop
    reordering defect above is present; default :data:`INDUCTOR_FOREACH_REORDER_ASSERTS`); empty where none.

    Loop reordering helps where two kernels walk one buffer in different orders (a transpose); an optimizer step
    walks every tensor in storage order, with little to reorder. Off is inductor's default up to 2.9; on the CPU
    the generated code is the same either way (torch 2.13, the fused master step of gpt small).

    >>> foreach_region_inductor_config(asserts=True), foreach_region_inductor_config(asserts=False)
    ({'loop_ordering_after_fusion': False}, {})
    """
    asserts = INDUCTOR_FOREACH_REORDER_ASSERTS if asserts is None else asserts
    return {"loop_ordering_after_fusion": False} if asserts else {}


def with_inductor_config(kwargs: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """``torch.compile`` keyword arguments ``kwargs`` with inductor ``config`` applied to that compilation alone.

    torch.compile hands ``options`` to inductor as a config patch around each compilation of the function (its
    recompilations included), so the process-wide ``torch._inductor.config`` keeps the user's settings and every
    other compiled function is untouched. Within the region, a key the caller set in ``kwargs["options"]`` wins;
    the same key set process-wide (``torch._inductor.config.X = ...``, or an environment variable) is overridden.
    torch.compile takes ``mode`` or ``options``, not both: a ``mode`` is turned into the options it stands for, as
    torch does itself. Another backend than inductor gets ``kwargs`` unchanged, and so do a ``mode`` and ``options``
    given together, for torch.compile to refuse as it always does.

    >>> with_inductor_config({"mode": "default"}, {"loop_ordering_after_fusion": False})
    {'options': {'loop_ordering_after_fusion': False}}
    >>> with_inductor_config({"options": {"loop_ordering_after_fusion": True}}, {"loop_ordering_after_fusion": False})
    {'options': {'loop_ordering_after_fusion': True}}
    >>> with_inductor_config({"backend": "aot_eager"}, {"loop_ordering_after_fusion": False})
    {'backend': 'aot_eager'}
    """
    both = kwargs.get("mode") is not None and kwargs.get("options") is not None
    if not config or both or kwargs.get("backend", "inductor") != "inductor":
        return dict(kwargs)
    out = dict(kwargs)
    mode = out.pop("mode", None)
    # torch.compile's own translation of a mode (torch._inductor.list_mode_options, private; present since 2.0).
    from torch._inductor import list_mode_options

    from_mode = list_mode_options(mode, out.get("dynamic")) if mode not in (None, "default") else {}
    out["options"] = {**config, **from_mode, **(out.get("options") or {})}
    return out


def compiler_error(error: BaseException) -> bool:
    """Whether ``error`` came from torch.compile compiling (dynamo tracing, a backend, inductor, the recompile
    limit under ``fullgraph``), rather than from running compiled code or from Python.

    torch.compile compiles on a function's first call (and on a recompilation), so its errors surface there. An
    error of the traced code's own ops also comes wrapped (``TorchRuntimeError``, from tracing with fake tensors):
    whether it is the compiler's or the program's, only running the same code uncompiled can tell.

    >>> compiler_error(RuntimeError("CUDA out of memory"))
    False
    """
    # Looked up, not imported: without dynamo loaded, nothing has compiled, and importing it costs a second.
    dynamo_exc = sys.modules.get("torch._dynamo.exc")
    if dynamo_exc is None:
        return False
    # TorchDynamoException: the base of BackendCompilerFailed (and of inductor's InductorError, which derives
    # from it), Unsupported (a graph break under fullgraph), TorchRuntimeError and InternalTorchDynamoError;
    # FailOnRecompileLimitHit derives from Exception alone. All present under these names from 2.7 to 2.13.
    kinds = tuple(k for k in (getattr(dynamo_exc, "TorchDynamoException", None), getattr(dynamo_exc, "FailOnRecompileLimitHit", None)) if k)
    return isinstance(error, kinds)


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
    # torch.cpu._is_avx512_bf16_supported and _is_amx_tile_supported are private; a torch without them is a None.
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


def graphs_compiled() -> int:
    """How many graphs torch.compile has compiled in this process so far, recompiles included (a dict read).

    Reads dynamo's own counter (``torch._dynamo.utils.counters["stats"]["unique_graphs"]``, private but stable
    since 2.0); when dynamo was never imported nothing has compiled, and importing it just to read 0 would cost
    seconds.

    >>> graphs_compiled() >= 0
    True
    """
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    return int(counters["stats"].get("unique_graphs", 0))


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


def in_backward_node() -> bool:
    """Whether this thread is running an autograd node's backward now (``torch._C._current_autograd_node``, private).

    >>> x = torch.ones(1, requires_grad=True); seen = []
    >>> _ = x.register_hook(lambda g: seen.append(in_backward_node()))
    >>> (x * 2).sum().backward(); in_backward_node(), seen
    (False, [True])
    """
    fn = getattr(torch._C, "_current_autograd_node", None)
    return fn is not None and fn() is not None


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


def optimizer_has_step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a step pre- or post-hook applies to ``optimizer`` (its own or a global one; private dicts since 2.0).

    A step that calls the optimizer's undecorated update (the fused master step) would bypass them. A hook whose
    ``ampkit_bypassable`` attribute is true does not count: the engine's guard against an ``optimizer.step()`` of
    the user's own (:mod:`ampkit.training._misuse`), which the engine's own steps need not run.

    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    >>> before = optimizer_has_step_hooks(opt)
    >>> handle = opt.register_step_post_hook(lambda *args: None)
    >>> before, optimizer_has_step_hooks(opt)
    (False, True)
    """
    from torch.optim import optimizer as optim_module

    own = [getattr(optimizer, "_optimizer_step_pre_hooks", None), getattr(optimizer, "_optimizer_step_post_hooks", None)]
    shared = [getattr(optim_module, "_global_optimizer_pre_hooks", None), getattr(optim_module, "_global_optimizer_post_hooks", None)]
    return any(not getattr(hook, "ampkit_bypassable", False) for hooks in (*own, *shared) if hooks for hook in hooks.values())


# DTensor's caches whose keys or values hold a DeviceMesh (and through it the process group), as
# (module, attribute path, clearing method); torch 2.13 names. Ones a torch release lacks are skipped.
_DTENSOR_CACHES = (
    ("torch.distributed.tensor.debug", "_clear_sharding_prop_cache", None),
    ("torch.distributed.tensor._redistribute", "clear_redistribute_planner_cache", None),
    ("torch.distributed.tensor._redistribute", "_gen_transform_infos", "cache_clear"),
    ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh", "cache_clear"),
    ("torch.distributed.tensor", "DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached", "cache_clear"),
)


def resize_storages(tensors: Sequence[torch.Tensor], nbytes: Sequence[int] | None) -> None:
    """Free (``nbytes=None``) or give back (one size per tensor) the storage under each tensor, keeping the tensors.

    The tensors keep their identity, shape and views (optimizers hold them), as FSDP frees its unsharded
    parameters. Resizing a storage dispatches no op, so a dispatch mode that counts live storages (such as
    ``ampkit.memory.LiveBytes``) cannot see it: each active mode with a ``storage_resized(storage)`` method is
    told instead.

    >>> t = torch.ones(4); resize_storages([t], None); t.untyped_storage().nbytes()
    0
    >>> resize_storages([t], [16]); t.shape, t.untyped_storage().nbytes()
    (torch.Size([4]), 16)
    """
    listeners = [m.storage_resized for m in _get_current_dispatch_mode_stack() if hasattr(m, "storage_resized")]
    for i, t in enumerate(tensors):
        storage = t.untyped_storage()
        storage.resize_(0 if nbytes is None else nbytes[i])
        for tell in listeners:
            tell(storage)


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
