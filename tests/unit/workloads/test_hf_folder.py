"""``--model hf:PATH``: a local folder read in fp32 (its weights, or a seeded random initialisation), nothing downloaded,
and every path that is not a model folder refused naming it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from ampkit.workloads._hf_folder import folder_tokenizer, hf_folder, is_causal_lm, is_hf_spec, load_hf_model

from .conftest import gpt2_model


def test_a_folder_with_weights_loads_them_in_fp32(hf_folders: dict[str, Path]) -> None:
    folder = hf_folder(f"hf:{hf_folders['weights']}")
    assert folder.weights == "model.safetensors" and not folder.tokenizer
    model = load_hf_model(folder)
    control = gpt2_model().state_dict()  # the weights save_pretrained wrote
    assert type(model).__name__ == "GPT2LMHeadModel" and model.training
    assert model.state_dict().keys() == control.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in control.items())
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_weights_saved_in_bf16_are_loaded_in_fp32_and_a_log_line_says_so(hf_folders: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ampkit"):
        model = load_hf_model(hf_folder(f"hf:{hf_folders['bf16']}"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    control = gpt2_model().to(torch.bfloat16).float().state_dict()  # bf16 values, held in fp32
    assert all(torch.equal(model.state_dict()[k], v) for k, v in control.items())
    assert any("saved in bfloat16, loaded in fp32" in r.getMessage() for r in caplog.records)


def test_weights_saved_in_fp32_load_without_that_line(hf_folders: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ampkit"):
        load_hf_model(hf_folder(f"hf:{hf_folders['weights']}"))
    assert not any("loaded in fp32" in r.getMessage() for r in caplog.records)


def test_a_config_alone_is_a_random_initialisation_seeded_by_the_tools_seed(hf_folders: dict[str, Path]) -> None:
    folder = hf_folder(f"hf:{hf_folders['config']}")
    assert folder.weights is None
    first, again, other = load_hf_model(folder, seed=0), load_hf_model(folder, seed=0), load_hf_model(folder, seed=1)
    weight = "transformer.h.0.attn.c_attn.weight"
    assert torch.equal(first.state_dict()[weight], again.state_dict()[weight])
    assert not torch.equal(first.state_dict()[weight], other.state_dict()[weight])
    assert {p.dtype for p in first.parameters()} == {torch.float32}


def test_naming_config_json_initialises_from_it_even_beside_weights(hf_folders: dict[str, Path]) -> None:
    folder = hf_folder(f"hf:{hf_folders['weights'] / 'config.json'}")
    assert folder.weights is None and folder.path == hf_folders["weights"]
    random = load_hf_model(folder, seed=5)
    saved = gpt2_model().state_dict()
    assert not torch.equal(random.state_dict()["transformer.wte.weight"], saved["transformer.wte.weight"])


def test_the_tokenizer_beside_the_model_is_found(hf_folders: dict[str, Path]) -> None:
    folder = hf_folder(f"hf:{hf_folders['tokenizer']}")
    assert folder.tokenizer
    assert folder_tokenizer(load_hf_model(folder), folder)("def return")["input_ids"] == [5, 6]
    # A model from_pretrained read from a folder finds it there too (its name_or_path), without an hf: spec.
    from transformers import GPT2LMHeadModel

    assert folder_tokenizer(GPT2LMHeadModel.from_pretrained(hf_folders["tokenizer"]), None) is not None
    assert folder_tokenizer(load_hf_model(hf_folder(f"hf:{hf_folders['weights']}")), None) is None


def test_causal_lms_are_told_from_other_heads(hf_folders: dict[str, Path]) -> None:
    assert is_causal_lm(load_hf_model(hf_folder(f"hf:{hf_folders['weights']}")))
    assert not is_causal_lm(load_hf_model(hf_folder(f"hf:{hf_folders['bert']}")))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("hf:", "name the folder after hf:, e.g. --model hf:path/to/model"),
        ("hf:gpt2", "there is no folder gpt2. ampkit reads only local folders and downloads nothing"),
        ("hf:openai-community/gpt2", "huggingface-cli download openai-community/gpt2 --local-dir DIR), then pass --model hf:DIR."),
    ],
)
def test_a_folder_that_is_not_there_is_refused_naming_it_and_nothing_is_downloaded(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match="^--model hf:") as info:
        hf_folder(spec)
    assert message in str(info.value)


def test_a_file_or_a_folder_without_config_json_is_refused(hf_folders: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model.safetensors is a file; give the folder save_pretrained wrote"):
        hf_folder(f"hf:{hf_folders['weights'] / 'model.safetensors'}")
    with pytest.raises(ValueError, match="has no config.json; give the folder model.save_pretrained"):
        hf_folder(f"hf:{tmp_path}")


def test_an_architecture_transformers_lacks_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT9000ForEverything"]}')
    with pytest.raises(ValueError, match="names the architecture GPT9000ForEverything, which transformers"):
        load_hf_model(hf_folder(f"hf:{tmp_path}"))


def test_only_hf_specs_are_folders() -> None:
    assert is_hf_spec("hf:models/x") and not is_hf_spec("pkg.models:build") and not is_hf_spec(None)
