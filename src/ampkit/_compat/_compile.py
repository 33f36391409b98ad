"""torch.compile and inductor: compiling a module in place, code objects of one's own, inductor settings per
region, and telling the compiler's errors and compilations apart (dynamo's private names, read without importing it).
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from ._version import TORCH_VERSION

__all__ = [
    "INDUCTOR_FOREACH_REORDER_ASSERTS",
    "compile_in_place",
    "compile_template",
    "compiled_original",
    "compiler_error",
    "foreach_region_inductor_config",
    "graphs_compiled",
    "module_instances_share_compiled_code",
    "own_code",
    "with_inductor_config",
]


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
