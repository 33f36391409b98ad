"""What ``AmpkitTrainer`` refuses, each naming what to drop, and the twin that shows the correct use stays silent."""

from __future__ import annotations

import tempfile
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import ampkit
from ampkit.transformers import AmpkitTrainer
from ampkit.transformers._checks import check_training_args


def _gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8, bos_token_id=0, eos_token_id=0))


def _args(**overrides: Any) -> TrainingArguments:
    return TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[], max_steps=1, **overrides)


@pytest.mark.parametrize(("flag", "why"), [("bf16", "two autocasts at once. Drop bf16=True"),
                                           ("fp16", "two autocasts at once and two loss scalers .the Trainer's GradScaler and the engine's.. Drop fp16=True")])
def test_the_trainers_own_mixed_precision_beside_a_policy_is_refused(flag: str, why: str) -> None:
    if flag == "fp16":  # TrainingArguments refuses fp16 on a CPU itself (before ampkit sees it): checked on the settings
        with pytest.raises(ValueError, match=why):
            check_training_args("bf16-mixed", SimpleNamespace(fp16=True, bf16=False))
        return
    with pytest.raises(ValueError, match=why):
        AmpkitTrainer(model=_gpt2(), args=_args(**{flag: True}), precision="bf16-mixed")


def test_the_twin_without_the_flags_builds_an_ampkit_accelerator() -> None:
    trainer = AmpkitTrainer(model=_gpt2(), args=_args(), precision="bf16-mixed")
    assert type(trainer.accelerator).__name__ == "AmpkitAccelerator" and trainer.accelerator.state.mixed_precision == "no"
    gather = trainer.gather_function  # a partial of gather_for_metrics (use_gather_object=...), rebound to the one that runs
    assert gather.func.__self__ is trainer.accelerator and gather.keywords == {"use_gather_object": False}


def test_the_launchers_mixed_precision_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    with pytest.raises(ValueError, match="ACCELERATE_MIXED_PRECISION=bf16"):
        AmpkitTrainer(model=_gpt2(), args=_args(), precision="16-mixed")


def test_full_16_bit_evaluation_is_refused() -> None:
    with pytest.raises(ValueError, match="bf16_full_eval=True.*Drop it"):
        AmpkitTrainer(model=_gpt2(), args=_args(bf16_full_eval=True), precision="bf16-true")


@pytest.mark.parametrize(("settings", "why"), [({"deepspeed": "ds.json"}, "Drop deepspeed="), ({"fsdp": "full_shard"}, "Drop fsdp="),
                                               ({"fsdp_plugin_args": {"fsdp_version": 2}}, "Drop fsdp=")])
def test_strategies_with_their_own_mixed_precision_are_refused(settings: dict[str, Any], why: str) -> None:
    """Checked on the settings: TrainingArguments would need the libraries and a process group to build these."""
    args = SimpleNamespace(fp16=False, bf16=False, mixed_precision="no", deepspeed=None, fsdp=None, fsdp_plugin_args=None)
    vars(args).update(settings)
    with pytest.raises(ValueError, match=why):
        check_training_args("bf16-mixed", args)


def test_a_wrapped_model_is_refused() -> None:
    with pytest.raises(ValueError, match="already wrapped in DataParallel; pass the plain model"):
        AmpkitTrainer(model=torch.nn.DataParallel(_gpt2()), args=_args(), precision="bf16-mixed")


def test_an_unknown_policy_names_the_closest_before_the_trainer_starts() -> None:
    with pytest.raises(ampkit.PolicyError, match="bf16-true-masters"):
        AmpkitTrainer(model=_gpt2(), args=_args(), precision="bf16-true-master")


def test_precision_is_required() -> None:
    with pytest.raises(TypeError, match="precision"):
        AmpkitTrainer(model=_gpt2(), args=_args())


def test_a_transformers_release_outside_the_tested_range_is_named(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import importlib
    import importlib.metadata
    import logging

    import ampkit._util.framework_versions as versions
    import ampkit.transformers

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "5.99.0" if name == "transformers" else real(name))
    monkeypatch.setattr(versions, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        importlib.reload(ampkit.transformers)
    assert "ampkit.transformers: transformers 5.99.0 is outside the releases ampkit is tested with" in caplog.text
    assert "pip install 'transformers>=5.23,<5.24'" in caplog.text
