"""What one ``amp.initialize`` call owns: its loss scalers, the optimizers it patched, their master weights.

Each optimizer passed to initialize carries an ``_amp_stash`` (Apex's attribute name, which some code probes)
and gets three instance-level methods: ``step`` skips once after an overflow and, under O2, refreshes the
16-bit model from the fp32 masters; ``add_param_group`` gives new 16-bit parameters masters. Gradients are
unscaled when ``amp.scale_loss`` exits (so clipping between backward and step sees true values), with torch's
fused unscale kernel; whether a step is skipped is read once, in ``step``.
"""

from __future__ import annotations

import functools
import types
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..policy._masters import MasterWeights
from ..scaling import DynamicLossScaler, LossScaler, ScalerConfig, StaticLossScaler
from ..scaling._kernels import grads_of
from ..training._collapse import CollapseWatch
from ._properties import Properties

__all__ = ["AmpSession", "LossScalerView", "OptimizerStash", "is_rank0"]

_FP32_TINY = 2.0**-126


def is_rank0() -> bool:
    """True outside torch.distributed, or on rank 0 (Apex printed on rank 0 only)."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class LossScalerView:
    """Apex's loss-scaler interface (``loss_scale()``, ``_loss_scale``, ``_unskipped``) over an ampkit scaler.

    Scripts of Apex's era assign ``_loss_scale`` (BERT's ``loss_scalers[0]._loss_scale = 2**20``) and Apex's
    own ``load_state_dict`` assigns both; the next ``scale_loss`` uses what was assigned.
    """

    def __init__(self, scaler: LossScaler) -> None:
        self.scaler = scaler
        self.dynamic = isinstance(scaler, DynamicLossScaler)
        # A static scale changes only through the setter or load(), so it is mirrored here: scale_loss asks
        # for it on every call (Apex's shortcut for a scale of 1.0) and must not sync to read it.
        self.static_scale = None if self.dynamic else scaler.get_scale()

    def loss_scale(self) -> float:
        """The current scale. Syncs."""
        return self.scaler.get_scale()

    @property
    def _loss_scale(self) -> float:
        return self.loss_scale()

    @_loss_scale.setter
    def _loss_scale(self, value: float) -> None:
        value = float(value)
        if not (0 < value < float("inf")):
            raise ValueError(f"_loss_scale must be a positive finite number such as 2.0**16, got {value}.")
        self.scaler.scale_tensor.fill_(value)  # in place: whatever holds the scale tensor sees the new value
        if not self.dynamic:
            self.static_scale = value

    @property
    def _unskipped(self) -> int:
        # Apex counted clean backward passes since the scale last changed: the growth tracker.
        return int(self.scaler.state_dict().get("growth_tracker", 0))

    @_unskipped.setter
    def _unskipped(self, value: int) -> None:
        if self.dynamic:  # a static scaler never grows, so it keeps no count
            state = self.scaler.state_dict()
            state["growth_tracker"] = int(value)
            self.scaler.load_state_dict(state)

    def load(self, entry: Mapping[str, Any]) -> None:
        """Restore Apex's ``{"loss_scale": ..., "unskipped": ...}`` entry."""
        state = self.scaler.state_dict()
        state["scale"] = float(entry["loss_scale"])
        if self.dynamic:
            state.update(growth_tracker=int(entry.get("unskipped", 0)), consecutive_skips=0, blocked_at_floor=0)
        else:
            self.static_scale = state["scale"]
        self.scaler.load_state_dict(state)


@dataclass
class OptimizerStash:
    """Per-optimizer amp state, stored as ``optimizer._amp_stash``."""

    session: AmpSession
    step: Callable[..., Any]
    add_param_group: Callable[..., Any]
    masters: MasterWeights | None = None
    has_scaled_grads: bool = False
    stashed: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    found: dict[int, torch.Tensor] = field(default_factory=dict)
    # The loss scalers of the scale_loss calls since the last step: the latest initialize's, which are not
    # this optimizer's own session's once initialize has been called again (Apex kept one global list).
    views: list[LossScalerView] = field(default_factory=list)
    skip_run: int = 0
    skip_loss_id: int = 0
    collapse: CollapseWatch = field(default_factory=CollapseWatch)


def _params(optimizer: Any) -> list[torch.Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]


