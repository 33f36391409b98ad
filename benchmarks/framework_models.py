"""The models and data of benchmarks/framework_overhead.py: a small GPT (Hugging Face's GPT2LMHeadModel, built from a
config: nothing downloaded) and a small CNN, each taking its batch as keyword arguments and returning ``{"loss": ...}``,
the form every framework's loop and the Hugging Face Trainer take alike.

    >>> model = gpt(n_layer=1, n_embd=16, n_head=2, vocab=32, seq=8)()
    >>> batch = torch.utils.data.default_collate([gpt_data(2, vocab=32, seq=8)[i] for i in range(2)])
    >>> model(**batch)["loss"].shape
    torch.Size([])
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

SEED = 0

__all__ = ["SEED", "Samples", "SmallCNN", "cnn", "cnn_data", "gpt", "gpt_data"]


class Samples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Rows of named tensors (``input_ids``/``labels`` or ``pixel_values``/``labels``): every framework's loader
    collates them into the keyword arguments of the model's forward, which returns ``{"loss": ...}``."""

    def __init__(self, **columns: torch.Tensor) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.columns.items()}


def gpt(n_layer: int = 2, n_embd: int = 128, n_head: int = 4, vocab: int = 512, seq: int = 64, dropout: float = 0.0) -> Callable[[], nn.Module]:
    """A factory of Hugging Face's GPT2LMHeadModel built from a config (nothing downloaded), seeded: same weights each call."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=seq, bos_token_id=0, eos_token_id=0,
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)

    def build() -> nn.Module:
        torch.manual_seed(SEED)
        return GPT2LMHeadModel(config)

    return build


def gpt_data(rows: int, vocab: int = 512, seq: int = 64) -> Samples:
    """Counting sequences from random starts (t, t+1, ... mod vocab): a pattern the model learns, so the loss moves."""
    g = torch.Generator().manual_seed(1)
    ids = (torch.randint(0, vocab, (rows, 1), generator=g) + torch.arange(seq)) % vocab
    return Samples(input_ids=ids, labels=ids.clone())


class SmallCNN(nn.Module):
    """Conv-BatchNorm-ReLU x3 (stride 1, 2, 2; widths w, 2w, 4w), global pooling, a 10-way head; channels_last, the
    layout oneDNN's convolutions take without reordering. On the CPU of BENCHMARKS.md's table (bf16 autocast, fused
    AdamW, one thread, width 32, batch 32) three one-off checks, each contiguous then channels_last, gave 39 -> 31,
    28 -> 26 and 30 -> 18 ms a step: never slower; by how much is lost in that host's drift."""

    def __init__(self, width: int) -> None:
        super().__init__()
        w = width
        self.net = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(),
            nn.Conv2d(2 * w, 4 * w, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(4 * w), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, 10),
        )

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(pixel_values.contiguous(memory_format=torch.channels_last))
        return {"loss": nn.functional.cross_entropy(logits.float(), labels), "logits": logits}


def cnn(width: int = 32) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(SEED)
        return SmallCNN(width).to(memory_format=torch.channels_last)

    return build


def cnn_data(rows: int, size: int = 32) -> Samples:
    g = torch.Generator().manual_seed(1)
    return Samples(pixel_values=torch.randn(rows, 3, size, size, generator=g), labels=torch.randint(0, 10, (rows,), generator=g))
