"""``AmpkitPrecision`` under Lightning's Trainer, against two controls on the same weights and batches: Lightning's
own precision (where it has the policy) and ampkit's Engine loop (every policy, accumulation, clipping, overflows)."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from ampkit import PolicyError
from ampkit.lightning import AmpkitPrecision
from ampkit.policy import get_policy

from .conftest import Classifier, assert_same_weights, engine_loop, fit

CPU_POLICIES = ["32-true", "bf16-mixed", "16-mixed", "bf16-true", "bf16-true-masters", "bf16-true-remainder", "16-true-masters",
                "bf16-true-kahan", "bf16-true-sr"]


def _runs_here(policy: str) -> None:
    support = get_policy(policy).support("cpu")
    if not support.supported:
        pytest.skip(f"{policy}: {support.reason}")


@pytest.mark.parametrize("policy", ["32-true", "bf16-mixed"])
def test_matches_lightnings_own_precision_bit_for_bit(policy: str) -> None:
    native, plugin = Classifier(), Classifier()
    fit(native, precision=policy, accumulate_grad_batches=2, gradient_clip_val=1.0)
    trainer = fit(plugin, plugins=[AmpkitPrecision(policy)], accumulate_grad_batches=2, gradient_clip_val=1.0)
    assert plugin.losses == native.losses
    assert_same_weights(plugin.net, native.net)
    assert trainer.precision == policy


@pytest.mark.parametrize("policy", CPU_POLICIES)
def test_every_policy_trains_as_ampkits_engine_loop(policy: str) -> None:
    """Lightning accumulates (2 micro-batches a step) and the plugin clips: the same run as Engine(accumulate=2,
    clip_grad_norm=1.0), loss for loss and weight for weight, in the policy's dtypes."""
    _runs_here(policy)
    control, want, engine = engine_loop(policy, accumulate=2, clip_grad_norm=1.0)
    module = Classifier()
    trainer = fit(module, plugins=[AmpkitPrecision(policy, clip_grad_norm=1.0)], accumulate_grad_batches=2)
    plugin = trainer.precision_plugin
    assert module.losses == want
    assert_same_weights(module.net, control)
    assert plugin.engine.steps == engine.steps == len(want) // 2
    if engine.masters is not None:
        assert all(m.dtype == torch.float32 for m in trainer.optimizers[0].param_groups[0]["params"])


def test_lightnings_own_gradient_clipping_clips_the_unscaled_gradients() -> None:
    """Trainer(gradient_clip_val=...) through the plugin: clipped after ampkit unscales, as the Engine clips."""
    control, want, _ = engine_loop("16-mixed", clip_grad_norm=0.5)
    module = Classifier()
    fit(module, plugins=[AmpkitPrecision("16-mixed")], gradient_clip_val=0.5)
    assert module.losses == want
    assert_same_weights(module.net, control)


@pytest.mark.parametrize("policy", ["16-mixed", "16-true-masters"])
def test_an_overflow_skips_its_step_and_backs_off_the_scale_as_the_engine_does(policy: str) -> None:
    control, want, engine = engine_loop(policy, poison={3})
    module = Classifier(poison={3})
    trainer = fit(module, plugins=[AmpkitPrecision(policy)])
    plugin = trainer.precision_plugin.engine
    assert module.losses == want
    assert_same_weights(module.net, control)
    assert plugin.skipped_steps == engine.skipped_steps == 1 and plugin.scale == engine.scale == 2.0**15
    # on_before_optimizer_step saw the true gradients (unscaled), as with Lightning's own AMP plugin
    assert max(g.abs().max().item() for g in module.hook_grads if torch.isfinite(g).all()) < 10.0


