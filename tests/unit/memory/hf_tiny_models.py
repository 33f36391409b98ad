"""Tiny Hugging Face models built from configs (nothing downloaded), with the factories --model and --data take.

Hidden size 32, 2 layers, sequences of 16, batches of 2: each runs a training step in well under a second.
``f"{path}:llama"`` and ``f"{path}:tokens"`` are what ``ampkit memory --model/--data`` and ``ampkit bench`` take.
"""

from __future__ import annotations

import torch

from ampkit.bench import BenchData

B, T, V = 2, 16, 64
_TOKENS = {"vocab_size": V, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "use_cache": False}
_DECODER = {**_TOKENS, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": T}  # grouped-query attention: 2 kv heads for 4


def _causal(model: torch.nn.Module) -> torch.nn.Module:
    model.loss_type = "ForCausalLM"  # transformers cannot infer it from every class name and warns otherwise
    return model


def llama() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    return _causal(AutoModelForCausalLM.from_config(LlamaConfig(**_DECODER)))


def mixtral() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, MixtralConfig

    torch.manual_seed(0)
    return _causal(AutoModelForCausalLM.from_config(MixtralConfig(**_DECODER, num_local_experts=4, num_experts_per_tok=2)))


def gpt2_checkpointed() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**_TOKENS, n_positions=T, n_layer=2, n_embd=32, n_head=2))
    model.activation_checkpointing_enable()  # gradient_checkpointing_enable() before transformers 5.x: deprecated
    return _causal(model)


def t5() -> torch.nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    return T5ForConditionalGeneration(T5Config(**_TOKENS, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0))


def vit() -> torch.nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    return ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                               image_size=16, patch_size=4, num_labels=4))


def whisper() -> torch.nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    return WhisperForConditionalGeneration(WhisperConfig(
        **_TOKENS, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=8, max_target_positions=T, decoder_start_token_id=0,
    ))


def _data(make: object) -> BenchData:
    return BenchData(train=[make(s) for s in range(2)], eval=[make(9)])  # type: ignore[operator]


def tokens() -> BenchData:
    """Token ids, the labels the model shifts itself; no attention mask (no padding)."""
    def one(seed: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(1, V, (B, T), generator=torch.Generator().manual_seed(seed))
        return {"input_ids": ids, "labels": ids.clone()}
    return _data(one)


def images() -> BenchData:
    def one(seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {"pixel_values": torch.randn(B, 3, 16, 16, generator=g), "labels": torch.randint(0, 4, (B,), generator=g)}
    return _data(one)


def audio() -> BenchData:
    def one(seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {"input_features": torch.randn(B, 8, 16, generator=g), "labels": torch.randint(1, V, (B, T), generator=g)}
    return _data(one)
