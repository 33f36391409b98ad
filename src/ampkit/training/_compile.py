"""``Engine(compile=...)``: torch.compile applied to the engine's models, in place.

In place means the module object the engine trains stays the same: its ``state_dict`` keys never gain
``_orig_mod.``, so a checkpoint from a compiled run loads into an uncompiled one and back. The policy's casts and
hooks are inside the compiled call (autocast wraps it from outside, as torch documents).

- ``compile=True``: the whole model, one call.
- ``compile="regional"``: each repeated block (a transformer's layers; the blocks recompute and FSDP find),
  compiled once per shape of block and reused for every block of that shape, so a transformer's compile time
  stays that of one layer; a block whose shape no other has (a ResNet stage's first) compiles on its own, and a
  warning names it (see :mod:`ampkit.training._regions`).
- ``compile={...}``: options for ``torch.compile`` (``mode``, ``fullgraph``, ``dynamic``, ``backend``...), for the
  whole model; add ``"regional": True`` to apply them per block.

    >>> plan = compile_plan({"backend": "eager", "regional": True})
    >>> plan.regional, plan.options
    (True, {'backend': 'eager'})
    >>> compile_plan(False) is None
    True
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._compat import (
    compile_in_place,
    compile_template,
    compiled_original,
    module_instances_share_compiled_code,
)
from .._util.blocks import repeated_blocks
from ._regions import lone_blocks_reason, shape_groups

__all__ = ["CompilePlan", "apply_compile", "check_compile_plan", "compile_plan", "unwrap_user_compiled"]

log = logging.getLogger("ampkit")

_FORMS = "compile=True (the whole model), compile='regional' (each repeated block) or compile={torch.compile options}"


@dataclass(frozen=True)
class CompilePlan:
    """What to compile (the whole model, or each repeated block) and the options torch.compile gets."""

    regional: bool = False
    options: dict[str, Any] = field(default_factory=dict)


def compile_plan(spec: Any) -> CompilePlan | None:
    """The plan ``Engine(compile=spec)`` asks for; None for no compilation. Bad input names the accepted forms."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return CompilePlan()
    if spec == "regional":
        return CompilePlan(regional=True)
    if isinstance(spec, dict):
        options = dict(spec)
        regional = options.pop("regional", False)
        if not isinstance(regional, bool):
            # ValueError like every other bad compile= (the tests and callers catch one kind): a wrong value in the dict.
            raise ValueError(f"compile={spec!r}: 'regional' must be True or False.")  # noqa: TRY004
        if not all(isinstance(k, str) for k in options):
            raise ValueError(f"compile={spec!r}: the options are torch.compile's keyword arguments, named by strings.")
        return CompilePlan(regional=regional, options=options)
    raise ValueError(f"compile={spec!r} is not understood; pass {_FORMS}, or leave it off.")


def unwrap_user_compiled(models: list[nn.Module], plan: CompilePlan | None) -> tuple[list[nn.Module], CompilePlan | None]:
    """The models to train, with any ``torch.compile(module)`` wrapper replaced by the module inside it; the plan.

    The engine then trains that module, so names and checkpoint keys carry no ``_orig_mod.``, and compiles it in
    place after the policy and the strategy are applied. The wrapper's own options are private to torch: without
    an ``Engine(compile=...)`` the defaults apply.

    >>> import torch
    >>> inner = nn.Linear(2, 2); models, plan = unwrap_user_compiled([torch.compile(inner)], None)
    >>> models[0] is inner, plan
    (True, CompilePlan(regional=False, options={}))
    """
    inner = [compiled_original(m) for m in models]
    if all(m is None for m in inner):
        return models, plan
    if plan is None:
        plan = CompilePlan()
        log.info("setup() got a torch.compile'd model: training the module inside it, compiled in place "
                 "(pass Engine(compile={...}) to choose torch.compile's options)")
    return [m if i is None else i for m, i in zip(models, inner)], plan


def _blocks(model: nn.Module) -> list[str]:
    blocks = repeated_blocks(model)
    if not blocks:
        raise ValueError(
            f"compile='regional' found no repeated blocks in {type(model).__name__} (children of an nn.ModuleList or "
            "nn.Sequential whose type occurs twice or more); use compile=True to compile the whole model."
        )
    return blocks


def check_compile_plan(models: list[nn.Module], plan: CompilePlan | None) -> None:
    """Refuse a plan that cannot apply to ``models`` before setup changes them (casts, wrapping, sharding)."""
    if plan is not None and plan.regional:
        for model in models:
            _blocks(model)


def apply_compile(models: list[nn.Module], plan: CompilePlan) -> list[str]:
    """Compile ``models`` in place as ``plan`` says; return the compiled regions' names ('' for a whole model).

    Regional: the blocks of one shape (see :mod:`ampkit.training._regions`) share one code object, so one compile
    serves them all; each shape has its own, so no block recompiles another's code. A block whose shape no other
    block has compiles on its own, and a warning names it.
    """
    regions: list[str] = []
    # A code object per whole model, or per shape of block: its dynamo cache holds that region's graphs only, and
    # other engines in the process do not fill it (see _compat.own_code).
    for i, model in enumerate(models):
        prefix = f"model {i}: " if len(models) > 1 else ""
        if not plan.regional:
            compile_in_place(model, plan.options, compile_template())
            regions.append(prefix)
            continue
        blocks = _blocks(model)
        if module_instances_share_compiled_code():
            groups = shape_groups(model, blocks)
            reason = lone_blocks_reason(type(model).__name__, groups)
        else:  # this torch recompiles shared code per block: a code object each, so none hits the recompile limit
            groups = [[name] for name in blocks]
            reason = (f"compile='regional': torch {torch.__version__} guards each block's call by identity, so each of "
                      f"the {len(blocks)} blocks of {type(model).__name__} compiles on its own ({len(blocks)} compiles); "
                      "torch 2.13 compiles once per block shape.")
        for group in groups:
            template = compile_template()
            for name in group:
                compile_in_place(model.get_submodule(name), plan.options, template)
        if reason:
            log.warning("%s%s", prefix, reason)
        regions += [prefix + name for name in blocks]
    log.info("compiled %s", ", ".join(r or "the model" for r in regions))
    return regions
