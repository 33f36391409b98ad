"""The data an ``hf:`` model trains on without ``--data``: only what can be made honestly, and said.

- A causal language model whose folder has a tokenizer: the ``gpt`` workload's offline text (the Python standard
  library's own sources, :func:`~ampkit.workloads._gpt.stdlib_corpus`) tokenized by that tokenizer and cut into
  blocks of :data:`SEQ_LEN` tokens (fewer when the model's context is shorter), :data:`ROWS` blocks a batch, labels
  the inputs (the model shifts them). The corpus's end gives up to :data:`EVAL_BATCHES` eval batches, so the eval
  loss compares the policies on text none of them trained on.
- A causal language model without a tokenizer: deterministic random token ids within its vocabulary (seeded by
  ``--seed``). They measure speed and memory, and a training loss, but nothing can be learnt from them that would
  generalise: there are no eval batches, so the bench says *quality not measured* instead of claiming accuracy.
- Any other model (a classifier needs labels, a masked LM a masking recipe): refused, naming ``--data``.

What was made is returned as one line, recorded as the workload's data (``results.json``'s ``workload_info``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ._bench_data import BenchData
from ._gpt import stdlib_corpus
from ._hf_folder import HfFolder, is_causal_lm

__all__ = ["EVAL_BATCHES", "ROWS", "SEQ_LEN", "default_hf_data"]

log = logging.getLogger("ampkit")

ROWS = 8
"""Sequences per batch: Hugging Face Trainer's default ``per_device_train_batch_size``."""
SEQ_LEN = 128
"""Tokens per sequence, at most (the model's context when shorter)."""
EVAL_BATCHES = 8
"""Held-out batches of text, at most: enough for the bench's eval noise (2 or more), quick to score."""
_BYTES_PER_TOKEN = 6  # generous for code (BPE: about 3.5 bytes a token; a word-level vocabulary: more): enough text for the batches
_MAX_BYTES = 4_000_000  # training text, about a million tokens; later steps cycle through the batches already made


def _context(model: nn.Module) -> int:
    config = model.config
    limit = next((getattr(config, k) for k in ("n_positions", "max_position_embeddings", "n_ctx") if isinstance(getattr(config, k, None), int)), SEQ_LEN)
    return max(2, min(SEQ_LEN, limit))


def _random_batches(vocab: int, seq: int, count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(0, vocab, (ROWS, seq), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return out


def _blocks(tokenizer: Any, text: str, seq: int) -> torch.Tensor:
    """``text`` tokenized (line by line: no tokenizer warns about an over-long input then) as ``(blocks, seq)`` ids."""
    lines = text.splitlines(keepends=True)
    ids = [i for row in tokenizer(lines, add_special_tokens=False)["input_ids"] for i in row]
    usable = len(ids) // seq * seq
    return torch.tensor(ids[:usable], dtype=torch.long).view(-1, seq)


def _as_batches(blocks: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    return [
        {"input_ids": b, "attention_mask": torch.ones_like(b), "labels": b}
        for b in (blocks[i:i + ROWS] for i in range(0, len(blocks) - ROWS + 1, ROWS))
    ]


def _text_batches(folder: HfFolder, vocab: int, seq: int, count: int) -> tuple[list[Any], list[Any], str]:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder.path, local_files_only=True)
    except Exception as exc:
        raise ValueError(f"--model {folder.spec}: the folder's tokenizer does not load ({type(exc).__name__}: {exc}); fix it, or pass --data.") from exc
    if len(tokenizer) > vocab:
        raise ValueError(
            f"--model {folder.spec}: the folder's tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size "
            f"{vocab}: they do not belong together. Save the model's own tokenizer there, or pass --data."
        )
    per_batch = ROWS * seq * _BYTES_PER_TOKEN
    train_bytes = min(count * per_batch, _MAX_BYTES)
    raw, files = stdlib_corpus(train_bytes + EVAL_BATCHES * per_batch)
    # Decoded after the cut: the eval text is the end of the corpus, which no training batch reads.
    cut = len(raw) * train_bytes // (train_bytes + EVAL_BATCHES * per_batch)
    train = _blocks(tokenizer, raw[:cut].decode("utf-8", errors="replace"), seq)
    held = _blocks(tokenizer, raw[cut:].decode("utf-8", errors="replace"), seq)
    train_batches, eval_batches = _as_batches(train)[:count], _as_batches(held)[:EVAL_BATCHES]
    if not train_batches:
        raise ValueError(f"--model {folder.spec}: the standard library's text gave fewer than {ROWS} blocks of {seq} tokens; pass --data.")
    held_out = (
        f"{len(eval_batches)} held-out batches (the corpus's end, which no training batch reads) for the eval loss"
        if eval_batches else "no held-out batches (the text was too short for one): no eval metric"
    )
    what = (
        f"{len(raw):,} bytes of {files} Python standard-library sources tokenized by the folder's tokenizer: "
        f"{len(train_batches)} batches of {ROWS} x {seq} tokens, and {held_out}"
    )
    return train_batches, eval_batches, what


def default_hf_data(model: nn.Module, folder: HfFolder | None, *, spec: str, count: int, seed: int = 0) -> tuple[BenchData, str]:
    """``count`` training batches for ``model`` (with eval batches where they mean something) and a line saying
    what they are; a model for which no honest data can be made is refused, naming ``--data``."""
    if not is_causal_lm(model):
        raise ValueError(
            f"--model {spec} is a {type(model).__name__}: without --data, ampkit makes data only for a causal language model "
            "(its labels are its inputs); this model needs real inputs and labels. Pass --data pkg.module:factory returning a "
            "datasets.Dataset (tokenized, with a label column) or batches."
        )
    vocab, seq = int(model.config.vocab_size), _context(model)
    if folder is not None and folder.tokenizer:
        train, held, what = _text_batches(folder, vocab, seq, count)
        return BenchData(train=train, eval=held, unit="tokens"), what
    what = (
        f"random token ids (uniform over the {vocab:,}-token vocabulary, seed {seed}): {count} batches of {ROWS} x {seq} "
        "tokens, no eval metric (nothing learnt from random tokens generalises, so none would mean anything); give the "
        "folder a tokenizer, or pass --data, to measure quality"
    )
    log.info("--model %s: no tokenizer in the folder and no --data: training on %s", spec, what)
    return BenchData(train=_random_batches(vocab, seq, count, seed), unit="tokens"), what