class AmpSession:
    """The state behind one ``amp.initialize`` call."""

    def __init__(
        self,
        properties: Properties,
        device: torch.device,
        num_losses: int,
        min_loss_scale: float | None,
        max_loss_scale: float,
        verbosity: int,
    ) -> None:
        self.properties = properties
        self.device = device
        self.verbosity = verbosity
        self.min_loss_scale = min_loss_scale
        self.max_loss_scale = max_loss_scale
        self.optimizers: list[Any] = []
        self.param_names: dict[int, str] = {}
        self.converted_ids: set[int] = set()
        # Per model: its master weights by parameter name, read by the model's state_dict hooks.
        self.model_masters: dict[int, dict[str, nn.Parameter]] = {}
        self.param_owner: dict[int, tuple[int, str]] = {}  # id(param) -> (id(model), name in that model)
        self.views = [LossScalerView(self._make_scaler()) for _ in range(num_losses)]

    def _make_scaler(self) -> LossScaler:
        p = self.properties
        if p.loss_scale != "dynamic":
            return StaticLossScaler(float(p.loss_scale), self.device)
        floor = self.min_loss_scale if self.min_loss_scale is not None else _FP32_TINY
        init = max(floor, min(self.max_loss_scale, 2.0**16))
        # Apex's rules are torch's: x2 after 2000 clean passes, /2 on overflow; plus its ceiling and optional
        # floor. A collapse is reported (once), not raised: Apex scripts expect to keep running.
        config = ScalerConfig(init_scale=init, growth_interval=2000, min_scale=floor, max_scale=self.max_loss_scale, on_collapse="warn")
        return DynamicLossScaler(config, self.device)

    @property
    def enabled(self) -> bool:
        return self.properties.enabled

    def passes_through(self, view: LossScalerView) -> bool:
        """True when scale_loss has nothing to do (Apex's shortcut: static scale 1.0 and no master weights)."""
        return not self.properties.master_weights and view.static_scale == 1.0

    def say(self, message: str) -> None:
        """Print ``message`` the way Apex did: at verbosity >= 1, on rank 0 only."""
        if self.verbosity > 0 and is_rank0():
            print(message, flush=True)

    # ------------------------------------------------------------------------------------------ optimizers
    def adopt_optimizer(self, optimizer: Any, masters: MasterWeights | None) -> None:
        """Patch ``optimizer`` (instance-level, bound methods so LR schedulers can wrap them in turn)."""
        stash = OptimizerStash(self, step=optimizer.step, add_param_group=optimizer.add_param_group, masters=masters)
        optimizer._amp_stash = stash
        optimizer.step = types.MethodType(_amp_step, optimizer)
        optimizer.add_param_group = types.MethodType(_amp_add_param_group, optimizer)
        self.optimizers.append(optimizer)

    def register_master(self, param: torch.Tensor, master: nn.Parameter) -> None:
        """Record that ``master`` holds ``param``'s fp32 value, for its model's state_dict hooks."""
        owner = self.param_owner.get(id(param))
        if owner is not None:
            self.model_masters.setdefault(owner[0], {})[owner[1]] = master

    def attach_model_hooks(self, model: nn.Module) -> None:
        """``model.state_dict()`` returns fp32 (the masters' exact values under O2); loading restores the masters."""
        masters = self.model_masters.setdefault(id(model), {})
        model.register_state_dict_post_hook(functools.partial(_fp32_state_dict, masters))
        model.register_load_state_dict_pre_hook(functools.partial(_load_masters, masters))

    def master_ids(self, stash: OptimizerStash) -> set[int]:
        return {id(m) for m in stash.masters.masters} if stash.masters is not None else set()

    def prepare_backward(self, optimizers: Sequence[Any]) -> None:
        """Before a backward: set aside gradients already unscaled, so the new ones can be unscaled alone."""
        for opt in optimizers:
            st: OptimizerStash = opt._amp_stash
            if st.has_scaled_grads:
                continue  # the previous backward used delay_unscale: keep adding scaled gradients
            if st.masters is not None:
                for p in st.masters.model_params:
                    p.grad = None
            skip = self.master_ids(st)
            st.stashed = [(p, p.grad) for p in _params(opt) if p.grad is not None and id(p) not in skip]
            for p, _ in st.stashed:
                p.grad = None

    def unscale_after_backward(self, optimizers: Sequence[Any], loss_id: int) -> None:
        """After a backward: unscale the new gradients, add the set-aside ones back, update the loss scale."""
        scaler = self.views[loss_id].scaler
        found = torch.zeros((), dtype=torch.float32, device=self.device)
        inv_scale = scaler.inv_scale()
        for opt in optimizers:
            st: OptimizerStash = opt._amp_stash
            if st.masters is not None:
                st.masters.unscale_grads_to_masters(inv_scale, found)
            skip = self.master_ids(st)
            scaler.unscale_(grads_of([p for p in _params(opt) if id(p) not in skip]), found)
            both = [(p.grad, old) for p, old in st.stashed if p.grad is not None]
            for p, old in st.stashed:
                if p.grad is None:
                    p.grad = old
            if both:
                torch._foreach_add_([g for g, _ in both], [old for _, old in both])
            st.stashed, st.has_scaled_grads, st.views = [], False, self.views
        if isinstance(scaler, DynamicLossScaler):
            scaler.update(found)  # on the device; whether to skip is read in step()
            for opt in optimizers:
                flags = opt._amp_stash.found
                flags[loss_id] = flags[loss_id] + found if loss_id in flags else found

    def abandon_backward(self, optimizers: Sequence[Any]) -> None:
        """A backward raised: put the gradients back as they were before scale_loss."""
        for opt in optimizers:
            st: OptimizerStash = opt._amp_stash
            if st.has_scaled_grads:
                continue
            if st.masters is not None:
                for p in st.masters.model_params:
                    p.grad = None
            skip = self.master_ids(st)
            before = {id(p): g for p, g in st.stashed}
            for p in _params(opt):
                if id(p) not in skip:
                    p.grad = before.get(id(p))
            st.stashed = []

    def optimizer_step(self, optimizer: Any, closure: Any) -> Any:
        st: OptimizerStash = optimizer._amp_stash
        if st.has_scaled_grads:
            raise RuntimeError(
                "optimizer.step() was called while the gradients are still scaled: the last amp.scale_loss used "
                "delay_unscale=True. End each accumulation with one scale_loss(..., delay_unscale=False) before step()."
            )
        if st.found:
            ids = sorted(st.found)
            flags = torch.stack([st.found[i] for i in ids]).tolist()  # the one sync per step
            st.found = {}
            overflowed = [i for i, f in zip(ids, flags) if f > 0]
            if overflowed:
                if closure is not None:
                    raise RuntimeError("amp cannot skip a step that takes a closure; call optimizer.step() without one.")
                self._report_skip(optimizer, overflowed[0])
                if st.masters is not None:
                    for m in st.masters.masters:
                        m.grad = None  # model.zero_grad() would not clear these
                return None
        self._report_clean(st)
        if (
            st.masters is not None
            and not any(m.grad is not None for m in st.masters.masters)
            and any(p.grad is not None for p in st.masters.model_params)
        ):
            raise RuntimeError(
                "O2 steps fp32 master weights, which receive gradients only from a backward inside "
                "`with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()`; "
                "a plain loss.backward() leaves them empty."
            )
        out = st.step(closure) if closure is not None else st.step()
        if st.masters is not None:
            st.masters.copy_masters_to_model()
            for m in st.masters.masters:
                m.grad = None  # Apex cleared them after each step, so model.zero_grad() suffices
        return out

    # ------------------------------------------------------------------------------------------ messages
    def _report_skip(self, optimizer: Any, loss_id: int) -> None:
        # One line per run of skipped steps, plus a summary when it ends: Apex printed a line per skip, which
        # floods the log while the scale settles at the start of training.
        st: OptimizerStash = optimizer._amp_stash
        scaler = st.views[loss_id].scaler
        st.skip_run += 1
        st.skip_loss_id = loss_id
        if st.skip_run == 1:
            self.say(f"Gradient overflow.  Skipping step, loss scaler {loss_id} reducing loss scale to {scaler.get_scale()}")
        if not st.collapse.reported:  # the engine's watch: once per run of skipped steps, reported not raised
            named = [(self.param_names.get(id(p), "?"), p) for p in _params(optimizer)]
            message = st.collapse.diagnose(scaler, named, f"apex {self.properties.opt_level}")
            st.collapse.report(None if message is None else "amp: " + message, raise_error=False, say=self.say)

    def _report_clean(self, st: OptimizerStash) -> None:
        if st.skip_run > 1:
            scale = st.views[st.skip_loss_id].scaler.get_scale()
            self.say(f"Gradient overflow: {st.skip_run} steps skipped in a row; loss scaler {st.skip_loss_id} is now at {scale}")
        st.skip_run = 0
        st.collapse.clean_step()

    # ------------------------------------------------------------------------------------------ state
    def masters_state(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for opt in self.optimizers:
            if opt._amp_stash.masters is not None:
                out.update(opt._amp_stash.masters.state_dict())
        return out

    def state_dict(self) -> OrderedDict[str, Any]:
        out: OrderedDict[str, Any] = OrderedDict()
        for i, view in enumerate(self.views):
            out[f"loss_scaler{i}"] = {"loss_scale": view.loss_scale(), "unskipped": view._unskipped}
        masters = self.masters_state()
        if masters:
            out["master_weights"] = masters
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise TypeError(f"amp.load_state_dict() takes the dict amp.state_dict() returned, got {type(state).__name__}.")
        unexpected = [k for k in state if "loss_scaler" not in k and k != "master_weights"]
        if unexpected:
            raise RuntimeError(
                f"Error(s) in loading amp state_dict: unexpected key(s) {', '.join(map(repr, unexpected))}. Pass the "
                "dict that amp.state_dict() returned (e.g. checkpoint['amp']), not the whole checkpoint."
            )
        keys = [k for k in state if "loss_scaler" in k]
        if len(keys) != len(self.views):
            self.say(f"Warning: state_dict contains {len(keys)} loss scalers, while {len(self.views)} are used (num_losses).")
        for idx, key in enumerate(keys[: len(self.views)]):
            self.views[idx].load(state[key])
        masters = state.get("master_weights")
        if masters is not None:
            owners = [opt._amp_stash.masters for opt in self.optimizers if opt._amp_stash.masters is not None]
            if not owners:
                self.say(f"amp: the state holds O2 master weights, but opt_level {self.properties.opt_level} keeps none; they are ignored.")
            for mw in owners:
                missing = [n for n in mw.names if n not in masters]
                if missing:
                    raise RuntimeError(f"amp state_dict lacks master weights for {missing[:5]}: it was saved from a different model.")
                mw.load_state_dict({n: masters[n] for n in mw.names})


def _amp_step(self: Any, closure: Any = None) -> Any:
    return self._amp_stash.session.optimizer_step(self, closure)


def _amp_add_param_group(self: Any, param_group: dict[str, Any]) -> Any:
    st: OptimizerStash = self._amp_stash
    session = st.session
    if st.masters is not None and isinstance(param_group, dict):
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        swapped = []
        for p in params:
            if id(p) in session.converted_ids and p.is_floating_point() and p.dtype != torch.float32:
                master = st.masters.add(session.param_names.get(id(p), f"added.{len(st.masters)}"), p)
                session.param_names[id(master)] = session.param_names.get(id(p), "?")
                session.register_master(p, master)
                swapped.append(master)
            else:
                swapped.append(p)
        param_group = {**param_group, "params": swapped}
    return st.add_param_group(param_group)


def _fp32_state_dict(masters: dict[str, nn.Parameter], module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    # Apex cast the 16-bit weights up, which returns them rounded; the masters hold the values the optimizer
    # actually reached, so a checkpoint taken from model.state_dict() resumes exactly.
    for key, value in state_dict.items():
        if not key.startswith(prefix):
            continue
        master = masters.get(key[len(prefix):])
        if master is not None:
            state_dict[key] = master.detach()
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float32:
            state_dict[key] = value.float()


@torch.no_grad()
def _load_masters(masters: dict[str, nn.Parameter], module: nn.Module, state_dict: Mapping[str, Any], prefix: str, *args: Any) -> None:
    # Runs before torch copies the values into the 16-bit parameters: the masters take them at full precision.
    for name, master in masters.items():
        value = state_dict.get(prefix + name)
        if isinstance(value, torch.Tensor) and value.shape == master.shape and value.is_floating_point():
            master.copy_(value)
