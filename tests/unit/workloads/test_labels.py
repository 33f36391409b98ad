"""Labels past the model's classes are named at setup (the label, the batch, the class count), never met as a raw
``IndexError`` inside the loss of every policy row."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit._util.model_io import default_loss
from ampkit.workloads._labels import check_labels, class_count
from ampkit.workloads._user import BenchData, workload_from


def _batches(n: int, classes: int = 3, bad: tuple[int, int] | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of 4 rows of labels below ``classes``; ``bad``: (batch, label) planted in that batch's last row."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        y = torch.randint(0, classes, (4,), generator=g)
        if bad is not None and bad[0] == i:
            y[-1] = bad[1]
        out.append((torch.randn(4, 8, generator=g), y))
    return out


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(8, 3)


@pytest.mark.parametrize("label", [7, 3, -1])
def test_a_label_past_the_classes_in_a_later_batch_is_named_with_the_class_count(label: int) -> None:
    # Before: a label in batch 2 failed every policy row with "IndexError: Target 7 is out of bounds".
    with pytest.raises(ValueError, match=rf"--data d:f: training batch 2 has label {label}, but the model outputs 3 classes \(an output of shape \(4, 3\)\); labels must be 0 to 2"):
        workload_from(_net(), _batches(4, bad=(2, label)), steps=4, warmup=1, model_spec="m:f", data_spec="d:f", cli=True)


def test_a_label_past_the_classes_in_the_first_batch_is_named_not_sent_to_loss_fn() -> None:
    # Before: the first batch's IndexError read as "no loss from its output ... pass a loss function", the wrong fix.
    with pytest.raises(ValueError, match=r"training batch 0 has label 9, but the model outputs 3 classes") as info:
        workload_from(_net(), _batches(2, bad=(0, 9)), steps=2, warmup=1, model_spec="m:f", data_spec="d:f", cli=True)
    assert "loss_fn" not in str(info.value)


def test_an_eval_label_past_the_classes_is_named_too() -> None:
    data = BenchData(train=_batches(2), eval=_batches(3, bad=(1, 5)))
    with pytest.raises(ValueError, match=r"d:f: eval batch 1 has label 5, but the model outputs 3 classes"):
        workload_from(_net(), data, steps=2, warmup=1, data_spec="d:f")


def test_labels_in_range_and_ignored_positions_build_the_workload_whose_loss_is_cross_entropy() -> None:
    batches = _batches(3, bad=(1, -100))  # -100: cross-entropy's ignore_index, a collator's padding
    w = workload_from(_net(), batches, steps=3, warmup=1)
    x, y = batches[1]
    model = w.model
    assert torch.equal(w.loss_fn(model(x), y), nn.functional.cross_entropy(model(x), y))


def test_sequence_logits_count_their_classes_last_and_name_a_token_past_the_vocabulary() -> None:
    class Lm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.head = nn.Embedding(10, 4), nn.Linear(4, 10)

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = self.head(self.emb(input_ids))
            return {"logits": logits, "loss": nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())}

    ids = torch.randint(0, 10, (2, 5), generator=torch.Generator().manual_seed(0))
    good = {"input_ids": ids, "labels": ids}
    assert workload_from(Lm(), [good], steps=1, warmup=0).train_batches[0]["labels"] is ids
    bad = {"input_ids": ids, "labels": ids.clone().index_fill_(1, torch.tensor([3]), 12)}
    with pytest.raises(ValueError, match=r"training batch 1 has label 12, but the model outputs 10 classes \(an output of shape \(2, 5, 10\)\)"):
        workload_from(Lm(), [good, bad], steps=2, warmup=0)


def test_a_loss_fn_of_your_own_reads_labels_its_own_way_and_is_not_checked() -> None:
    batches = _batches(2, bad=(1, 7))
    loss_fn = lambda out, y: nn.functional.cross_entropy(out, y % 3)
    w = workload_from(_net(), BenchData(train=batches, loss_fn=loss_fn), steps=2, warmup=1)
    assert w.loss_fn is loss_fn


@pytest.mark.parametrize(
    ("output", "target", "classes"),
    [(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), 3), (torch.zeros(2, 5, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long), 5),
     (torch.zeros(2, 6, 9), torch.zeros(2, 6, dtype=torch.long), 9), (torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), None),
     (torch.zeros(4, 3), torch.zeros(4), None), ({"hidden": torch.zeros(4, 3)}, torch.zeros(4, dtype=torch.long), None),
     (torch.zeros(4, 3), torch.zeros(5, dtype=torch.long), None)],
)
def test_class_count_follows_the_default_loss_layouts(output: object, target: torch.Tensor, classes: int | None) -> None:
    assert class_count(output, target) == classes
    if classes is not None:  # the layout read is the one default_loss trains: a label just past it fails there too
        past = target.clone().view(-1).index_fill_(0, torch.tensor([0]), classes).view_as(target)
        with pytest.raises((IndexError, RuntimeError)):
            default_loss(output, past)
        with pytest.raises(ValueError, match=f"has label {classes}, but the model outputs {classes} classes"):
            check_labels(output, target, {"training": [(None, target), (None, past)]}, "d")
