"""``AmpkitAccelerator``: an ``accelerate.Accelerator`` whose mixed precision is an ampkit :class:`~ampkit.Engine`.

One line changes in an Accelerate script, and its loop stays as it is::

    accelerator = AmpkitAccelerator(precision="bf16-true-masters")     # was Accelerator(mixed_precision="bf16")
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()

Each of Accelerate's documented methods that touches precision hands its work to the engine; Accelerate keeps
everything else (devices, DDP, data loaders, accumulation, trackers, checkpoint folders):

* ``prepare`` / ``prepare_model``: ``engine.setup_module`` applies the policy (16-bit storage, fp32 islands, fp32
  values kept for the masters) before Accelerate moves the model and wraps it in DDP, so DDP registers the cast
  parameters; the forward then runs in ``engine.autocast()`` (:mod:`~ampkit.accelerate._forward`).
* ``prepare_optimizer``: ``engine.setup_optimizers`` (masters cloned and swapped in, bf16-true-kahan/-sr's library
  twins, the kernel guards), wrapped as an :class:`~ampkit.accelerate.AmpkitOptimizer` whose ``step()`` is the
  engine's. The engine's own accumulation stays at 1: Accelerate owns the window.
* ``backward``: Accelerate's division by ``gradient_accumulation_steps``, then ``engine.backward`` (the loss scale).
* ``unscale_gradients`` / ``clip_grad_norm_`` / ``clip_grad_value_``: ``engine.unscale_`` first (GradScaler's
  protocol: unscaled gradients, copied to the masters), then the clip of the parameters the optimizers step (a
  model parameter's master where it has one); ``clip_grad_norm_`` returns the norm before clipping, as Accelerate's.
* ``save_state`` / ``load_state``: the engine's state as ``ampkit_state.pt`` in the same folder
  (:mod:`~ampkit.accelerate._state_file`), read (and checked) before Accelerate loads anything, applied after.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import AutocastKwargs
from torch import nn

from ..policy import Policy
from ..scaling import ScalerConfig, StepScaler
from ..training import Engine
from ._checks import check_accelerate_kwargs, check_distributed_type, check_plain_model
from ._forward import run_forward_in
from ._optimizer import AmpkitOptimizer, StepLedger
from ._state_file import read_engine_state, write_engine_state

__all__ = ["AmpkitAccelerator"]

log = logging.getLogger("ampkit")


class AmpkitAccelerator(Accelerator):
    """``accelerate.Accelerator`` with an ampkit precision policy, loss scaler and optimizer step (module docstring).

    Args:
        precision: an ampkit policy name or alias (``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true-masters"``...) or a
            Policy; an unknown name raises :class:`~ampkit.PolicyError` naming the closest.
        scaler: loss scaling (default: the policy's); ``"dynamic"``, ``"none"``, a float, an
            :class:`ampkit.ScalerConfig` (hysteresis, floor, ceiling, collapse diagnosis) or a scaler of your own.
        keep_fp32: module names (wildcards allowed) or types that run in fp32, added to the policy's.
        numerics: sample how gradients and activations fit fp16 every N optimizer steps (``accelerator.engine.numerics``).
        accelerate_kwargs: the ``Accelerator``'s own arguments, except ``mixed_precision`` (other than ``"no"``),
            DeepSpeed, FSDP, Megatron-LM and tensor/context parallelism, ``GradScalerKwargs`` and ``AutocastKwargs``:
            each is refused, naming what to drop.

    >>> from ampkit.accelerate import AmpkitAccelerator
    >>> accelerator = AmpkitAccelerator("bf16-true-masters", cpu=True)
    >>> model = nn.Linear(4, 2); opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    >>> model, opt = accelerator.prepare(model, opt)
    >>> model.weight.dtype, opt.param_groups[0]["params"][0].dtype  # bf16 model, fp32 masters stepped
    (torch.bfloat16, torch.float32)
    """

    def __init__(self, precision: str | int | Policy, *, scaler: StepScaler | ScalerConfig | str | float | None = None,
                 keep_fp32: Sequence[str | type[nn.Module]] = (), numerics: Any = None, **accelerate_kwargs: Any) -> None:
        # The engine first: an unknown policy or scaler is named before Accelerate sets up its process state.
        self._engine_args: dict[str, Any] = dict(precision=precision, scaler=scaler, keep_fp32=keep_fp32, numerics=numerics)
        engine = Engine(precision, scaler=scaler, keep_fp32=keep_fp32, numerics=numerics)
        check_accelerate_kwargs(engine.policy.name, accelerate_kwargs)
        super().__init__(**{**accelerate_kwargs, "mixed_precision": "no"})
        check_distributed_type(engine.policy.name, self.distributed_type)
        self._engine = engine
        self._ledger = StepLedger()
        self._new_run = False  # after free_memory(): a model not seen yet starts a new engine
        self._loading: dict[str, Any] | None = None
        self._masters_of: tuple[Any, dict[int, torch.Tensor]] | None = None
        self.register_load_state_pre_hook(self._read_state)  # Accelerate's load_state resolves the folder, then calls it

    @property
    def engine(self) -> Engine:
        """The :class:`ampkit.Engine` that runs the precision: read ``engine.scale``, ``engine.skipped_steps``,
        ``engine.masters``, ``engine.numerics``..."""
        return self._engine

    @property
    def precision(self) -> str:
        """The policy's name (Accelerate's ``mixed_precision`` is ``"no"``: the policy replaces it)."""
        return self._engine.policy.name

    # ------------------------------------------------------------------------------------------ prepare
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Accelerate's ``prepare``, with the policy applied to every model first and every optimizer adopted by the
        engine in one call (whatever their order in ``args``); returns the prepared objects in order."""
        self._set_up_models([a for a in args if isinstance(a, nn.Module)])
        adopted = self._adopt([a for a in args if isinstance(a, torch.optim.Optimizer)])
        return super().prepare(*[adopted.get(id(a), a) for a in args], device_placement=device_placement)

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False) -> Any:
        """The policy applied to ``model`` (``engine.setup_module``) and its forward run in the engine's context, then
        Accelerate's ``prepare_model`` (device, DDP). A model prepared before is returned as Accelerate returns it."""
        if getattr(model, "_is_accelerate_prepared", False):
            return super().prepare_model(model, device_placement=device_placement, evaluation_mode=evaluation_mode)
        self._set_up_models([model])
        run_forward_in(model, self._engine)
        return super().prepare_model(model, device_placement=device_placement, evaluation_mode=evaluation_mode)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None) -> Any:
        """The optimizer adopted by the engine (``engine.setup_optimizers``) and wrapped as an :class:`AmpkitOptimizer`."""
        if getattr(optimizer, "_is_accelerate_prepared", False):
            if optimizer not in self._optimizers:
                self._optimizers.append(optimizer)
            return optimizer
        stepped = self._adopt([optimizer]).get(id(optimizer), optimizer)
        wrapped = AmpkitOptimizer(stepped, self._engine, self._ledger, device_placement=self.device_placement if device_placement is None else device_placement)
        self._optimizers.append(wrapped)
        return wrapped

    def _set_up_models(self, models: list[nn.Module]) -> None:
        models = [m for m in models if not getattr(m, "_is_accelerate_prepared", False)]
        if not models:
            return
        for m in models:
            check_plain_model(m)
        held = self._engine.models
        if held and all(any(m is h for h in held) for m in models):
            return
        if held and self._new_run:
            self._engine = Engine(**self._engine_args)  # a new training run (the Trainer's model_init, a second train())
            self._ledger = StepLedger()
        elif held:
            raise RuntimeError(
                "AmpkitAccelerator.prepare(): the precision policy was applied to other models already, and the engine sets up "
                "its models once; pass every model in one call: accelerator.prepare(model_a, model_b, optimizer, ...)."
            )
        self._new_run = False
        device = self.device if self.device_placement else None
        self._engine.setup_module(models if len(models) > 1 else models[0], device=device)

    def _adopt(self, optimizers: list[torch.optim.Optimizer]) -> dict[int, torch.optim.Optimizer]:
        """The engine's adoption of ``optimizers`` (not prepared yet), in one call: {id(given): the one to step}."""
        fresh = [o for o in optimizers if not isinstance(o, AcceleratedOptimizer) and not getattr(o, "_is_accelerate_prepared", False)
                 and not any(o is a for a in self._engine.optimizers)]
        if not fresh:
            return {}
        if not self._engine.models:
            raise RuntimeError("AmpkitAccelerator.prepare_optimizer() before the model: the precision policy is applied to the model "
                               "first; pass both in one call, accelerator.prepare(model, optimizer).")
        if self._engine.policy.convert_optimizers.__func__ is not Policy.convert_optimizers:  # type: ignore[attr-defined]
            scheduled = [type(o).__name__ for o in fresh if any("initial_lr" in g for g in o.param_groups)]
            if scheduled:
                raise ValueError(
                    f"AmpkitAccelerator(precision={self.precision!r}) steps {scheduled} through its library twin, built in prepare(); "
                    "an LR scheduler built before prepare() would go on scheduling the optimizer it replaces. Build the scheduler "
                    "after prepare(), on the optimizer prepare() returns: model, opt = accelerator.prepare(model, opt); "
                    "scheduler = accelerator.prepare(make_scheduler(opt))."
                )
        stepped = self._engine.setup_optimizers(*fresh)
        return {id(o): s for o, s in zip(fresh, stepped)}

    def free_memory(self, *objects: Any) -> Any:
        """Accelerate's ``free_memory``; the next model prepared that the engine has not seen starts a new engine (a new
        run: the Trainer calls this at the start of every ``train()``)."""
        self._new_run = True
        return super().free_memory(*objects)

    # ------------------------------------------------------------------------------------------ the step
    @contextlib.contextmanager
    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Iterator[None]:
        """The policy's forward context (``engine.autocast()``). ``AutocastKwargs(enabled=False)`` runs the block in
        fp32 inside it, as with Accelerate."""
        if autocast_handler is not None and (autocast_handler.enabled or autocast_handler.cache_enabled is not None):
            raise ValueError("AmpkitAccelerator.autocast(handler): the policy sets the autocast; only AutocastKwargs(enabled=False) "
                             "(an fp32 block) is taken. For modules that must always run in fp32, pass keep_fp32=[...].")
        with self._engine.autocast():
            if autocast_handler is None:
                yield
            else:
                with torch.autocast(self._engine.device.type, enabled=False):
                    yield

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss`` divided by ``gradient_accumulation_steps`` (as Accelerate's), then ``engine.backward`` (the loss scale)."""
        kwargs.pop("learning_rate", None)  # LOMO's, which fuses its step into the backward: not an engine optimizer
        self._engine.backward(loss / self.gradient_accumulation_steps, **kwargs)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """``engine.unscale_`` of ``optimizer`` (default: all prepared), once per step: unscaled gradients, copied to the
        masters where there are. Refused inside an accumulation window (later backward passes would add scaled ones)."""
        opts = self._optimizers if optimizer is None else optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        inner = [_innermost(o) for o in opts]
        todo = [o for o in inner if id(o) not in self._ledger.unscaled and any(o is a for a in self._engine.optimizers)]
        if not todo:
            return
        if not self.sync_gradients:
            raise RuntimeError(
                "accelerator.clip_grad_norm_()/unscale_gradients() inside an accumulation window (accelerator.sync_gradients is "
                "False): the next backward would add scaled gradients to unscaled ones. Clip at the window's end: "
                "`if accelerator.sync_gradients: accelerator.clip_grad_norm_(...)`."
            )
        self._engine.unscale_(*todo)
        self._ledger.unscaled.update(id(o) for o in todo)  # until each one's step (AmpkitOptimizer.step) takes them

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor] | torch.Tensor, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Unscale (once per step), then clip the gradients the optimizers step to ``max_norm``: a model parameter's
        master where it has one. Returns the total norm before clipping (of the unscaled gradients)."""
        params = self._stepped(parameters)
        return super().clip_grad_norm_(params, max_norm, norm_type=norm_type)  # calls unscale_gradients() first

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor] | torch.Tensor, clip_value: float) -> None:
        """Unscale (once per step), then clamp the gradients the optimizers step (masters where there are)."""
        super().clip_grad_value_(self._stepped(parameters), clip_value)

    def _stepped(self, parameters: Iterable[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
        """``parameters`` with each model parameter that has a master replaced by it (what the optimizers step)."""
        given = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        masters = self._engine.masters
        if masters is None:
            return given
        if self._masters_of is None or self._masters_of[0] is not masters:  # built once per run: the pairs never change
            self._masters_of = (masters, {id(p): m for p, m in zip(masters.model_params, masters.masters)})
        by_model = self._masters_of[1]
        return [by_model.get(id(p), p) for p in given]  # one lookup per tensor, as Accelerate's own list(parameters)

    # ------------------------------------------------------------------------------------------ checkpoints
    def save_state(self, output_dir: str | None = None, safe_serialization: bool = True, **save_model_func_kwargs: Any) -> Any:
        """Accelerate's ``save_state``, and the engine's state as ``ampkit_state.pt`` in the same folder (written by the
        process that writes the model)."""
        location = super().save_state(output_dir, safe_serialization=safe_serialization, **save_model_func_kwargs)
        writer = self.is_local_main_process if self.project_configuration.save_on_each_node else self.is_main_process
        if writer and self._engine.models:
            write_engine_state(self._engine, location)
        return location

    def _read_state(self, models: list[nn.Module], input_dir: str) -> None:
        # Accelerate's load-state pre-hook, called once the folder is known and before anything is loaded: a damaged or
        # mismatched ampkit_state.pt is refused while the run is still as it was.
        self._loading = read_engine_state(self._engine, input_dir) if self._engine.models else None

    def load_state(self, input_dir: str | None = None, load_kwargs: dict[str, Any] | None = None, **load_model_func_kwargs: Any) -> None:
        """Accelerate's ``load_state``, and the engine's state from ``ampkit_state.pt`` (checked before Accelerate loads
        anything; a folder without it keeps the engine's state, with a warning)."""
        self._loading = None
        super().load_state(input_dir, load_kwargs=load_kwargs, **load_model_func_kwargs)
        state, self._loading = self._loading, None
        if state is not None:
            self._engine.load_state_dict(state)

    def __repr__(self) -> str:
        return f"AmpkitAccelerator(precision={self.precision!r}, device={str(self.device)!r}, distributed_type={self.distributed_type.value!r})"


def _innermost(opt: Any) -> Any:
    while isinstance(opt, AcceleratedOptimizer):
        opt = opt.optimizer
    return opt
