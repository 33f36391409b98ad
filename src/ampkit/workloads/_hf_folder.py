"""``--model hf:PATH``: a Hugging Face model read from a local folder, in fp32, with nothing downloaded.

- A folder with ``config.json`` and weights (``model.safetensors``, ``pytorch_model.bin``, or their sharded index):
  ``from_pretrained(PATH, local_files_only=True)``.
- A folder with only ``config.json``, or ``hf:PATH/config.json`` itself: ``from_config``, randomly initialised from
  the tools' ``--seed``.
- The class is the config's ``architectures[0]`` (what ``save_pretrained`` records); without one, the Auto class for
  a causal language model.
- The weights are loaded in fp32 whatever dtype they were saved in: every tool starts from an fp32 model and applies
  each policy itself. A checkpoint saved in another dtype is said so in a log line.

Only local folders are read. A path that is not there is an error naming it, and saying how to get a Hub model
as a folder where there is network.

    >>> folder = hf_folder("hf:no/such/folder")
    Traceback (most recent call last):
    ...
    ValueError: --model hf:no/such/folder: there is no folder no/such/folder. ampkit reads only local folders and downloads nothing: for a Hugging Face Hub model, save it where there is network (AutoModelForCausalLM.from_pretrained('no/such/folder').save_pretrained('DIR'), or huggingface-cli download no/such/folder --local-dir DIR), then pass --model hf:DIR.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._errors import one_line
from .._util.framework_versions import require

__all__ = ["HF_PREFIX", "HfFolder", "folder_tokenizer", "hf_folder", "is_causal_lm", "is_hf_spec", "load_hf_model"]

log = logging.getLogger("ampkit")

HF_PREFIX = "hf:"
"""What starts a ``--model`` that names a Hugging Face folder rather than a factory."""

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
"""The weight files ``save_pretrained`` writes (one file, or the index of its shards)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""Any of these makes the folder's tokenizer loadable by ``AutoTokenizer``."""


@dataclass(frozen=True)
class HfFolder:
    """A checked ``hf:`` folder, before anything is loaded from it."""

    spec: str
    """``--model`` as typed (``hf:...``)."""
    path: Path
    """The folder."""
    weights: str | None
    """The weight file found (``from_pretrained``), or None (``from_config``: a random initialisation)."""
    tokenizer: bool
    """Whether the folder holds a tokenizer."""


def is_hf_spec(spec: str | None) -> bool:
    """Whether ``--model`` names a Hugging Face folder (``hf:PATH``)."""
    return spec is not None and spec.startswith(HF_PREFIX)


def _missing(spec: str, raw: str) -> ValueError:
    return ValueError(
        f"--model {spec}: there is no folder {raw}. ampkit reads only local folders and downloads nothing: for a Hugging "
        f"Face Hub model, save it where there is network (AutoModelForCausalLM.from_pretrained('{raw}').save_pretrained('DIR'), "
        f"or huggingface-cli download {raw} --local-dir DIR), then pass --model hf:DIR."
    )


def hf_folder(spec: str) -> HfFolder:
    """Check ``hf:PATH`` names a folder with a ``config.json`` (or that file itself); nothing is imported or loaded."""
    raw = spec[len(HF_PREFIX):]
    if not raw:
        raise ValueError(f"--model {spec}: name the folder after hf:, e.g. --model hf:path/to/model (where save_pretrained wrote it).")
    path = Path(raw).expanduser()
    if path.is_file() and path.name == "config.json":
        return HfFolder(spec=spec, path=path.parent, weights=None, tokenizer=_has_tokenizer(path.parent))
    if path.is_file():
        raise ValueError(f"--model {spec}: {raw} is a file; give the folder save_pretrained wrote (or its config.json).")
    if not path.is_dir():
        raise _missing(spec, raw)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"--model {spec}: the folder {raw} has no config.json; give the folder model.save_pretrained(...) wrote "
            "(config.json, with or without weights)."
        )
    weights = next((name for name in WEIGHT_FILES if (path / name).is_file()), None)
    return HfFolder(spec=spec, path=path, weights=weights, tokenizer=_has_tokenizer(path))


def _has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def _model_class(config: Any, spec: str) -> Any:
    """The class ``config.architectures[0]`` names, else transformers' Auto class for a causal language model."""
    import transformers

    names = getattr(config, "architectures", None) or []
    if names:
        try:
            return getattr(transformers, names[0])
        except AttributeError:
            raise ValueError(
                f"--model {spec}: config.json names the architecture {names[0]}, which transformers "
                f"{transformers.__version__} does not have; upgrade transformers, or correct 'architectures' in config.json."
            ) from None
    log.info("--model %s: config.json names no architecture; loading it as a causal language model (AutoModelForCausalLM)", spec)
    return transformers.AutoModelForCausalLM


def load_hf_model(folder: HfFolder, seed: int = 0) -> nn.Module:
    """The model of ``folder`` in fp32, in training mode: its saved weights, or a random initialisation seeded by ``seed``."""
    require("transformers", f"--model {folder.spec}")
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(folder.path, local_files_only=True)
    except Exception as exc:
        raise ValueError(f"--model {folder.spec}: its config.json does not load ({type(exc).__name__}: {one_line(exc)}).") from exc
    cls = _model_class(config, folder.spec)
    saved = getattr(config, "dtype", None)
    try:
        if folder.weights is not None:
            model = cls.from_pretrained(folder.path, local_files_only=True, dtype=torch.float32)
        else:
            torch.manual_seed(seed)  # the tools' --seed: the same random weights on every run that asks for them
            # An Auto class builds through from_config; a model class is built by its constructor (in fp32 below).
            model = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    except Exception as exc:
        how = f"from_pretrained with {folder.weights}" if folder.weights else "from_config"
        raise ValueError(f"--model {folder.spec}: {cls.__name__}.{how} failed ({type(exc).__name__}: {one_line(exc)}).") from exc
    model.float()  # a no-op when loaded as asked; a class that ignores dtype= still ends in fp32
    if folder.weights is not None and saved not in (None, torch.float32, "float32"):
        log.info("--model %s: saved in %s, loaded in fp32: every policy starts from fp32 weights", folder.spec, str(saved).removeprefix("torch."))
    if getattr(model, "loss_type", "") is None and is_causal_lm(model):
        # GPT-2 and a few others cannot infer it from their class name: transformers logs a warning and falls back to
        # this very loss. Set, it is the same loss without the warning.
        model.loss_type = "ForCausalLM"
    return model.train()


def is_causal_lm(model: nn.Module) -> bool:
    """Whether ``model`` is a Hugging Face causal language model (labels are its own inputs, shifted inside)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = type(model).__name__
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        if name == value or (isinstance(value, (tuple, list)) and name in value):
            return True
    return name.endswith(("ForCausalLM", "LMHeadModel"))


def folder_tokenizer(model: nn.Module, folder: HfFolder | None) -> Any | None:
    """The tokenizer saved beside ``model``: in the ``hf:`` folder, else in the local folder ``from_pretrained`` read
    it from (``model.name_or_path``); None when there is none. Nothing is downloaded."""
    path = folder.path if folder is not None and folder.tokenizer else None
    name = str(getattr(model, "name_or_path", "") or "")
    if path is None and name and Path(name).is_dir() and _has_tokenizer(Path(name)):
        path = Path(name)
    if path is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)
