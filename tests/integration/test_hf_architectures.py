"""bench, doctor and tune on the Hugging Face architectures people train, built from configs (nothing downloaded):
Llama with grouped-query attention, T5, ViT, Whisper, Mixtral (mixture of experts) and GPT-2 with gradient
checkpointing on. No glue beyond a factory per model: each model takes its own dict batches (``labels`` inside, its
``.loss`` the loss), as ``--model``/``--data`` factories or the Python API hand them over.

Tiny configs (hidden 32, 2 layers, sequences of 16, batches of 2) and the fewest steps each tool allows; each tool's
result is checked as a result: a row per policy with finite losses and a verdict (bench), a recommendation checked
against fp32 with every module recorded (doctor), every configuration measured with an interval and a winner with
its reason (tune). ``ampkit memory`` on the same models: tests/unit/memory/test_hf_architectures.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from ampkit.bench import BenchData, bench_model
from ampkit.bench._quality import QUALITY
from ampkit.numerics import diagnose
from ampkit.tuning import WaveSettings, rows, tune
from ampkit.tuning._report import VERDICTS

pytest.importorskip("transformers", reason="Requires: transformers (pip install -e '.[hf]')")

# CI time: the slow tier (the whole file: see the round's report; each model builds in well under a second).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("quiet_machine", "one_thread")]

B, T, V = 2, 16, 64
"""Rows per batch, tokens per sequence, vocabulary."""
_TOKENS = {"vocab_size": V, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "use_cache": False}
_DECODER = {**_TOKENS, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": T}  # grouped-query attention: 2 key/value heads for 4


def _causal(model: nn.Module) -> nn.Module:
    model.loss_type = "ForCausalLM"  # transformers cannot infer it from every class name, and says so otherwise
    return model


def llama() -> nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    return _causal(AutoModelForCausalLM.from_config(LlamaConfig(**_DECODER)))


def mixtral() -> nn.Module:
    from transformers import AutoModelForCausalLM, MixtralConfig

    return _causal(AutoModelForCausalLM.from_config(MixtralConfig(**_DECODER, num_local_experts=4, num_experts_per_tok=2)))


def gpt2_checkpointed() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(**_TOKENS, n_positions=T, n_layer=2, n_embd=32, n_head=2))
    model.activation_checkpointing_enable()  # transformers 5's name for gradient_checkpointing_enable()
    return _causal(model)


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(**_TOKENS, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0))


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                               image_size=16, patch_size=4, num_labels=4))


def whisper() -> nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    return WhisperForConditionalGeneration(WhisperConfig(
        **_TOKENS, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=8, max_target_positions=T, decoder_start_token_id=0,
    ))


def tokens(seed: int) -> dict[str, torch.Tensor]:
    """Token ids and the labels the model shifts itself (a causal LM) or decodes (T5)."""
    ids = torch.randint(1, V, (B, T), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids.clone()}


def images(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.randn(B, 3, 16, 16, generator=g), "labels": torch.randint(0, 4, (B,), generator=g)}


def audio(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_features": torch.randn(B, 8, 16, generator=g), "labels": torch.randint(1, V, (B, T), generator=g)}


ZOO: dict[str, tuple[Callable[[], nn.Module], Callable[[int], dict[str, torch.Tensor]]]] = {
    "llama": (llama, tokens), "t5": (t5, tokens), "vit": (vit, images), "whisper": (whisper, audio), "mixtral": (mixtral, tokens),
    "gpt2-checkpointed": (gpt2_checkpointed, tokens),
}


@pytest.fixture
def one_thread() -> Any:
    """torch's intra-op threads at one: these models' ops are too small to split, and on a CPU shared with other
    processes two threads spin against them (a tiny T5's step took 0.8 s of CPU at two threads, 9 ms at one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return ZOO[name][0]()


def _batches(name: str, n: int) -> list[dict[str, torch.Tensor]]:
    return [ZOO[name][1](seed) for seed in range(n)]


def _finite(values: Any) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


@pytest.mark.parametrize("name", ZOO)
def test_bench_gives_every_policy_a_row_with_finite_losses_memory_and_a_verdict(name: str) -> None:
    data = BenchData(train=_batches(name, 2), eval=[ZOO[name][1](9)])
    result = bench_model(_model(name), data, "bf16-mixed", steps=2, warmup=1, rounds=1, device="cpu")
    assert [(r.precision, r.status, r.error) for r in result.runs] == [("32-true", "ok", None), ("bf16-mixed", "ok", None)]
    for r in result.runs:
        assert len(r.losses) == 2 and _finite(r.losses) and r.timed_steps == 1
        assert r.peak_memory_bytes and r.activation_bytes and r.peak_memory_bytes > r.activation_bytes
        assert r.eval_metric_name == "eval_loss" and _finite([r.eval_metric])
        assert r.verdict and r.verdict.startswith(f"{r.precision}: ")
    mixed = result.runs[1]
    assert mixed.quality in QUALITY
    # bf16-mixed computes in bf16 from the same fp32 weights on the same batch: its first loss is fp32's to bf16's precision.
    assert mixed.losses[0] == pytest.approx(result.runs[0].losses[0], rel=2e-2)


@pytest.mark.parametrize("name", ZOO)
def test_doctor_records_every_module_and_checks_its_recommendation_against_fp32(name: str) -> None:
    model = _model(name)
    d = diagnose(model, _batches(name, 2), steps=1, target="bf16-mixed", update_steps=0, fp8_recipe=None,
                 optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3))
    assert d.recommended_precision in ("bf16-mixed", "32-true") and d.reference_steps == 1
    recorded = {m["name"] for m in d.modules}
    holding = {n for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))}
    # Every module that holds weights is recorded (a container such as a ModuleList runs no forward of its own).
    assert holding <= recorded <= {n for n, _ in model.named_modules()}, holding - recorded
    step = next(c for c in d.comparisons if c.policy == "bf16-mixed")
    assert _finite([step.loss, step.reference_loss]) and step.modules
    if d.recommended_precision == "bf16-mixed":
        assert step.finite and step.loss == pytest.approx(step.reference_loss, rel=2e-2)
    assert "precision=" in d.engine_code()


