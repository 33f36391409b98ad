"""Tiny framework objects for the workload tests: Hugging Face folders written by ``save_pretrained`` (a GPT-2 with and
without weights, with and without a tokenizer, a BERT sequence classifier with its tokenizer), built once a session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

VOCAB = 64  # the GPT-2 folders' vocabulary; the word-level tokenizer below has fewer tokens
WORDS = [
    "[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]", "def", "return", "self", "import", "class", "for", "in", "if", "else", "elif",
    "the", "a", "of", "to", "and", "is", "not", "None", "True", "False", "from", "with", "as", "raise", "while", "try",
    "except", "lambda", "yield", "pass", "break", "continue", "len", "print", "str", "int", "list", "dict",
]


def gpt2_config(**overrides: object) -> object:
    from transformers import GPT2Config

    settings: dict[str, object] = {
        "vocab_size": VOCAB, "n_positions": 32, "n_layer": 1, "n_embd": 16, "n_head": 2, "bos_token_id": 0, "eos_token_id": 0,
        "use_cache": False,
    }
    return GPT2Config(**{**settings, **overrides})


def gpt2_model(seed: int = 0) -> torch.nn.Module:
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(gpt2_config())


def word_tokenizer() -> object:
    """A word-level tokenizer built here (nothing downloaded), with a pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
    )


@pytest.fixture(scope="session")
def hf_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Folders by kind: ``weights`` (GPT-2, fp32), ``bf16`` (GPT-2 saved in bf16), ``config`` (config.json only),
    ``tokenizer`` (GPT-2 weights and a tokenizer), ``bert`` (a BERT sequence classifier and its tokenizer)."""
    pytest.importorskip("transformers", reason="Requires: transformers (pip install -e '.[hf]')")
    from transformers import BertConfig, BertForSequenceClassification

    root = tmp_path_factory.mktemp("hf")
    folders = {kind: root / kind for kind in ("weights", "bf16", "config", "tokenizer", "bert")}
    gpt2_model().save_pretrained(folders["weights"])
    gpt2_model().to(torch.bfloat16).save_pretrained(folders["bf16"])
    gpt2_config().save_pretrained(folders["config"])
    gpt2_model().save_pretrained(folders["tokenizer"])
    word_tokenizer().save_pretrained(folders["tokenizer"])
    bert = BertConfig(
        vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
        num_labels=3, pad_token_id=1,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(bert).save_pretrained(folders["bert"])
    word_tokenizer().save_pretrained(folders["bert"])
    return folders
