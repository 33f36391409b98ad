"""Every tool on the user's framework objects, end to end through the command line: an ``hf:`` folder, a
LightningModule with its own loaders, a ``datasets.Dataset`` and a DataLoader from ``--data``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ampkit.cli._main import main

pytestmark = pytest.mark.usefixtures("quiet_machine")  # the tune measures differently on a busy machine

pytest.importorskip("transformers", reason="Requires: transformers (pip install -e '.[hf]')")
pytest.importorskip("datasets", reason="Requires: datasets (pip install -e '.[hf]')")
pytest.importorskip("lightning.pytorch", reason="Requires: lightning (pip install -e '.[lightning]')")

USER = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import lightning.pytorch as pl

WORDS = ["[UNK]", "[PAD]", "def", "return", "self", "import", "class", "for", "in", "if", "else", "the", "a", "of"]


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]")


def _tensors(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(TensorDataset(*_tensors(64)), batch_size=16)

    def val_dataloader(self):
        return DataLoader(TensorDataset(*_tensors(32, seed=1)), batch_size=16)


def lit():
    return Lit()


def loader():
    return DataLoader(TensorDataset(*_tensors(128, seed=2)), batch_size=16)


def long_loader():  # enough batches an epoch for the loader trials to time steady steps
    return DataLoader(TensorDataset(*_tensors(512, seed=2)), batch_size=16)


def bert_rows():
    import datasets

    texts = ["def return self", "import class", "for in if else the a of", "self", "the a"] * 4
    rows = datasets.Dataset.from_dict({"text": texts, "label": [i % 3 for i in range(len(texts))]})
    return rows.map(lambda r: tokenizer()(r["text"]), batched=True)


def token_rows():
    import datasets

    g = torch.Generator().manual_seed(0)
    return datasets.Dataset.from_dict({"input_ids": torch.randint(0, 64, (64, 16), generator=g).tolist()})
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    root = tmp_path_factory.mktemp("cli_hf")
    gpt2 = GPT2Config(vocab_size=64, n_positions=16, n_layer=1, n_embd=16, n_head=2, bos_token_id=0, eos_token_id=0, use_cache=False)
    torch.manual_seed(0)
    GPT2LMHeadModel(gpt2).save_pretrained(root / "gpt2")
    gpt2.save_pretrained(root / "gpt2-config")
    bert = BertConfig(vocab_size=14, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, max_position_embeddings=16,
                      num_labels=3, pad_token_id=1)
    BertForSequenceClassification(bert).save_pretrained(root / "bert")
    namespace: dict[str, object] = {}
    exec(compile(textwrap.dedent(USER), "user", "exec"), namespace)  # noqa: S102 - the module above, for its tokenizer
    namespace["tokenizer"]().save_pretrained(root / "bert")  # type: ignore[operator]
    return {"gpt2": root / "gpt2", "gpt2-config": root / "gpt2-config", "bert": root / "bert"}


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "fw_user.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fw_user", raising=False)
    return "fw_user"


def test_bench_on_an_hf_folder_alone_says_its_random_tokens_measure_no_quality(folders: dict[str, Path], tmp_path: Path) -> None:
    argv = ["bench", "--model", f"hf:{folders['gpt2']}", "--precision", "bf16", "--steps", "3", "--warmup", "1", "--rounds", "1",
            "--device", "cpu", "--no-progress", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    result = json.loads((tmp_path / "o" / "results.json").read_text())
    info = result["workload_info"]
    assert info["framework"] == "transformers" and info["hf_path"] == str(folders["gpt2"]) and info["supports_gradient_checkpointing"] is True
    assert info["data"].startswith("random token ids") and result["eval_samples"] is None
    bf16 = next(r for r in result["runs"] if r["precision"] == "bf16-mixed")
    assert bf16["status"] == "ok" and bf16["quality"] is None and bf16["outcome"] != "pays"
    assert "quality not measured (no eval metric)" in bf16["verdict"]


def test_memory_on_a_lightning_module_alone_reads_its_own_loader(user: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "--model", f"{user}:lit", "--precision", "32-true,bf16-mixed", "--device", "cpu", "--json"]) == 0
    fp32, bf16 = json.loads(capsys.readouterr().out)
    assert fp32["batch_size"] == 16 and fp32["parameters"] == bf16["parameters"] == 4 * (6 * 32 + 32 + 32 * 3 + 3)
    assert fp32["optimizer_state"] > 2 * fp32["parameters"]  # AdamW, from its configure_optimizers()
    assert bf16["activations"] < fp32["activations"]


def test_doctor_on_an_hf_bert_classifier_with_a_dataset(folders: dict[str, Path], user: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["doctor", "--model", f"hf:{folders['bert']}", "--data", f"{user}:bert_rows", "--steps", "1", "--update-steps", "0",
            "--fp8-recipe", "none", "--precision", "bf16-mixed", "--device", "cpu"]
    assert main(argv) in (0, 1)  # 1: it recommends staying in fp32, a verdict, not a failure
    out = capsys.readouterr().out
    assert "BertForSequenceClassification" in out and "bert.encoder.layer.0" in out


def test_profile_feeds_a_lightning_modules_step_from_a_dataloader_factory_and_varies_the_loader(user: str, tmp_path: Path) -> None:
    argv = ["profile", "--model", f"{user}:lit", "--data", f"{user}:loader", "--precision", "32-true", "--warmup", "1", "--plain-steps", "1",
            "--steps", "2", "--sync-steps", "1", "--trace-steps", "0", "--device", "cpu", "--out", str(tmp_path / "p")]
    assert main(argv) == 0
    data = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert data["workload"]["name"] == "Lit" and data["steps"] == 2
    assert data["trials"] and data["trials"][0]["name"] == "as given" and all(t["step_s"] > 0 for t in data["trials"])


def test_tune_on_an_hf_config_with_a_token_dataset(folders: dict[str, Path], user: str, tmp_path: Path) -> None:
    argv = ["tune", "--model", f"hf:{folders['gpt2-config']}", "--data", f"{user}:token_rows", "--batch-size", "4", "--stages", "precision",
            "--precision", "bf16-mixed", "--rounds", "2", "--guard-steps", "6", "--no-progress", "--device", "cpu", "--out", str(tmp_path / "t")]
    assert main(argv) == 0
    data = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert data["command"].startswith("ampkit tune --model hf:") and data["winner"]["policy"] in ("32-true", "bf16-mixed")


def test_tune_times_a_lightning_modules_dataloader_settings(user: str, tmp_path: Path) -> None:
    """The loader stage feeds the LightningModule's training_step the loader's own batches: its trials are measured."""
    argv = ["tune", "--model", f"{user}:lit", "--data", f"{user}:long_loader", "--stages", "loader", "--rounds", "2", "--guard-steps", "4",
            "--no-progress", "--device", "cpu", "--out", str(tmp_path / "t")]
    assert main(argv) == 0
    data = json.loads((tmp_path / "t" / "tune.json").read_text())
    trials = data["loader_trials"]
    assert len(trials) > 1 and all(t.get("step_s", 0) > 0 for t in trials), trials