@pytest.mark.parametrize("name", ZOO)
def test_tune_measures_each_configuration_with_an_interval_and_names_a_winner(name: str) -> None:
    waves = WaveSettings(rounds=1, chunk=5, warmup=1)  # 5 timed steps: the fewest an interval takes
    result = tune(_model(name), _batches(name, 4), device="cpu", budget=300, stages=["precision"], precisions=["bf16-mixed"],
                  waves=waves, guard_steps=2)
    table = {r["key"]: r for r in rows(result)}
    assert set(table) == {"32-true mb2x1 compile=off", "bf16-mixed mb2x1 compile=off"}
    for row in table.values():
        assert row["verdict"] in VERDICTS and row["verdict"] not in ("failed", "cut"), row
        assert row["throughput"] and row["peak_memory_bytes"]
    mixed = table["bf16-mixed mb2x1 compile=off"]
    assert mixed["interval"] is not None and mixed["interval"][0] <= mixed["speedup"] <= mixed["interval"][1]
    assert result.winner.key in table and result.winner_reason
    if result.winner.policy != "32-true":  # a winner other than the start passed the guard: finite, within fp32's tolerance
        guard = result.guard_of(result.winner)
        assert guard is not None and guard.passed and _finite(guard.losses)


def token_batches() -> BenchData:
    """``--data`` for the causal LMs: the factory a user writes beside ``--model``."""
    return BenchData(train=[tokens(seed) for seed in range(2)], eval=[tokens(9)])


def test_the_cli_takes_a_factory_per_model_and_no_more(capsys: pytest.CaptureFixture[str]) -> None:
    from ampkit.cli._main import main

    argv = ["bench", "--model", f"{__file__}:mixtral", "--data", f"{__file__}:token_batches", "--precision", "bf16-mixed",
            "--steps", "2", "--warmup", "1", "--rounds", "1", "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "MixtralForCausalLM" in out and "bf16-mixed" in out and "failed" not in out
