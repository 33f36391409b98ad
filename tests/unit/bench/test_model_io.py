"""One rule for calling a model on a user's batch and turning its output into a loss (bench, memory, doctor)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from ampkit._util.model_io import OutputError
from ampkit.bench._model_io import batch_loss, default_loss, prediction, run_batch
from ampkit.workloads._user import BenchData, workload_from


class KwargsNet(nn.Module):
    """Takes keyword arguments like a Hugging Face model; returns a dict with a loss only when given labels."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.head(self.emb(input_ids) * attention_mask[..., None])  # (B, T, 10)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out


@dataclass
class Output:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


def _batch(rows: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (rows, 6), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def test_a_dict_batch_is_passed_as_keyword_arguments_and_its_loss_is_the_models_own() -> None:
    torch.manual_seed(0)
    net, batch = KwargsNet(), _batch()
    control = net(**batch)["loss"]  # the model's own loss, called by hand
    assert torch.equal(batch_loss(net, batch, default_loss), control)


def test_an_inputs_dict_with_separate_targets_goes_to_the_loss_fn_as_logits() -> None:
    torch.manual_seed(0)
    net, batch = KwargsNet(), _batch()
    labels = batch.pop("labels")
    lm_loss = lambda out, y: nn.functional.cross_entropy(out["logits"].flatten(0, 1), y.flatten())
    got = batch_loss(net, (batch, labels), lm_loss)
    assert torch.equal(got, nn.functional.cross_entropy(net(**batch)["logits"].flatten(0, 1), labels.flatten()))
    output, target = run_batch(net, (batch, labels))
    assert set(output) == {"logits"} and target is labels


def test_default_loss_takes_loss_then_logits_then_a_tuples_first_tensor() -> None:
    logits, y = torch.randn(3, 5), torch.tensor([0, 4, 2])
    reference = nn.functional.cross_entropy(logits, y)
    assert torch.equal(default_loss(Output(logits, loss=torch.tensor(0.5)), y), torch.tensor(0.5))
    assert torch.equal(default_loss(Output(logits), y), reference)  # loss None: the logits
    assert torch.equal(default_loss((logits, "aux"), y), reference)
    assert torch.equal(default_loss({"hidden": torch.randn(3, 8), "logits": logits.bfloat16()}, y), nn.functional.cross_entropy(logits.bfloat16().float(), y))
    assert prediction(Output(logits)) is logits


@dataclass
class Hidden:
    hidden: torch.Tensor
    scores: torch.Tensor


@pytest.mark.parametrize(
    ("output", "keys", "read"),
    [({"hidden": torch.randn(3, 8), "scores": torch.randn(3, 5)}, "'hidden', 'scores'", r"out\['scores'\]"),
     (Hidden(torch.randn(3, 8), torch.randn(3, 5)), "'hidden', 'scores'", r"out\.scores"), ({}, "none", r"out\['scores'\]")],
)
def test_a_dict_or_dataclass_without_loss_or_logits_is_refused_naming_its_keys_not_read_by_its_first_tensor(output: object, keys: str, read: str) -> None:
    # Before: the first tensor ("hidden", 8 wide) was the prediction, and 5-class labels trained on it silently.
    with pytest.raises(OutputError, match=rf"returned a \w+ with keys {keys} and neither 'loss' nor 'logits'.*BenchData\(loss_fn=\.\.\.\).*{read}"):
        default_loss(output, torch.tensor([0, 4, 2]))


def test_a_dict_output_refused_by_the_default_loss_trains_with_a_loss_fn_reading_its_prediction() -> None:
    output, y = {"hidden": torch.randn(3, 8), "scores": torch.randn(3, 5)}, torch.tensor([0, 4, 2])
    loss_fn = lambda out, t: nn.functional.cross_entropy(out["scores"], t)
    assert torch.equal(batch_loss(lambda x: output, (torch.zeros(3), y), loss_fn), nn.functional.cross_entropy(output["scores"], y))


@pytest.mark.parametrize("output", ["text", ("a", None)])
def test_an_output_without_loss_or_tensor_names_its_type_and_the_fix(output: object) -> None:
    with pytest.raises(TypeError, match=rf"returned {type(output).__name__}, with no \.loss, \.logits or tensor.*BenchData\(loss_fn=\.\.\.\)"):
        default_loss(output, torch.tensor([0]))


def test_a_dict_batch_without_labels_and_an_output_without_loss_says_what_to_add() -> None:
    with pytest.raises(TypeError, match="no targets .*no .loss; put the labels in the batch, or pass a loss function"):
        default_loss({"logits": torch.zeros(2, 3)}, None)


def test_dict_batches_make_a_workload_counting_tokens_named_by_the_model_class() -> None:
    net, batches = KwargsNet(), [_batch(), _batch()]
    w = workload_from(net, batches, steps=3, warmup=1)
    assert w.name == "KwargsNet" and w.unit == "tokens" and w.items_per_batch == 4 * 6
    assert workload_from(net, BenchData(train=batches, unit="samples"), steps=3, warmup=1).items_per_batch == 4


def test_a_loss_it_cannot_compute_points_at_bench_data_loss_fn() -> None:
    batch = _batch()
    labels = batch.pop("labels")[:, 0]  # one label per sequence against (B, T, V) logits: no layout fits
    with pytest.raises(ValueError, match=r"--model m:f: no loss from its output on the first batch, a dict .*BenchData\(loss_fn=\.\.\.\)"):
        workload_from(KwargsNet(), [(batch, labels)], steps=3, warmup=1, model_spec="m:f", data_spec="d:f", cli=True)


def test_sequence_logits_with_classes_last_get_the_flattened_cross_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(2, 5, 7, generator=g), torch.randint(0, 7, (2, 5), generator=g)
    control = nn.functional.cross_entropy(logits.reshape(10, 7), labels.reshape(10))
    assert torch.equal(default_loss({"logits": logits}, labels), control)
    # Classes second (segmentation's (batch, classes, h, w)) is torch's own layout and stays as it is.
    maps, masks = torch.randn(2, 3, 4, 4, generator=g), torch.randint(0, 3, (2, 4, 4), generator=g)
    assert torch.equal(default_loss(maps, masks), nn.functional.cross_entropy(maps, masks))
