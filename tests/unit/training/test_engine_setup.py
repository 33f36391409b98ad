"""set_up: the run and its optimizer step, built from what setup() is given; what it refuses, it refuses first."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.policy import get_policy
from ampkit.scaling import DynamicLossScaler
from ampkit.training._engine_setup import Run, set_up
from ampkit.training._kernel_guards import defects_for
from ampkit.training._optimizer_step import StepSettings
from ampkit.training._step_state import StepState


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))


def test_the_step_is_built_on_the_prepared_models_and_owns_the_masters_and_the_scaler() -> None:
    model = _model()
    fp32 = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    state, scaler = StepState(), DynamicLossScaler()
    run, opts = set_up([model], [opt], policy=get_policy("16-true-masters"), settings=StepSettings(skip_nonfinite=True), scaler=scaler,
                       schedulers=sched, state=state)
    step = run.step
    assert isinstance(run, Run) and run.models == [model] and run.wrappers == [model] and opts == (opt,)
    assert step.scaler is scaler and step.optimizers == [opt] and step.schedulers == [sched]
    # The masters hold the fp32 values the model had; the optimizer steps them, the model is fp16 (LayerNorm kept fp32).
    assert [m.dtype for m in step.masters.masters] == [torch.float32] * 4
    assert all(torch.equal(m, w) for m, w in zip(step.masters.masters, [fp32[0], fp32[1], fp32[4], fp32[5]]))
    assert opt.param_groups[0]["params"][0] is step.masters.masters[0] and model[0].weight.dtype == torch.float16
    assert [n for n, _ in run.named] == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]


def test_a_fused_step_that_cannot_run_is_refused_before_the_model_changes() -> None:
    model = _model()
    opt = torch.optim.Adagrad(model.parameters())
    with pytest.raises(ValueError, match="fused_step: it traces SGD, Adam and AdamW, not Adagrad"):
        set_up([model], [opt], policy=get_policy("bf16-true-masters"), settings=StepSettings(), fused_spec=True)
    assert all(p.dtype == torch.float32 for p in model.parameters()) and opt.param_groups[0]["params"][0] is model[0].weight


def test_the_kernel_guards_are_applied_when_the_step_is_built() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    bf16 = torch.optim.SGD([nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))], lr=0.1, fused=True)  # what setup makes of it
    foreach = any(d.remedy == "foreach" for d in defects_for(bf16))
    set_up([model], [opt], policy=get_policy("bf16-true"), settings=StepSettings())
    # Where torch's fused CPU SGD is wrong for bf16 (torch < 2.14), the groups step with foreach instead.
    assert all(g["fused"] is (not foreach) and g["foreach"] is (True if foreach else None) for g in opt.param_groups)
