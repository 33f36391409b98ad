"""``AmpkitPrecision``: an ampkit policy, its loss scaler, masters and guards as a Lightning precision plugin.

One plugin for both of Lightning's front ends, through the hooks Lightning gives every precision plugin:

* ``convert_module`` (the strategy calls it before it moves the model to its device and wraps it for DDP): the
  policy is applied to the model (:meth:`ampkit.Engine.setup_module`): 16-bit storage, fp32 islands, the fp32 values
  its master weights will be cloned from. Under DDP every rank first takes rank 0's weights, so the masters agree.
* ``connect`` (Trainer, once ``configure_optimizers`` built the optimizers on the converted model), or the first
  ``optimizer_step`` of each optimizer (Fabric, which has no such hook): :meth:`ampkit.Engine.setup_optimizers` puts
  the fp32 masters in the optimizers and installs the kernel guards.
* ``train_step_context`` / ``forward_context``: the policy's autocast; ``backward``: the engine's scaled backward,
  through ``LightningModule.backward`` under the Trainer; ``optimizer_step``: the closure (forward and backward), then
  the gradients unscaled (and copied to the masters) before Lightning's ``on_before_optimizer_step`` hooks and
  gradient clipping see them, as Lightning's own AMP plugin does, then the engine's step, which skips a step whose
  gradients overflowed and updates the scale.
* ``state_dict`` / ``load_state_dict``: the engine's state (scaler, masters, counters, the rounding stream) in
  Lightning's own checkpoint, under this class's name; Fabric users put the plugin in the state they save.

The loop stays Lightning's: it accumulates (``accumulate_grad_batches``), blocks DDP's gradient sync inside a window,
and steps the LR schedulers; the engine inside runs with ``accumulate=1``. Two differences from Lightning's own plugins,
both what ampkit's Engine does: an LR scheduler stepped per optimizer step does not step after a step skipped for
overflow (Lightning's AMP plugin steps it anyway), and under a master-weight policy the gradients the hooks and the
clipping should read are the optimizer's parameters' (the fp32 masters, unscaled), not the 16-bit model's, which stay
as the backward left them. Lightning's ``FSDPStrategy`` takes only its own FSDP plugin; shard with FSDP2 in
``configure_model`` under ``ModelParallelStrategy`` instead (the mixed policies; see :meth:`AmpkitPrecision.convert_module`).
Under Fabric, ``fabric.clip_gradients(..., error_if_nonfinite=False)``: a step that overflowed is skipped, not an error.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from .._util.framework_versions import require
from ..distributed._ddp import broadcast_from_rank0
from ..policy import Policy, get_policy
from ..policy._islands import cast_floating
from ..scaling import ScalerConfig, StepScaler
from ..training import Engine
from ._parts import StepsOnRealSteps, default_device, lightning_name, sharded, twin_with_scheduler

require("lightning", "ampkit.lightning")

import lightning.pytorch as pl
from lightning.pytorch.plugins.precision import Precision

__all__ = ["AmpkitPrecision"]

log = logging.getLogger("ampkit")


class AmpkitPrecision(Precision):
    """An ampkit precision policy as a Lightning precision plugin, for the Trainer and for Fabric.

    Args:
        precision: any ampkit policy name or alias (``"bf16-true-masters"``, ``"16-mixed"``, ``"O2"``) or a Policy.
        scaler: loss scaling (default: the policy's): ``"dynamic"``, ``"none"``, a float (static), a
            :class:`ampkit.ScalerConfig` (hysteresis, floor, ceiling, collapse diagnosis) or a scaler of your own.
        clip_grad_norm: clip the gradients' total norm inside ampkit's step, on unscaled (master) gradients.
            Lightning's own ``Trainer(gradient_clip_val=...)`` works too (clipped after ampkit unscales); set one of
            the two.
        clip_grad_value: clamp unscaled (master) gradients to this absolute value inside ampkit's step (exclusive
            with ``clip_grad_norm``; as with it, set this or Lightning's own clipping, not both).
        keep_fp32: module names (shell wildcards) or types kept in fp32, added to the policy's.
        numerics: sample how gradients and activations fit 16 bits every N optimizer steps (an int, or a
            :class:`ampkit.numerics.NumericsSampler`); ``plugin.engine.numerics.last`` holds the last sample.
        device: where the model trains, when the plugin cannot tell (Fabric: default CUDA when there is one, else CPU;
            under the Trainer it is the strategy's device). Checked once the model is there.

    >>> import lightning as L
    >>> trainer = L.Trainer(plugins=[AmpkitPrecision("bf16-true-masters")], accelerator="cpu", logger=False,
    ...                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    >>> trainer.precision_plugin.policy.name, trainer.precision
    ('bf16-true-masters', 'bf16-true')
    """

    def __init__(
        self,
        precision: str | Policy = "bf16-mixed",
        *,
        scaler: StepScaler | ScalerConfig | str | float | None = None,
        clip_grad_norm: float | None = None,
        clip_grad_value: float | None = None,
        keep_fp32: Sequence[str | type[nn.Module]] = (),
        numerics: Any = None,
        device: str | torch.device | None = None,
    ) -> None:
        self.policy = get_policy(precision, keep_fp32=keep_fp32)
        self.precision = lightning_name(self.policy)  # type: ignore[assignment]  # Lightning types it as its own names
        # Built now, so that a bad argument fails where the plugin is written, not when the Trainer starts.
        self.engine = Engine(self.policy, scaler=scaler, clip_grad_norm=clip_grad_norm, clip_grad_value=clip_grad_value, numerics=numerics)
        self._device = torch.device(device) if device is not None else None
        self._module: nn.Module | None = None
        self._pending_state: dict[str, Any] | None = None  # loaded before the optimizers came (Fabric)

    def __repr__(self) -> str:
        return f"AmpkitPrecision({self.policy.name!r})"

    # ------------------------------------------------------------------------------------------ setup
    def convert_module(self, module: nn.Module) -> nn.Module:
        if self._module is not None:
            if module is self._module:
                return module  # a second fit() (or validate after fit) of the same model: converted already
            raise RuntimeError(
                "AmpkitPrecision holds the state of one model's run (its loss scale, masters, counters) and was given a second "
                "model; give each Trainer or Fabric its own plugin: plugins=[AmpkitPrecision(...)] per Trainer."
            )
        trainer = getattr(module, "_trainer", None)
        device = self._device or (trainer.strategy.root_device if trainer is not None else default_device())
        if sharded(module):
            if self.policy.casts_parameters():
                raise ValueError(
                    f"{self!r} on a model sharded by FSDP2 (fully_shard in configure_model): the policy stores the weights in 16 "
                    "bits, which FSDP2 does through its own mixed precision, sharding the fp32 masters. Pass "
                    f"mp_policy=ampkit.get_policy({self.policy.name!r}).fsdp_mixed_precision() to fully_shard and train with "
                    "AmpkitPrecision('bf16-mixed') or '16-mixed' (the shards stay fp32), or use ampkit's own "
                    f"Engine({self.policy.name!r}, strategy='fsdp')."
                )
        elif self.policy.master_weights:
            # Every rank takes rank 0's weights before the fp32 values for the masters are kept: DDP broadcasts rank 0's
            # weights when it wraps the model, which comes after, and would leave each rank's masters its own.
            broadcast_from_rank0([module])
        self._module = self.engine.setup_module(module, device=device)
        return self._module

    def connect(self, model: nn.Module, optimizers: list[torch.optim.Optimizer], lr_scheduler_configs: list[Any]) -> tuple[nn.Module, list[torch.optim.Optimizer], list[Any]]:
        """Trainer: adopt the optimizers ``configure_optimizers`` built on the converted model."""
        if not optimizers or self.engine.optimizers:
            return model, optimizers, lr_scheduler_configs
        trainer = getattr(_lightning_module(model), "_trainer", None)
        if trainer is not None and trainer.gradient_clip_val and (self.engine.clip_grad_norm or self.engine.clip_grad_value):
            raise ValueError(
                f"Received both Trainer(gradient_clip_val={trainer.gradient_clip_val}) and clipping in {self!r}: choose one. "
                "Either clips the unscaled (master) gradients."
            )
        adopted = self._adopt(optimizers)
        swapped = {id(old): new for old, new in zip(optimizers, adopted) if old is not new}
        for config in lr_scheduler_configs:
            if id(config.scheduler.optimizer) in swapped:
                raise ValueError(twin_with_scheduler(self.policy, type(config.scheduler.optimizer).__name__))
            if config.interval == "step" and not config.reduce_on_plateau and len(adopted) == 1 and self.engine.skip_nonfinite:
                config.scheduler = StepsOnRealSteps(config.scheduler, self.engine)
        return model, list(adopted), lr_scheduler_configs

    def _adopt(self, optimizers: Sequence[torch.optim.Optimizer]) -> tuple[torch.optim.Optimizer, ...]:
        try:
            adopted = self.engine.setup_optimizers(*optimizers)
        except ValueError as exc:
            if "LR scheduler is attached" in str(exc):
                raise ValueError(twin_with_scheduler(self.policy, type(optimizers[0]).__name__)) from exc
            raise
        if self._pending_state is not None:
            # Fabric: loaded before the loop, applied at the first step, after that step's backward passes ran: the
            # loaded counters replace the engine's, and those backward passes count again (their gradients are here).
            state, self._pending_state = self._pending_state, None
            backwards = self.engine.step_state.backwards
            self.engine.load_state_dict(state)
            for _ in range(backwards):
                self.engine.step_state.note_backward()
        return adopted

    def setup_optimizers(self, *optimizers: Any) -> None:
        """Fabric: adopt the optimizers now rather than at their first step. Needed under a master-weight policy before
        ``fabric.load(...)`` fills an optimizer's state: Fabric shows a precision plugin no optimizer until it steps, and
        a state loaded before the fp32 masters are in the optimizer is cast to the 16-bit weights' dtype.

        >>> import lightning as L
        >>> fabric = L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision("bf16-true-masters")])
        >>> model = nn.Linear(2, 2); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> model, optimizer = fabric.setup(model, optimizer)
        >>> fabric.strategy.precision.setup_optimizers(optimizer)
        >>> model.weight.dtype, optimizer.param_groups[0]["params"][0].dtype
        (torch.bfloat16, torch.float32)
        """
        for optimizer in optimizers:
            self._adopted(getattr(optimizer, "optimizer", optimizer))  # a _FabricOptimizer wraps the one the engine steps

    def _adopted(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Fabric: the optimizer as the engine steps it, adopted at its first use (Fabric has no connect hook)."""
        if any(optimizer is o for o in self.engine.optimizers):
            return optimizer
        if self._module is None:
            raise RuntimeError("AmpkitPrecision saw an optimizer before the model: call fabric.setup(model, optimizer) first.")
        if self.policy.master_weights and optimizer.state:
            raise RuntimeError(
                f"{self.policy.name} under Fabric: the {type(optimizer).__name__} holds state (loaded, or stepped outside the plugin) "
                "before AmpkitPrecision put the fp32 master weights in it, so that state was cast to the 16-bit weights' dtype. "
                "Right after fabric.setup(model, optimizer), call fabric.strategy.precision.setup_optimizers(optimizer), then "
                "fabric.load(...)."
            )
        (adopted,) = self._adopt([optimizer])
        if adopted is not optimizer:
            raise ValueError(
                f"{self.policy.name} under Fabric: the policy steps a library twin of {type(optimizer).__name__}, which Fabric would "
                "not save or load (it keeps the optimizer you gave it). Build the library optimizer yourself (optimi's "
                "AdamW(kahan_sum=True) for bf16-true-kahan, torchao's _AdamW(bf16_stochastic_round=True) for bf16-true-sr) and "
                "pass it to fabric.setup(), or train with 'bf16-true-remainder'."
            )
        return adopted

    # ------------------------------------------------------------------------------------------ forward
    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """The policy's autocast; while gradients are on (a training forward under Fabric), with the engine's step hooks."""
        if self._module is None:
            return contextlib.nullcontext()
        if torch.is_grad_enabled() and self.engine.hooks.active:
            return self.engine.autocast()
        return self.policy.forward_context(self.engine.device.type)

    @contextlib.contextmanager
    def train_step_context(self) -> Generator[None, None, None]:
        with self.engine.autocast() if self._module is not None else contextlib.nullcontext():
            yield

    def convert_input(self, data: Any) -> Any:
        """The batch's floating tensors in the model's 16-bit dtype under the ``*-true`` policies, as Lightning's own
        ``bf16-true``/``16-true`` do: the Trainer calls ``training_step``, not the model's ``forward``, so the input cast
        the policy puts on ``forward`` is not reached. Other policies take the batch as it is."""
        dtype = self.policy.param_dtype
        return data if dtype == torch.float32 else cast_floating(data, dtype)

    # ------------------------------------------------------------------------------------------ backward and step
    def pre_backward(self, tensor: torch.Tensor, module: Any) -> Any:
        if _attached(module):
            return super().pre_backward(tensor, module)  # Lightning's on_before_backward hooks, with the loss as it is
        return tensor

    def backward(self, tensor: torch.Tensor, model: Any, *args: Any, **kwargs: Any) -> None:
        """The engine's backward (scaled where the policy scales); under the Trainer through ``model.backward``."""
        if _attached(model):
            args = args[1:]  # the Trainer passes the optimizer first; LightningModule.backward does not take it
            self.engine.backward(tensor, backward_fn=lambda scaled: model.backward(scaled, *args, **kwargs))
        elif args:
            self.engine.backward(tensor, backward_fn=lambda scaled: scaled.backward(*args, **kwargs))
        else:
            self.engine.backward(tensor, **kwargs)

    def post_backward(self, tensor: torch.Tensor, module: Any) -> Any:
        if _attached(module):
            return super().post_backward(tensor, module)
        return tensor

    def optimizer_step(self, optimizer: Any, model: Any = None, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        if closure is None:  # Fabric: the user's loop ran the backward already
            return self.engine.step(self._adopted(optimizer))
        if isinstance(optimizer, torch.optim.LBFGS):
            raise TypeError("AmpkitPrecision steps each optimizer once per step; LBFGS re-evaluates its closure: train it in 32-true without the plugin.")
        closure_result = closure()  # training_step and its backward (through self.backward)
        skipped_backward = closure_result is None and model.automatic_optimization  # training_step returned None
        if not skipped_backward:
            self.engine.unscale_(optimizer)  # hooks and clipping below see the true (master) gradients
        self._after_closure(model, optimizer)  # on_before_optimizer_step hooks, then gradient clipping
        if not skipped_backward:
            self.engine.step(optimizer)
        return closure_result

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Fabric's ``clip_gradients`` calls this before clipping: the engine unscales (and copies to the masters)."""
        self.engine.unscale_(self._adopted(optimizer))

    def main_params(self, optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
        """What clipping clips: the parameters the optimizer steps (the fp32 masters where the policy has them)."""
        for group in self._adopted(optimizer).param_groups:
            yield from group["params"]

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The engine's state (loss scaler, fp32 masters, counters, rounding stream); empty before any optimizer."""
        return self.engine.state_dict() if self.engine.optimizers else {}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Trainer: a checkpoint without this plugin's state (written by another precision, or with the plugin's state
        dropped) resumes without the fp32 masters and the loss scale: said once, since the run then differs."""
        if type(self).__qualname__ not in checkpoint and (self.engine.masters is not None or self.engine.scaler is not None):
            log.warning(
                "%r: the checkpoint holds no AmpkitPrecision state (it was written under another precision): the fp32 masters "
                "start from the checkpoint's weights and the loss scale from its start, so the run does not continue as it was.",
                self,
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.engine.optimizers:
            self.engine.load_state_dict(state_dict)
        elif self._module is not None:
            self._pending_state = dict(state_dict)  # Fabric: loaded before the first step; applied once the optimizer comes
        else:
            raise RuntimeError("AmpkitPrecision.load_state_dict() before the model was set up: load after fabric.setup(model, optimizer).")


def _lightning_module(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model) if not isinstance(model, pl.LightningModule) else model


def _attached(module: Any) -> bool:
    """Whether ``module`` is a LightningModule trained by a Trainer (whose hooks the Trainer calls through the plugin)."""
    return isinstance(module, pl.LightningModule) and module._trainer is not None
