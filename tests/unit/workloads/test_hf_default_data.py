"""Data made for an ``hf:`` model without ``--data``: text through the folder's tokenizer (with held-out eval), random
tokens (with no eval, and said), or a refusal for a model that needs labels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ampkit.workloads._gpt import stdlib_corpus
from ampkit.workloads._hf_default_data import _BYTES_PER_TOKEN, EVAL_BATCHES, ROWS, default_hf_data
from ampkit.workloads._hf_folder import folder_tokenizer, hf_folder, load_hf_model

from .conftest import VOCAB


def test_without_a_tokenizer_the_batches_are_seeded_random_tokens_with_no_eval(hf_folders: dict[str, Path]) -> None:
    folder = hf_folder(f"hf:{hf_folders['weights']}")
    model = load_hf_model(folder)
    data, what = default_hf_data(model, folder, spec=folder.spec, count=3, seed=7)
    again, _ = default_hf_data(model, folder, spec=folder.spec, count=3, seed=7)
    train = list(data.train)
    assert len(train) == 3 and list(data.eval) == [] and data.unit == "tokens"
    ids = train[0]["input_ids"]
    assert ids.shape == (ROWS, 32) and int(ids.min()) >= 0 and int(ids.max()) < VOCAB  # the model's context, its vocabulary
    assert torch.equal(train[0]["labels"], ids) and bool(train[0]["attention_mask"].all())
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(train, again.train, strict=True))
    assert what.startswith("random token ids") and "no eval metric" in what and "seed 7" in what


def test_with_a_tokenizer_the_batches_are_the_stdlib_text_and_its_end_is_held_out(hf_folders: dict[str, Path]) -> None:
    folder = hf_folder(f"hf:{hf_folders['tokenizer']}")
    model = load_hf_model(folder)
    data, what = default_hf_data(model, folder, spec=folder.spec, count=2)
    train, held = list(data.train), list(data.eval)
    assert len(train) == 2 and 2 <= len(held) <= EVAL_BATCHES
    # The control: the same text tokenized here, line by line, gives the first block.
    tokenizer = folder_tokenizer(model, folder)
    text = stdlib_corpus(10_000)[0].decode()
    expected = [i for row in tokenizer(text.splitlines(keepends=True), add_special_tokens=False)["input_ids"] for i in row][:32]
    assert train[0]["input_ids"][0].tolist() == expected
    assert torch.equal(train[0]["labels"], train[0]["input_ids"])
    # The eval text is the corpus's end, after every byte the training batches read: its first block starts there.
    per_batch = ROWS * 32 * _BYTES_PER_TOKEN
    raw = stdlib_corpus(2 * per_batch + EVAL_BATCHES * per_batch)[0]
    cut = len(raw) * 2 // (2 + EVAL_BATCHES)
    tail = [i for row in tokenizer(raw[cut:].decode().splitlines(keepends=True), add_special_tokens=False)["input_ids"] for i in row]
    assert held[0]["input_ids"][0].tolist() == tail[:32]
    assert "tokenized by the folder's tokenizer" in what and "held-out batches" in what


def test_a_model_that_needs_labels_is_refused_naming_data(hf_folders: dict[str, Path]) -> None:
    folder = hf_folder(f"hf:{hf_folders['bert']}")
    with pytest.raises(ValueError, match=r"is a BertForSequenceClassification: without --data, ampkit makes data only for a causal language model.*Pass --data"):
        default_hf_data(load_hf_model(folder), folder, spec=folder.spec, count=2)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(hf_folders: dict[str, Path], tmp_path: Path) -> None:
    from transformers import GPT2LMHeadModel

    from .conftest import gpt2_config, word_tokenizer

    torch.manual_seed(0)
    GPT2LMHeadModel(gpt2_config(vocab_size=8)).save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    folder = hf_folder(f"hf:{tmp_path}")
    with pytest.raises(ValueError, match="more than the model's vocab_size 8: they do not belong together"):
        default_hf_data(load_hf_model(folder), folder, spec=folder.spec, count=1)
