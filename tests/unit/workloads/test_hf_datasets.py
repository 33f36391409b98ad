"""A ``datasets.Dataset`` collated into batches by transformers' own collators: checked against the collator called
directly on the same rows, for tokenized rows of one length and of many, feature columns and a DatasetDict's splits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit.workloads._hf_datasets import DEFAULT_BATCH_SIZE, dataset_bench_data
from ampkit.workloads._hf_folder import folder_tokenizer, hf_folder, load_hf_model

pytest.importorskip("datasets", reason="Requires: datasets (pip install -e '.[hf]')")

TEXTS = ["def return self", "the cat", "import class for in if else the a of to", "not None", "True False from with as raise",
         "while", "try except lambda", "yield pass break continue", "len print str", "int list dict the a"] * 2


def _tokenized(folder: Path) -> object:
    import datasets

    from .conftest import word_tokenizer

    tok = word_tokenizer()
    rows = {"text": TEXTS, "label": [i % 3 for i in range(len(TEXTS))]}
    return datasets.Dataset.from_dict(rows).map(lambda r: tok(r["text"]), batched=True)


def test_rows_of_different_lengths_are_padded_by_the_folders_tokenizer_as_its_collator_does(hf_folders: dict[str, Path]) -> None:
    from transformers import DataCollatorWithPadding

    folder = hf_folder(f"hf:{hf_folders['bert']}")
    model = load_hf_model(folder)
    dataset = _tokenized(hf_folders["bert"])
    data, what = dataset_bench_data(dataset, model, batch_size=None, count=5, where="--data d:f", tokenizer=lambda: folder_tokenizer(model, folder))
    train = list(data.train)
    assert len(train) == len(TEXTS) // DEFAULT_BATCH_SIZE and list(data.eval) == []  # whole batches of 8, no eval split
    # The control: the collator called on the same 8 rows, the text column left out and label named labels.
    rows = [{**{k: v for k, v in r.items() if k not in ("text", "label")}, "labels": r["label"]} for r in dataset.select(range(8))]
    expected = DataCollatorWithPadding(folder_tokenizer(model, folder))(rows)
    assert train[0].keys() == expected.keys() and all(torch.equal(train[0][k], expected[k]) for k in expected)
    assert int((train[0]["attention_mask"] == 0).sum()) > 0  # padded
    assert "20 rows" in what and "DataCollatorWithPadding" in what and "the default" in what and "no eval split" in what
    with torch.no_grad():
        assert model(**train[0]).loss.ndim == 0  # the classifier takes the batch as it is


def test_ragged_rows_without_a_tokenizer_are_refused_naming_the_fixes(hf_folders: dict[str, Path]) -> None:
    model = load_hf_model(hf_folder(f"hf:{hf_folders['bert']}"))
    with pytest.raises(ValueError, match=r"^--data d:f: the rows' input_ids differ in length and there is no tokenizer to pad them with; pad them in the dataset"):
        dataset_bench_data(_tokenized(hf_folders["bert"]), model, batch_size=None, count=2, where="--data d:f")


def test_rows_of_one_length_need_no_tokenizer_and_a_causal_lm_gets_its_inputs_as_labels() -> None:
    import datasets

    from .conftest import gpt2_model

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (12, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[:, 12:] = 0  # padded at the end
    dataset = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist()})
    data, what = dataset_bench_data(dataset, gpt2_model(), batch_size=4, count=10, where="--data d:f")
    train = list(data.train)
    assert len(train) == 3 and "default_data_collator" in what and "--batch-size" in what
    assert torch.equal(train[1]["input_ids"], ids[4:8])
    assert torch.equal(train[1]["labels"], ids[4:8].masked_fill(mask[4:8] == 0, -100))  # padding ignored by the loss


def test_a_feature_column_and_a_label_column_are_pairs_for_a_plain_module() -> None:
    import datasets

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 5, generator=g), torch.randint(0, 2, (16,), generator=g)
    dataset = datasets.Dataset.from_dict({"features": x.tolist(), "label": y.tolist(), "note": ["row"] * 16})
    data, _ = dataset_bench_data(dataset, nn.Linear(5, 2), batch_size=8, count=4, where="--data d:f")
    (x0, y0), (x1, y1) = data.train
    assert torch.allclose(x0, x[:8]) and torch.allclose(x1, x[8:]) and torch.equal(y0, y[:8]) and torch.equal(y1, y[8:])  # the "note" column (text) left out


def test_two_feature_columns_for_a_module_that_does_not_name_them_are_refused() -> None:
    import datasets

    dataset = datasets.Dataset.from_dict({"a": [[1.0]] * 8, "b": [[2.0]] * 8, "label": [0] * 8})
    with pytest.raises(ValueError, match=r"2 feature columns \(a, b\) and Linear.forward does not take them by name"):
        dataset_bench_data(dataset, nn.Linear(1, 2), batch_size=8, count=1, where="--data d:f")


def test_a_dataset_dicts_validation_split_is_the_eval(hf_folders: dict[str, Path]) -> None:
    import datasets

    folder = hf_folder(f"hf:{hf_folders['bert']}")
    model = load_hf_model(folder)
    tokenized = _tokenized(hf_folders["bert"])
    splits = datasets.DatasetDict({"train": tokenized, "validation": tokenized.select(range(16))})
    data, what = dataset_bench_data(splits, model, batch_size=4, count=2, where="--data d:f", tokenizer=lambda: folder_tokenizer(model, folder))
    assert len(list(data.train)) == 2 and len(list(data.eval)) == 4 and "eval: 4 batches of the 'validation' split" in what
    with pytest.raises(ValueError, match="returned a DatasetDict without a 'train' split \\(it has validation\\)"):
        dataset_bench_data(datasets.DatasetDict({"validation": tokenized}), model, batch_size=4, count=2, where="--data d:f")


def test_fewer_rows_than_one_batch_and_no_numeric_column_are_refused() -> None:
    import datasets

    with pytest.raises(ValueError, match="has 3 rows, fewer than one batch of 8; give more rows or a smaller --batch-size"):
        dataset_bench_data(datasets.Dataset.from_dict({"x": [1, 2, 3]}), nn.Linear(1, 1), batch_size=None, count=1, where="--data d:f")
    with pytest.raises(ValueError, match=r"no numeric column \(text\); tokenize it first"):
        dataset_bench_data(datasets.Dataset.from_dict({"text": ["a"] * 8}), nn.Linear(1, 1), batch_size=None, count=1, where="--data d:f")