def test_a_skipped_step_does_not_advance_the_lr_schedule() -> None:
    """Lightning steps a 'step' scheduler after every optimizer step; through the plugin only after a real one, as
    ampkit's Engine steps the schedulers it adopted (the control, with the same overflow)."""

    def halving(params):
        opt = torch.optim.AdamW(params, lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5), "interval": "step"}}

    class Scheduled(Classifier):
        def configure_optimizers(self):
            return halving(self.parameters())

    model, _, engine = engine_loop("16-mixed", poison={3}, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5))
    module = Scheduled(poison={3})
    trainer = fit(module, plugins=[AmpkitPrecision("16-mixed")])
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr() == engine.schedulers[0].get_last_lr() == [1e-2 * 0.5**7]
    assert_same_weights(module.net, model)


def test_validation_runs_under_the_policy_without_counting_steps() -> None:
    class WithValidation(Classifier):
        def validation_step(self, batch, batch_idx):
            x, _ = batch
            self.val_dtypes.append(self.net[0](x).dtype)

        def val_dataloader(self):
            return self.train_dataloader()

    module = WithValidation()
    module.val_dtypes = []
    trainer = fit(module, plugins=[AmpkitPrecision("bf16-mixed")], num_sanity_val_steps=0, limit_val_batches=2)
    assert module.val_dtypes == [torch.bfloat16] * 2
    assert trainer.precision_plugin.engine.steps == len(module.losses)


# --------------------------------------------------------------------------------------------- bad input
def test_precision_beside_the_plugin_is_refused_by_lightning_naming_both() -> None:
    with pytest.raises(ValueError, match="Choose one"):
        L.Trainer(precision="bf16-mixed", plugins=[AmpkitPrecision("bf16-mixed")], accelerator="cpu")


def test_two_ways_of_clipping_are_refused() -> None:
    with pytest.raises(ValueError, match="choose one"):
        fit(Classifier(), plugins=[AmpkitPrecision("bf16-mixed", clip_grad_norm=1.0)], gradient_clip_val=1.0)


def test_an_unknown_policy_is_refused_where_the_plugin_is_written() -> None:
    with pytest.raises(PolicyError, match="16-mixed"):
        AmpkitPrecision("fp16-mixd")


def test_one_plugin_serves_one_model() -> None:
    plugin = AmpkitPrecision("bf16-mixed")
    fit(Classifier(), plugins=[plugin], max_steps=1)
    with pytest.raises(RuntimeError, match="its own plugin"):
        fit(Classifier(), plugins=[plugin], max_steps=1)


def test_a_library_twin_with_a_scheduler_names_the_optimizer_to_build() -> None:
    pytest.importorskip("optimi")

    class Scheduled(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    with pytest.raises(ValueError, match="kahan_sum=True"):
        fit(Scheduled(), plugins=[AmpkitPrecision("bf16-true-kahan")], max_steps=1)


def test_lbfgs_is_refused_with_the_reason() -> None:
    module = Classifier(optimizer=lambda params: torch.optim.LBFGS(params))
    with pytest.raises(TypeError, match="LBFGS"):
        fit(module, plugins=[AmpkitPrecision("bf16-mixed")], max_steps=1)


def test_numerics_sampling_runs_inside_the_trainer() -> None:
    module = Classifier()
    trainer = fit(module, plugins=[AmpkitPrecision("bf16-mixed", numerics=2)])
    sample = trainer.precision_plugin.engine.numerics.last
    assert sample is not None and sample.step == 8 and "net.0" in sample.modules


def test_the_kernel_guard_holds_for_fused_sgd_whose_first_step_overflows() -> None:
    """torch's fused SGD with momentum writes inf/NaN after a skipped first step; the engine's guard (applied through
    the plugin) decides that step on the host: the run stays finite and equals the Engine loop's."""
    def sgd(params):
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=True)

    model, _, _ = engine_loop("16-mixed", poison={0}, optimizer=sgd)
    module = Classifier(optimizer=sgd, poison={0})
    fit(module, plugins=[AmpkitPrecision("16-mixed")])
    assert all(torch.isfinite(p).all() for p in module.parameters())
    assert_same_weights(module.net, model)
