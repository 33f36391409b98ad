"""Byte accounting of a training step: the activations saved for backward, counted against hand-computed controls."""

from __future__ import annotations

import torch
from torch import nn

from ampkit.memory._accounting import SavedActivations

B, D_IN, D_HID = 16, 32, 64


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.ReLU(), nn.Linear(D_HID, D_IN))


def test_accumulated_micro_batches_count_one_micro_batchs_activations() -> None:
    # Each backward frees its micro-batch's graph before the next forward saves anything: the activations held at
    # once are one micro-batch's, whatever the number of micro-batches (the control: one micro-batch alone).
    model = _mlp()
    batches = [torch.randn(B, D_IN) for _ in range(4)]
    with SavedActivations(model) as one:
        model(batches[0]).sum().backward()
    with SavedActivations(model) as four:
        for x in batches:
            model(x).sum().backward()
    assert one.bytes == 4 * (B * D_IN + B * D_HID)  # x, and the ReLU output Linear 2 saves too
    assert four.bytes == one.bytes


def test_graphs_alive_together_count_together() -> None:
    # Two forwards before one backward hold both graphs: that is twice the activations, and counted so.
    model = _mlp()
    x, y = torch.randn(B, D_IN), torch.randn(B, D_IN)
    with SavedActivations(model) as one:
        model(x).sum().backward()
    with SavedActivations(model) as two:
        (model(x).sum() + model(y).sum()).backward()
    assert two.bytes == 2 * one.bytes
